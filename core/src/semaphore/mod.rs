//! Counting semaphores across replicas: at most N holders of one key at a
//! time, each holding a permit under a lease (Redisson's
//! `RPermitExpirableSemaphore`, with fences).
//!
//! A [`Semaphore`] grants permits of a key while fewer than `permits`
//! live ones are held; each permit is a [`Token`] (a random id and a
//! fence) with a lease that ends on its own, so a holder that dies gives
//! its permit back after its lease, and one that lives renews it. The
//! contract, which every semaphore passes in guard-testkit's `semaphore`
//! suite:
//!
//! - at most `permits` permits of a key are live at any moment, however
//!   many callers race (all passing the same `permits`; a caller passing
//!   fewer is refused while the live ones are as many or more);
//! - `try_acquire` never waits: `Ok(None)` means the permits are taken;
//! - a permit is live until its lease ends or its holder releases it;
//!   an ended permit counts no more, and frees its place for the next
//!   caller;
//! - `release` and `renew` act only on their own token's live permit
//!   ([`UnlockError::NotHeld`] and [`Renewal::Lost`] otherwise), never
//!   another holder's;
//! - each permit's fence is greater than every earlier fence of the key,
//!   so a resource fed by one holder at a time per lane (a partition, a
//!   worker slot) can refuse a holder that lost its permit; the fences of
//!   permits held together are distinct, never equal.
//!
//! [`PermitLock`] makes one permit of a semaphore with `Send` futures
//! ([`SendSemaphore`], as every server semaphore is) a
//! [`Locker`](crate::lock::Locker): whatever
//! runs a job under a lock (guard-std's `LockWatchdog`, renewing it every
//! ttl / 3 and releasing it when the job ends or is dropped) runs it under
//! a permit the same way. Its futures are `Send`, as its semaphore's.
//!
//! Semaphores: guard-std's `LocalLocker` in one process; guard-redis's
//! `RedisLocker`, guard-postgres's `PgLocker` and guard-etcd's
//! `EtcdLocker` across replicas, beside their locks. See [`redis`] for the
//! layout on Redis.

pub mod redis;

use core::fmt;

use crate::lock::{Renewal, SendLeaseRenewer, SendLocker, Token, Ttl, UnlockError};

/// The most permits one semaphore has: each acquisition counts the live
/// holders (on Redis, in one script that blocks the server meanwhile), so
/// their number stays small. More concurrent holders than this is a rate
/// to limit, not a semaphore.
pub const MAX_PERMITS: u32 = 1_024;

/// How many holders a semaphore admits at once: 1 to [`MAX_PERMITS`].
///
/// ```
/// use guard_core::semaphore::Permits;
///
/// assert_eq!(Permits::new(3)?.get(), 3);
/// assert!(Permits::new(0).is_err());
/// # Ok::<(), guard_core::semaphore::InvalidPermits>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Permits(u32);

impl Permits {
    /// One holder at a time: a lock.
    pub const ONE: Permits = Permits(1);

    /// `n` permits, if `n` is 1 to [`MAX_PERMITS`].
    pub const fn new(n: u32) -> Result<Permits, InvalidPermits> {
        if n == 0 || n > MAX_PERMITS {
            Err(InvalidPermits(n))
        } else {
            Ok(Permits(n))
        }
    }

    /// The number.
    pub const fn get(self) -> u32 {
        self.0
    }
}

/// A number of permits that is zero or above [`MAX_PERMITS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct InvalidPermits(pub u32);

impl fmt::Display for InvalidPermits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a semaphore has 1 to {MAX_PERMITS} permits, not {}",
            self.0
        )
    }
}

impl core::error::Error for InvalidPermits {}

/// Permits of a key shared by replicas; see the module documentation for
/// the contract. [`SendSemaphore`] is its variant with `Send` futures, as
/// [`SendLocker`] is `Locker`'s.
#[trait_variant::make(SendSemaphore: Send)]
#[allow(async_fn_in_trait, reason = "Send-ness follows the concrete semaphore")]
pub trait Semaphore {
    /// A backend failure (connection, timeout, bad reply).
    type Error: fmt::Debug + fmt::Display;

    /// A permit of `key` under a lease of `lease`, if fewer than
    /// `permits` are live; `Ok(None)` when they are taken.
    async fn try_acquire(
        &self,
        key: &str,
        permits: Permits,
        lease: Ttl,
    ) -> Result<Option<Token>, Self::Error>;

    /// Resets the lease of `token`'s permit to `lease` from now, if it is
    /// still live.
    async fn renew(&self, key: &str, token: &Token, lease: Ttl) -> Result<Renewal, Self::Error>;

    /// Gives `token`'s live permit back at once.
    async fn release(&self, key: &str, token: &Token) -> Result<(), UnlockError<Self::Error>>;

    /// How many permits of `key` are live now (for metrics and tests:
    /// another caller may change it before the answer arrives).
    async fn holders(&self, key: &str) -> Result<u32, Self::Error>;
}

/// One permit of a semaphore as a lock: `try_lock(key, ttl)` takes a
/// permit of `key` (of `permits`) under a lease of `ttl`, `unlock`
/// releases it and `renew` renews it. Whatever holds a lock while a job
/// runs holds a permit with it, renewals and release included.
///
/// ```
/// # futures_lite::future::block_on(async {
/// use guard_core::lock::{Locker, Ttl};
/// use guard_core::semaphore::{Permits, PermitLock, SendSemaphore};
/// # use guard_core::lock::{Renewal, Token, TokenId, UnlockError};
/// # struct Always;
/// # impl SendSemaphore for Always {
/// #     type Error = core::convert::Infallible;
/// #     async fn try_acquire(&self, _: &str, _: Permits, _: Ttl) -> Result<Option<Token>, Self::Error> {
/// #         Ok(Some(Token::new(TokenId([1; 16]), 1)))
/// #     }
/// #     async fn renew(&self, _: &str, _: &Token, _: Ttl) -> Result<Renewal, Self::Error> { Ok(Renewal::Held) }
/// #     async fn release(&self, _: &str, _: &Token) -> Result<(), UnlockError<Self::Error>> { Ok(()) }
/// #     async fn holders(&self, _: &str) -> Result<u32, Self::Error> { Ok(0) }
/// # }
/// # let semaphore = Always;
/// // Three exports at a time across the fleet.
/// let exports = PermitLock::new(semaphore, Permits::new(3)?);
/// if let Some(permit) = exports.try_lock("guard:semaphore:exports", Ttl::from_secs(30)?).await? {
///     // ... the export, fenced with permit.fence() ...
///     exports.unlock("guard:semaphore:exports", &permit).await.ok();
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct PermitLock<S> {
    semaphore: S,
    permits: Permits,
}

impl<S> PermitLock<S> {
    /// Permits of `semaphore`, `permits` at once.
    pub const fn new(semaphore: S, permits: Permits) -> Self {
        PermitLock { semaphore, permits }
    }

    /// The semaphore.
    pub const fn semaphore(&self) -> &S {
        &self.semaphore
    }

    /// How many holders it admits at once.
    pub const fn permits(&self) -> Permits {
        self.permits
    }
}

/// A lock with `Send` futures, as the semaphore's are: what a server's
/// shared handle (guard-std's `SharedLocker`) takes.
impl<S: SendSemaphore + Sync> SendLocker for PermitLock<S> {
    type Error = S::Error;

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, S::Error> {
        self.semaphore.try_acquire(key, self.permits, ttl).await
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<S::Error>> {
        self.semaphore.release(key, token).await
    }
}

impl<S: SendSemaphore + Sync> SendLeaseRenewer for PermitLock<S> {
    async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, S::Error> {
        self.semaphore.renew(key, token, ttl).await
    }
}

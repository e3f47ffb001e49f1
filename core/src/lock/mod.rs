//! The locking contract that at-most-once execution rests on.
//!
//! A [`Locker`] grants a key to one holder for a time-to-live; the holder
//! proves ownership with a [`Token`] and releases with compare-and-delete,
//! so a stale holder never frees someone else's lock. Keys expire on their
//! own even if never unlocked. A [`LeaseRenewer`] extends a held lock
//! atomically.
//!
//! Every acquisition carries a **fencing number** that strictly increases
//! per key: a resource that remembers the highest fence it accepted can
//! reject a stale leader that wakes up after its lease expired.
//!
//! The traits use `async fn`: a concrete locker's futures are `Send` when
//! its code is, which callers that know the type (a server's shared
//! handle, an embassy task) see. Generic code does not need `Send`.

mod key;
pub mod redis;
mod token;
mod wait;

pub use key::{
    DEFAULT_PREFIX, KeyError, MAX_KEY_LEN, MAX_SCOPE_LEN, Scope, active_key, check_prefix,
    claim_key, once_key, semaphore_key,
};
pub use token::{Token, TokenId};
pub use wait::{DEFAULT_POLL, LockWithRetryError, LockerExt};

use core::fmt;
use core::time::Duration;

/// A lock's time-to-live: at least one millisecond.
///
/// A zero TTL would create a lock that never expires on some backends (the
/// original sent `SETNX` without expiry) and a sub-millisecond one would
/// delete it on others (`PEXPIRE 0`); both are refused when built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Ttl(Duration);

/// A TTL below one millisecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct InvalidTtl;

impl fmt::Display for InvalidTtl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a lock TTL must be at least 1 ms")
    }
}

impl core::error::Error for InvalidTtl {}

impl Ttl {
    /// One millisecond, the shortest TTL.
    pub const MIN: Ttl = Ttl(Duration::from_millis(1));

    /// `d`, if it is at least one millisecond.
    pub const fn new(d: Duration) -> Result<Ttl, InvalidTtl> {
        if d.as_millis() == 0 {
            Err(InvalidTtl)
        } else {
            Ok(Ttl(d))
        }
    }

    /// `secs` seconds (a zero is refused).
    pub const fn from_secs(secs: u64) -> Result<Ttl, InvalidTtl> {
        Ttl::new(Duration::from_secs(secs))
    }

    /// `millis` milliseconds (a zero is refused).
    pub const fn from_millis(millis: u64) -> Result<Ttl, InvalidTtl> {
        Ttl::new(Duration::from_millis(millis))
    }

    /// A TTL from a constant known to be at least one millisecond.
    pub(crate) const fn from_valid(d: Duration) -> Ttl {
        Ttl(d)
    }

    /// The duration.
    pub const fn as_duration(&self) -> Duration {
        self.0
    }

    /// Whole milliseconds, rounded up, so a backend never holds a lock for
    /// less than asked (at least 1).
    pub const fn as_millis_ceil(&self) -> u64 {
        let n = self.0.as_nanos().div_ceil(1_000_000);
        if n > u64::MAX as u128 {
            u64::MAX
        } else {
            #[allow(clippy::cast_possible_truncation, reason = "checked above")]
            let n = n as u64;
            n
        }
    }
}

/// The answer to a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Renewal {
    /// The lock is still ours, with a fresh TTL.
    Held,
    /// The key is gone, expired or held by another token.
    Lost,
}

/// Why an unlock did not release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum UnlockError<E> {
    /// The key is missing or held by another token: nothing was released.
    NotHeld,
    /// The backend failed.
    Backend(E),
}

impl<E> UnlockError<E> {
    /// The same error with the backend's error turned by `f` (an adapter
    /// boxing its client's error, say).
    pub fn map_backend<F>(self, f: impl FnOnce(E) -> F) -> UnlockError<F> {
        match self {
            UnlockError::NotHeld => UnlockError::NotHeld,
            UnlockError::Backend(e) => UnlockError::Backend(f(e)),
        }
    }
}

impl<E: fmt::Display> fmt::Display for UnlockError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnlockError::NotHeld => f.write_str("lock not held by this token"),
            UnlockError::Backend(e) => write!(f, "unlock failed: {e}"),
        }
    }
}

/// A backend failure is the source.
impl<E: core::error::Error + 'static> core::error::Error for UnlockError<E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            UnlockError::Backend(e) => Some(e),
            UnlockError::NotHeld => None,
        }
    }
}

/// A lock service: one holder per key at a time, with expiry.
///
/// Contract (every backend passes the same suite):
/// - `try_lock` never waits; `Ok(None)` means held elsewhere, not an error;
/// - a granted key expires after its TTL even if never unlocked;
/// - `unlock` deletes only if the token matches ([`UnlockError::NotHeld`]
///   otherwise);
/// - the fence of each grant is greater than every earlier fence of the key.
///
/// Send-ness follows the concrete locker: on a microcontroller a locker's
/// futures hold `!Send` peripherals, and nothing here asks for more. A
/// locker whose futures are `Send` implements [`SendLocker`] instead (the
/// same methods, futures declared `Send`) and is a `Locker` through it, so
/// generic code that spawns on a multi-threaded executor can ask for
/// `L: SendLocker`. guard-std's `LocalLocker` and `SharedLocker` and
/// guard-redis's `RedisLocker` are `SendLocker`s.
#[trait_variant::make(SendLocker: Send)]
#[allow(async_fn_in_trait, reason = "Send-ness follows the concrete locker")]
pub trait Locker {
    /// A backend failure (connection, timeout, bad reply).
    type Error: fmt::Debug + fmt::Display;

    /// Takes `key` for `ttl` if nobody holds it.
    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, Self::Error>;

    /// Releases `key` if `token` holds it.
    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<Self::Error>>;

    /// Whether `error` refuses the input (a key or parameter no store of
    /// this kind takes) rather than reporting the store failing. Asking
    /// again cannot change such an error, and a guard never applies its
    /// fail-open policy to one: fail-open is for a store that could not
    /// answer, never for input crafted to make it fail. `false` unless
    /// the locker says otherwise.
    fn is_invalid_input(error: &Self::Error) -> bool {
        let _ = error;
        false
    }
}

/// A locker that can extend a held lock in place, with no window in which
/// another holder could take it. [`SendLeaseRenewer`] is its variant
/// with `Send` futures, as [`SendLocker`] is [`Locker`]'s.
#[trait_variant::make(SendLeaseRenewer: Send)]
#[allow(async_fn_in_trait, reason = "Send-ness follows the concrete locker")]
pub trait LeaseRenewer: Locker {
    /// Resets the TTL of `key` to `ttl` if `token` still holds it.
    async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, Self::Error>;
}

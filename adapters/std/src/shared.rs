//! One locker, injected everywhere: a dyn-compatible handle and the guard
//! configuration that carries it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use guard_core::lock::{
    DEFAULT_PREFIX, KeyError, Renewal, Scope, SendLocker, Token, Ttl, UnlockError,
};
use tracing::field::Empty;

use crate::observe::timed;

/// A boxed, `Send` future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A backend's error behind a `dyn` handle: what a [`SharedLocker`] and a
/// [`RateLimiter`](crate::ratelimit::RateLimiter) return when the store
/// under them fails (Redis unreachable, a table full, ...).
///
/// It shows the backend's message and returns the backend's error from
/// [`source`](std::error::Error::source); [`downcast_ref`](Self::downcast_ref)
/// recovers the concrete type (for example `guard_redis::RedisGuardError`).
///
/// A backend that refused its input (a key no store of its kind takes)
/// says so ([`invalid_input`](Self::invalid_input)), and the flag goes
/// through the handle: a guard never applies fail-open to such an error
/// ([`is_invalid_input`](Self::is_invalid_input)).
#[derive(Debug)]
pub struct BackendError {
    error: Box<dyn std::error::Error + Send + Sync>,
    invalid_input: bool,
}

impl BackendError {
    /// Wraps a backend error: the store failed.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        BackendError {
            error: Box::new(error),
            invalid_input: false,
        }
    }

    /// Wraps a backend's refusal of its input (a key or parameter no store
    /// of its kind takes): asking again cannot help.
    pub fn invalid_input(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        BackendError {
            error: Box::new(error),
            invalid_input: true,
        }
    }

    /// Whether the backend refused its input rather than failed.
    pub fn is_invalid_input(&self) -> bool {
        self.invalid_input
    }

    /// The backend's error, if it is an `E`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.error.downcast_ref()
    }

    /// The backend's error.
    pub fn into_inner(self) -> Box<dyn std::error::Error + Send + Sync> {
        self.error
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.error)
    }
}

/// The error of a [`SharedLocker`]: a [`BackendError`].
pub type LockerError = BackendError;

/// A locker behind a pointer: object-safe, with `Send` futures. Each
/// backend implements it for its concrete type (whose futures are known to
/// be `Send`); [`SharedLocker`] is the handle servers pass around.
///
/// [`can_renew`](Self::can_renew) has no default: renewal is a capability
/// each backend states, never assumed (the original's prefix wrapper
/// claimed it for every locker and made leaders of renew-less lockers flap
/// on every tick). Futures do their work when polled, not when created.
pub trait DynLocker: Send + Sync {
    /// [`Locker::try_lock`](guard_core::lock::Locker::try_lock).
    fn try_lock<'a>(
        &'a self,
        key: &'a str,
        ttl: Ttl,
    ) -> BoxFuture<'a, Result<Option<Token>, BackendError>>;

    /// [`Locker::unlock`](guard_core::lock::Locker::unlock).
    fn unlock<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), UnlockError<BackendError>>>;

    /// Whether [`renew`](Self::renew) extends a lease in place.
    fn can_renew(&self) -> bool;

    /// [`guard_core::lock::LeaseRenewer::renew`]; called only when
    /// [`can_renew`](Self::can_renew) is true.
    fn renew<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        ttl: Ttl,
    ) -> BoxFuture<'a, Result<Renewal, BackendError>>;
}

/// `error` of locker `L` behind a `dyn` handle, its refusals of input
/// ([`Locker::is_invalid_input`](guard_core::lock::Locker::is_invalid_input))
/// kept as such. For [`impl_dyn_locker!`].
#[doc(hidden)]
pub fn backend_error<L>(error: L::Error) -> BackendError
where
    L: guard_core::lock::Locker + ?Sized,
    L::Error: std::error::Error + Send + Sync + 'static,
{
    if L::is_invalid_input(&error) {
        BackendError::invalid_input(error)
    } else {
        BackendError::new(error)
    }
}

/// Implements [`DynLocker`] for a concrete type that implements
/// `guard_core::lock::Locker` and `LeaseRenewer` (with an error that is a
/// `std::error::Error + Send + Sync`): its futures are boxed, which is
/// where the concrete type's `Send` futures become a `dyn` handle.
///
/// ```ignore
/// guard_std::impl_dyn_locker!(MyLocker);
/// guard_std::impl_dyn_locker!([C: Clock + 'static] MyClockedLocker<C>);
/// ```
#[macro_export]
macro_rules! impl_dyn_locker {
    ([$($generics:tt)*] $ty:ty) => {
        impl<$($generics)*> $crate::DynLocker for $ty {
            fn try_lock<'a>(
                &'a self,
                key: &'a str,
                ttl: ::guard_core::lock::Ttl,
            ) -> $crate::BoxFuture<'a, ::core::result::Result<::core::option::Option<::guard_core::lock::Token>, $crate::BackendError>>
            {
                ::std::boxed::Box::pin(async move {
                    ::guard_core::lock::Locker::try_lock(self, key, ttl)
                        .await
                        .map_err(|e| $crate::backend_error::<$ty>(e))
                })
            }

            fn unlock<'a>(
                &'a self,
                key: &'a str,
                token: &'a ::guard_core::lock::Token,
            ) -> $crate::BoxFuture<'a, ::core::result::Result<(), ::guard_core::lock::UnlockError<$crate::BackendError>>>
            {
                ::std::boxed::Box::pin(async move {
                    ::guard_core::lock::Locker::unlock(self, key, token)
                        .await
                        .map_err(|e| e.map_backend(|e| $crate::backend_error::<$ty>(e)))
                })
            }

            fn can_renew(&self) -> bool {
                true
            }

            fn renew<'a>(
                &'a self,
                key: &'a str,
                token: &'a ::guard_core::lock::Token,
                ttl: ::guard_core::lock::Ttl,
            ) -> $crate::BoxFuture<'a, ::core::result::Result<::guard_core::lock::Renewal, $crate::BackendError>> {
                ::std::boxed::Box::pin(async move {
                    ::guard_core::lock::LeaseRenewer::renew(self, key, token, ttl)
                        .await
                        .map_err(|e| $crate::backend_error::<$ty>(e))
                })
            }
        }
    };
    ($ty:ty) => {
        $crate::impl_dyn_locker!([] $ty);
    };
}

/// A cheaply cloned handle to one locker, shared by every guard of a
/// process. It is a [`SendLocker`] (a `Locker` with `Send` futures); renewal is the
/// inherent [`SharedLocker::renew`], available when
/// [`SharedLocker::can_renew`]. It deliberately does not implement
/// `LeaseRenewer`, so a backend that cannot renew never looks as if it can.
#[derive(Clone)]
pub struct SharedLocker(Arc<dyn DynLocker>);

impl fmt::Debug for SharedLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedLocker")
            .field("can_renew", &self.can_renew())
            .finish()
    }
}

/// A renewal that is never asked of a backend that cannot do it.
#[derive(Debug)]
struct RenewUnsupported;

impl fmt::Display for RenewUnsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("this locker cannot renew a lease in place")
    }
}

impl std::error::Error for RenewUnsupported {}

impl SharedLocker {
    /// Shares `locker`.
    pub fn new(locker: impl DynLocker + 'static) -> Self {
        SharedLocker(Arc::new(locker))
    }

    /// Shares any [`DynLocker`].
    pub fn from_dyn(locker: Arc<dyn DynLocker>) -> Self {
        SharedLocker(locker)
    }

    /// Whether the backend renews in place.
    pub fn can_renew(&self) -> bool {
        self.0.can_renew()
    }

    /// Renews `key` if the backend can; an error says it cannot. In a
    /// span `renew` (`key`, `fence`, `outcome`: `held`, `lost`, `error`),
    /// timed in `guard_lock_seconds{op="renew"}` ([`crate::observe`]).
    pub async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, BackendError> {
        if !self.0.can_renew() {
            return Err(BackendError::new(RenewUnsupported));
        }
        let span = tracing::info_span!(
            "renew",
            key,
            fence = token.fence(),
            ttl_ms = ttl.as_millis_ceil(),
            outcome = Empty
        );
        let (result, seconds) = timed(&span, self.0.renew(key, token, ttl)).await;
        let outcome = match &result {
            Ok(Renewal::Held) => "held",
            Ok(Renewal::Lost) => "lost",
            Err(_) => "error",
        };
        span.record("outcome", outcome);
        crate::metrics::record_lock_seconds("renew", outcome, seconds);
        result
    }
}

/// The lock calls are observed here, once for every backend and every
/// guard built on a shared locker: spans `acquire` and `release` and
/// `guard_lock_seconds{op}` ([`crate::observe`]).
impl SendLocker for SharedLocker {
    type Error = BackendError;

    fn is_invalid_input(error: &BackendError) -> bool {
        error.is_invalid_input()
    }

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, BackendError> {
        let span = tracing::info_span!(
            "acquire",
            key,
            ttl_ms = ttl.as_millis_ceil(),
            fence = Empty,
            outcome = Empty
        );
        let (result, seconds) = timed(&span, self.0.try_lock(key, ttl)).await;
        let outcome = match &result {
            Ok(Some(token)) => {
                span.record("fence", token.fence());
                "acquired"
            }
            Ok(None) => "held_elsewhere",
            Err(_) => "error",
        };
        span.record("outcome", outcome);
        crate::metrics::record_lock_seconds("acquire", outcome, seconds);
        result
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<BackendError>> {
        let span = tracing::info_span!("release", key, fence = token.fence(), outcome = Empty);
        let (result, seconds) = timed(&span, self.0.unlock(key, token)).await;
        let outcome = match &result {
            Ok(()) => "released",
            Err(UnlockError::NotHeld) => "not_held",
            Err(_) => "error",
        };
        span.record("outcome", outcome);
        crate::metrics::record_lock_seconds("release", outcome, seconds);
        result
    }
}

/// What every guard of a process shares: an optional locker, the owner
/// (tenant) and the key prefix (the original's `WithLocker` and
/// `WithOwner`).
///
/// With no locker, every guard is a no-op: a single process behaves as if
/// guard were not there, and replicas gain deduplication by injecting one.
#[derive(Clone, Debug)]
pub struct GuardConfig {
    locker: Option<SharedLocker>,
    /// The elections' locker, when it is not `locker` (one that waits out
    /// a lost store, say, which the once-guards' hour-long keys cannot).
    lease_locker: Option<SharedLocker>,
    owner: String,
    prefix: String,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            locker: None,
            lease_locker: None,
            owner: String::new(),
            prefix: DEFAULT_PREFIX.to_owned(),
        }
    }
}

impl GuardConfig {
    /// No locker, no owner, the default prefix.
    pub fn new() -> Self {
        Self::default()
    }

    /// Injects the locker every guard uses.
    pub fn with_locker(mut self, locker: SharedLocker) -> Self {
        self.locker = Some(locker);
        self
    }

    /// The tenant: a segment of every scope, isolating tenants' keys.
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// The key prefix (an environment namespace, e.g. `prod1:guard:`);
    /// refused if it contains `{` or `}`
    /// ([`check_prefix`](guard_core::lock::check_prefix)).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Self, KeyError> {
        let prefix = prefix.into();
        guard_core::lock::check_prefix(&prefix)?;
        self.prefix = prefix;
        Ok(self)
    }

    /// Injects the locker the elections (`run::ActiveRunner`: leader
    /// leases) use instead of [`with_locker`](Self::with_locker)'s, on the
    /// same lock service: one with other settings for leases alone (a
    /// quarantine after a lost store costs a lease one TTL, a once-guard's
    /// key its whole keep). Without it, elections use the guards' locker.
    pub fn with_lease_locker(mut self, locker: SharedLocker) -> Self {
        self.lease_locker = Some(locker);
        self
    }

    /// The locker, if one is injected.
    pub fn locker(&self) -> Option<&SharedLocker> {
        self.locker.as_ref()
    }

    /// The elections' locker: [`with_lease_locker`](Self::with_lease_locker)'s,
    /// else the guards' one, if any.
    pub fn lease_locker(&self) -> Option<&SharedLocker> {
        self.lease_locker.as_ref().or(self.locker.as_ref())
    }

    /// The owner.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A scope for `component`, with this config's owner as its first
    /// segment (skipped when empty). Add chain, router or instance
    /// segments with [`Scope::segment`].
    pub fn scope(&self, component: &str) -> Result<Scope, KeyError> {
        Scope::new(component)?.segment("owner", &self.owner)
    }
}

// One permit of any semaphore whose futures are `Send` is a shared lock:
// `LockWatchdog` runs a job under it, renewing and releasing it.
crate::impl_dyn_locker!(
    [S: ::guard_core::semaphore::SendSemaphore<Error: std::error::Error + Send + Sync + 'static> + Send + Sync + 'static]
    ::guard_core::semaphore::PermitLock<S>
);

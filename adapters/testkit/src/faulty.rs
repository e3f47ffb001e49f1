//! A locker that fails on purpose: renewals that are lost, unsupported or
//! never answered, unlocks that fail, over a working [`LocalLocker`].

use guard_core::lock::{Renewal, Token, Ttl, UnlockError};
use guard_std::{
    BoxFuture, Clock, DynLocker, GuardConfig, LocalLocker, LockerError, SharedLocker, SystemClock,
};

/// How a [`FaultyLocker`] answers a renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewFault {
    /// Renews as the inner locker does.
    None,
    /// Claims no renewal support (`can_renew` is false): leaders release
    /// and re-acquire instead.
    Unsupported,
    /// Every renewal finds the lease lost.
    AlwaysLost,
    /// A renewal never completes (a backend that stopped answering).
    NeverAnswers,
}

/// [`LocalLocker`] with a renewal fault swapped in, and optionally an
/// unlock that always fails with a backend error.
#[derive(Debug)]
pub struct FaultyLocker<C: Clock = SystemClock> {
    inner: LocalLocker<C>,
    renew: RenewFault,
    unlock_fails: bool,
}

impl<C: Clock + 'static> FaultyLocker<C> {
    /// Faults over `inner` (give it a clock to run in virtual time).
    pub fn new(inner: LocalLocker<C>, renew: RenewFault, unlock_fails: bool) -> Self {
        FaultyLocker {
            inner,
            renew,
            unlock_fails,
        }
    }

    /// A configuration whose locker is this one.
    pub fn config(self) -> GuardConfig {
        GuardConfig::new().with_locker(SharedLocker::new(self))
    }
}

impl<C: Clock + 'static> DynLocker for FaultyLocker<C> {
    fn try_lock<'a>(
        &'a self,
        key: &'a str,
        ttl: Ttl,
    ) -> BoxFuture<'a, Result<Option<Token>, LockerError>> {
        DynLocker::try_lock(&self.inner, key, ttl)
    }

    fn unlock<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), UnlockError<LockerError>>> {
        if self.unlock_fails {
            return Box::pin(async {
                Err(UnlockError::Backend(LockerError::new(
                    std::io::Error::other("connection reset"),
                )))
            });
        }
        DynLocker::unlock(&self.inner, key, token)
    }

    fn can_renew(&self) -> bool {
        self.renew != RenewFault::Unsupported
    }

    fn renew<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        ttl: Ttl,
    ) -> BoxFuture<'a, Result<Renewal, LockerError>> {
        match self.renew {
            // Never called when can_renew is false; renewing as the
            // inner locker would is the harmless answer if it were.
            RenewFault::None | RenewFault::Unsupported => {
                DynLocker::renew(&self.inner, key, token, ttl)
            }
            RenewFault::AlwaysLost => Box::pin(async { Ok(Renewal::Lost) }),
            RenewFault::NeverAnswers => Box::pin(std::future::pending()),
        }
    }
}

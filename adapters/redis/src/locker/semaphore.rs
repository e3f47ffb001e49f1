//! `RedisLocker` as a [`Semaphore`](guard_core::semaphore::Semaphore):
//! the layout and scripts of [`guard_core::semaphore::redis`], on the
//! locker's connection and prefix.

use guard_core::lock::{Renewal, Token, Ttl, UnlockError};
use guard_core::semaphore::redis::{ACQUIRE_SCRIPT, HOLDERS_SCRIPT, RELEASE_SCRIPT, RENEW_SCRIPT};
use guard_core::semaphore::{Permits, SendSemaphore};
use redis::Script;

use super::{RedisLocker, lock_keys};
use crate::error::RedisGuardError;

/// The semaphore scripts, loaded once per locker.
pub(super) struct Scripts {
    acquire: Script,
    renew: Script,
    release: Script,
    holders: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            acquire: Script::new(ACQUIRE_SCRIPT),
            renew: Script::new(RENEW_SCRIPT),
            release: Script::new(RELEASE_SCRIPT),
            holders: Script::new(HOLDERS_SCRIPT),
        }
    }
}

/// Permits in a hash beside the locks, on the same connection and prefix
/// (see [`guard_core::semaphore::redis`] for the layout): the hash and its
/// fence counter share a hash slot, so each call is one script on a
/// cluster too, and leases run on the server's clock.
impl SendSemaphore for RedisLocker {
    type Error = RedisGuardError;

    async fn try_acquire(
        &self,
        key: &str,
        permits: Permits,
        lease: Ttl,
    ) -> Result<Option<Token>, RedisGuardError> {
        let (hash, fence) = lock_keys(&self.prefix, key)?;
        let id = self.ids.next_id();
        let mut invocation = self.semaphore.acquire.prepare_invoke();
        invocation
            .key(&hash)
            .key(&fence)
            .arg(Self::hex(&id))
            .arg(permits.get())
            .arg(lease.as_millis_ceil());
        let fence: i64 = self.conn.invoke(&invocation).await?;
        match u64::try_from(fence) {
            Ok(0) => Ok(None),
            Ok(fence) => Ok(Some(Token::new(id, fence))),
            Err(_) => Err(RedisGuardError::UnexpectedReply(format!(
                "semaphore fence {fence}"
            ))),
        }
    }

    async fn renew(
        &self,
        key: &str,
        token: &Token,
        lease: Ttl,
    ) -> Result<Renewal, RedisGuardError> {
        let (hash, _) = lock_keys(&self.prefix, key)?;
        let mut invocation = self.semaphore.renew.prepare_invoke();
        invocation
            .key(&hash)
            .arg(Self::hex(token.id()))
            .arg(lease.as_millis_ceil());
        let renewed: i64 = self.conn.invoke(&invocation).await?;
        Ok(if renewed == 1 {
            Renewal::Held
        } else {
            Renewal::Lost
        })
    }

    async fn release(&self, key: &str, token: &Token) -> Result<(), UnlockError<RedisGuardError>> {
        let (hash, _) = lock_keys(&self.prefix, key).map_err(UnlockError::Backend)?;
        let mut invocation = self.semaphore.release.prepare_invoke();
        invocation.key(&hash).arg(Self::hex(token.id()));
        match self.conn.invoke::<i64>(&invocation).await {
            Ok(1) => Ok(()),
            Ok(_) => Err(UnlockError::NotHeld),
            Err(e) => Err(UnlockError::Backend(e)),
        }
    }

    async fn holders(&self, key: &str) -> Result<u32, RedisGuardError> {
        let (hash, _) = lock_keys(&self.prefix, key)?;
        let mut invocation = self.semaphore.holders.prepare_invoke();
        invocation.key(&hash);
        let live: i64 = self.conn.invoke(&invocation).await?;
        u32::try_from(live)
            .map_err(|_| RedisGuardError::UnexpectedReply(format!("semaphore holders {live}")))
    }
}

//! `PgLocker` as a [`Semaphore`](guard_core::semaphore::Semaphore):
//! permits in the table `<table>_permits`, taken by the function
//! `<table>_acquire` (see [`crate::sql`]), leases on the server's clock,
//! fences from the locks' sequence.

use guard_core::lock::{Renewal, Token, Ttl, UnlockError};
use guard_core::semaphore::{Permits, SendSemaphore};

use super::{PermitStatements, PgLocker, Session, checked_key, stored_fence, ttl_millis};
use crate::error::PgLockError;

/// The session's permit statements, or why they cannot run (as the
/// request's answer, so it is reported by name).
fn statements(s: &Session) -> Result<&PermitStatements, &str> {
    s.permits.as_ref().map_err(String::as_str)
}

impl PgLocker {
    /// `why` the semaphore cannot run here, as an error naming the table.
    fn permits_unavailable(&self, why: String) -> PgLockError {
        PgLockError::invalid("table", self.table(), why)
    }

    /// Renews (`lease` given) or releases `token`'s live permit of `key`:
    /// whether one row changed. A fence no sequence gave holds nothing.
    async fn change_permit(
        &self,
        key: &str,
        token: &Token,
        lease: Option<Ttl>,
    ) -> Result<bool, PgLockError> {
        let key = checked_key(key)?;
        let Some(fence) = stored_fence(token) else {
            return Ok(false);
        };
        let id = &token.id().0[..];
        let changed = match lease.map(ttl_millis) {
            Some(ms) => {
                self.request("permit renew", async |s: &Session| match statements(s) {
                    Ok(p) => s
                        .client
                        .execute(&p.renew, &[&key, &id, &fence, &ms])
                        .await
                        .map(Ok),
                    Err(why) => Ok(Err(why.to_owned())),
                })
                .await?
            }
            None => {
                self.request("permit release", async |s: &Session| match statements(s) {
                    Ok(p) => s
                        .client
                        .execute(&p.release, &[&key, &id, &fence])
                        .await
                        .map(Ok),
                    Err(why) => Ok(Err(why.to_owned())),
                })
                .await?
            }
        };
        Ok(changed.map_err(|why| self.permits_unavailable(why))? == 1)
    }
}

/// Permits beside the leases, on the same connection: an acquisition is
/// one call of the acquire function, which counts and inserts under an
/// advisory lock of the key, so at most `permits` are live for every
/// client of the server (a single primary: no replication window).
impl SendSemaphore for PgLocker {
    type Error = PgLockError;

    async fn try_acquire(
        &self,
        key: &str,
        permits: Permits,
        lease: Ttl,
    ) -> Result<Option<Token>, PgLockError> {
        let key = checked_key(key)?;
        // As a lock's: the purge first, so the grant is the last step.
        self.purge_now_and_then().await;
        let id = self.ids.next_id();
        let (token, ms) = (&id.0[..], ttl_millis(lease));
        // MAX_PERMITS fits an integer.
        let permits = i32::try_from(permits.get()).unwrap_or(i32::MAX);
        let row = self
            .request("permit acquire", async |s: &Session| match statements(s) {
                Ok(p) => s
                    .client
                    .query_one(&p.acquire, &[&key, &token, &permits, &ms])
                    .await
                    .map(Ok),
                Err(why) => Ok(Err(why.to_owned())),
            })
            .await?
            .map_err(|why| self.permits_unavailable(why))?;
        let fence: Option<i64> = row
            .try_get(0)
            .map_err(|e| PgLockError::UnexpectedReply(format!("permit acquire: {e}")))?;
        match fence.map(u64::try_from) {
            None => Ok(None),
            Some(Ok(fence)) if fence > 0 => Ok(Some(Token::new(id, fence))),
            Some(_) => Err(PgLockError::UnexpectedReply(format!(
                "permit fence {fence:?}"
            ))),
        }
    }

    async fn renew(&self, key: &str, token: &Token, lease: Ttl) -> Result<Renewal, PgLockError> {
        Ok(if self.change_permit(key, token, Some(lease)).await? {
            Renewal::Held
        } else {
            Renewal::Lost
        })
    }

    async fn release(&self, key: &str, token: &Token) -> Result<(), UnlockError<PgLockError>> {
        match self.change_permit(key, token, None).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(UnlockError::NotHeld),
            Err(e) => Err(UnlockError::Backend(e)),
        }
    }

    async fn holders(&self, key: &str) -> Result<u32, PgLockError> {
        let key = checked_key(key)?;
        let row = self
            .request("permit holders", async |s: &Session| match statements(s) {
                Ok(p) => s.client.query_one(&p.holders, &[&key]).await.map(Ok),
                Err(why) => Ok(Err(why.to_owned())),
            })
            .await?
            .map_err(|why| self.permits_unavailable(why))?;
        let live: i64 = row
            .try_get(0)
            .map_err(|e| PgLockError::UnexpectedReply(format!("permit holders: {e}")))?;
        u32::try_from(live)
            .map_err(|_| PgLockError::UnexpectedReply(format!("permit holders {live}")))
    }
}

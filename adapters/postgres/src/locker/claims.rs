//! `PgLocker` as a [`ClaimStore`](guard_core::claim::ClaimStore): records
//! in the table `<table>_claims` (see [`crate::sql`]), one statement a
//! call, leases on the server's clock, fences from the locks' sequence.

use std::time::Duration;

use guard_core::claim::{Begin, SendClaimStore, Settled, Start};
use guard_core::lock::{Renewal, Token, Ttl};
use tokio_postgres::Row;

use super::{PgLocker, Session, checked_key, stored_fence, ttl_millis};
use crate::error::PgLockError;

fn unexpected(what: &str) -> PgLockError {
    PgLockError::UnexpectedReply(format!("claim begin: {what}"))
}

/// Reads the begin statement's row (see `Statements::claim_begin`).
fn begun(
    row: Option<Row>,
    id: guard_core::lock::TokenId,
    result: &mut [u8],
) -> Result<Begin, PgLockError> {
    // No row: the record changed under the statement; a retry answers.
    let Some(row) = row else {
        return Ok(Begin::Running {
            lease_left: Duration::ZERO,
        });
    };
    let get_err = |e: tokio_postgres::Error| unexpected(&e.to_string());
    let kind: i32 = row.try_get("kind").map_err(get_err)?;
    match kind {
        1 => {
            let fence: i64 = row.try_get("fence").map_err(get_err)?;
            let attempt: i32 = row.try_get("attempt").map_err(get_err)?;
            let started: String = row.try_get("started").map_err(get_err)?;
            let after = match started.as_str() {
                "fresh" => Start::Fresh,
                "failed" => Start::AfterFailure,
                "expired" => Start::AfterExpiry,
                other => return Err(unexpected(&format!("started {other:?}"))),
            };
            match (u64::try_from(fence), u32::try_from(attempt)) {
                (Ok(fence), Ok(attempt)) if fence > 0 && attempt > 0 => Ok(Begin::Started {
                    token: Token::new(id, fence),
                    attempt,
                    after,
                }),
                _ => Err(unexpected(&format!("fence {fence}, attempt {attempt}"))),
            }
        }
        2 => {
            let left: Option<i64> = row.try_get("left_ms").map_err(get_err)?;
            Ok(Begin::Running {
                lease_left: Duration::from_millis(
                    left.and_then(|ms| u64::try_from(ms).ok()).unwrap_or(0),
                ),
            })
        }
        3 => {
            let stored: Option<&[u8]> = row.try_get("result").map_err(get_err)?;
            Ok(Begin::done_with(stored.unwrap_or_default(), result))
        }
        other => Err(unexpected(&format!("kind {other}"))),
    }
}

impl PgLocker {
    async fn settle(
        &self,
        key: &str,
        token: &Token,
        keep: Ttl,
        state: &str,
        result: Option<&[u8]>,
    ) -> Result<Settled, PgLockError> {
        let key = checked_key(key)?;
        let Some(fence) = stored_fence(token) else {
            return Ok(Settled::Superseded);
        };
        let (id, keep) = (&token.id().0[..], ttl_millis(keep));
        let settled = self
            .request("claim settle", async |s: &Session| {
                s.client
                    .execute(
                        &s.claim_settle,
                        &[&key, &id, &fence, &state, &keep, &result],
                    )
                    .await
            })
            .await?;
        Ok(if settled == 1 {
            Settled::Recorded
        } else {
            Settled::Superseded
        })
    }
}

/// Claim records beside the leases, on the same connection: each call is
/// one statement, so at most one attempt's lease runs for every client of
/// the server (a single primary: no replication window).
impl SendClaimStore for PgLocker {
    type Error = PgLockError;

    async fn try_begin(
        &self,
        key: &str,
        lease: Ttl,
        keep: Ttl,
        result: &mut [u8],
    ) -> Result<Begin, PgLockError> {
        let key = checked_key(key)?;
        self.purge_now_and_then().await;
        let id = self.ids.next_id();
        let (token, lease, keep) = (&id.0[..], ttl_millis(lease), ttl_millis(keep));
        let row = self
            .request("claim begin", async |s: &Session| {
                s.client
                    .query_opt(&s.claim_begin, &[&key, &token, &lease, &keep])
                    .await
            })
            .await?;
        begun(row, id, result)
    }

    async fn extend(&self, key: &str, token: &Token, lease: Ttl) -> Result<Renewal, PgLockError> {
        let key = checked_key(key)?;
        let Some(fence) = stored_fence(token) else {
            return Ok(Renewal::Lost);
        };
        let (id, lease) = (&token.id().0[..], ttl_millis(lease));
        let extended = self
            .request("claim extend", async |s: &Session| {
                s.client
                    .execute(&s.claim_extend, &[&key, &id, &fence, &lease])
                    .await
            })
            .await?;
        Ok(if extended == 1 {
            Renewal::Held
        } else {
            Renewal::Lost
        })
    }

    async fn complete(
        &self,
        key: &str,
        token: &Token,
        keep: Ttl,
        result: &[u8],
    ) -> Result<Settled, PgLockError> {
        self.settle(key, token, keep, "d", Some(result)).await
    }

    async fn fail(&self, key: &str, token: &Token, keep: Ttl) -> Result<Settled, PgLockError> {
        self.settle(key, token, keep, "f", None).await
    }
}

//! `EtcdLocker` as a [`Semaphore`](guard_core::semaphore::Semaphore):
//! a permit is the key `<key>\0<token hex>` on a lease of its own, whose
//! value is the token id and whose create revision is the fence, as a
//! lock's; release and renewal are a lock's, on that key.
//!
//! An acquisition counts the keys of the range `<key>\0` to `<key>\x01`
//! at some revision R and, if fewer than the permits, puts its own in a
//! transaction that succeeds only if no key of the range was created or
//! changed after R: the count is then still an upper bound (a permit
//! released or expired since only lowers it), so at most `permits` are
//! live. A transaction that fails reads the new count at once and tries
//! again; each failure means another caller's write won. Neither a
//! semaphore key nor a lock key can contain NUL, so no other semaphore's
//! permits and no lock fall in the range.

use etcd_client::proto::PbTxnOpResponse;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnResponse};
use guard_core::lock::{MAX_KEY_LEN, Renewal, Token, TokenId, Ttl, UnlockError};
use guard_core::semaphore::{Permits, SendSemaphore};

use super::{EtcdLocker, hex};
use crate::error::{Call, EtcdError};

/// How many times an acquisition tries its transaction while other
/// callers' writes to the range keep winning, before it is an error.
const MAX_TRIES: usize = 64;

/// Refuses a semaphore key: empty, longer than [`MAX_KEY_LEN`], or with a
/// NUL (the separator of its permits).
fn checked_semaphore_key(key: &str) -> Result<(), EtcdError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN || key.contains('\0') {
        return Err(EtcdError::InvalidInput {
            parameter: "semaphore key",
            value: key.to_owned(),
            rule: format!("must be 1 to {MAX_KEY_LEN} bytes without NUL"),
        });
    }
    Ok(())
}

/// The range of `key`'s permits: `[<key>\0, <key>\x01)`.
fn permit_range(key: &str) -> (Vec<u8>, Vec<u8>) {
    let mut start = key.as_bytes().to_vec();
    start.push(0);
    let mut end = key.as_bytes().to_vec();
    end.push(1);
    (start, end)
}

/// The key of `id`'s permit of `key`.
fn permit_key(key: &str, id: &TokenId) -> String {
    format!("{key}\0{}", hex(id))
}

fn count_only(end: &[u8]) -> GetOptions {
    GetOptions::new().with_range(end.to_vec()).with_count_only()
}

impl EtcdLocker {
    /// How many keys the range holds, and at which revision.
    async fn count_permits(&self, start: &[u8], end: &[u8]) -> Result<(i64, i64), EtcdError> {
        let (reply, endpoint) = self
            .request(Call::PermitCount, |mut c| {
                let (start, options) = (start.to_vec(), count_only(end));
                async move { c.get(start, Some(options)).await }
            })
            .await?;
        match reply.header().map(|h| h.revision()) {
            Some(revision) if revision > 0 => Ok((reply.count(), revision)),
            _ => Err(Self::bad_reply(Call::PermitCount, endpoint, "no revision")),
        }
    }

    /// The count and revision a failed acquisition read instead.
    fn recounted(reply: &TxnResponse, endpoint: &str) -> Result<(i64, i64), EtcdError> {
        let count = match reply
            .0
            .responses
            .first()
            .and_then(|op| op.response.as_ref())
        {
            Some(PbTxnOpResponse::ResponseRange(range)) => Some(range.count),
            _ => None,
        };
        match (count, reply.header().map(|h| h.revision())) {
            (Some(count), Some(revision)) if revision > 0 => Ok((count, revision)),
            _ => Err(Self::bad_reply(
                Call::PermitAcquire,
                endpoint,
                format!("no count in {:?}", reply.0.responses),
            )),
        }
    }

    async fn try_acquire_inner(
        &self,
        key: &str,
        permits: Permits,
        lease: Ttl,
    ) -> Result<Option<Token>, EtcdError> {
        checked_semaphore_key(key)?;
        let (start, end) = permit_range(key);
        let permits = i64::from(permits.get());
        let (mut count, mut revision) = self.count_permits(&start, &end).await?;
        if count >= permits {
            return Ok(None);
        }
        let id = self.ids.next_id();
        let permit = permit_key(key, &id);
        let lease = self.grant_lease(lease).await?;
        for _ in 0..MAX_TRIES {
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    start.clone(),
                    CompareOp::Less,
                    revision.saturating_add(1),
                )
                .with_range(end.clone())])
                .and_then([TxnOp::put(
                    permit.clone(),
                    hex(&id),
                    Some(PutOptions::new().with_lease(lease)),
                )])
                .or_else([TxnOp::get(start.clone(), Some(count_only(&end)))]);
            let (reply, endpoint) = match self.txn(Call::PermitAcquire, txn).await {
                Ok(reply) => reply,
                Err(e) => {
                    // As a lock's: the token is never handed out, so the
                    // lease may go even if the put was applied.
                    self.revoke(lease).await;
                    return Err(e);
                }
            };
            if reply.succeeded() {
                // The put's revision is the permit's create revision.
                let fence = reply.header().map(|h| h.revision());
                return match fence.and_then(|r| u64::try_from(r).ok()).filter(|&r| r > 0) {
                    Some(fence) => Ok(Some(Token::new(id, fence))),
                    None => Err(Self::bad_reply(
                        Call::PermitAcquire,
                        endpoint,
                        "no revision",
                    )),
                };
            }
            (count, revision) = match Self::recounted(&reply, endpoint) {
                Ok(recounted) => recounted,
                Err(e) => {
                    self.revoke(lease).await;
                    return Err(e);
                }
            };
            if count >= permits {
                self.revoke(lease).await;
                return Ok(None);
            }
        }
        self.revoke(lease).await;
        Err(EtcdError::BadReply {
            call: Call::PermitAcquire,
            endpoint: "every endpoint".to_owned(),
            detail: format!(
                "other callers' writes to the permits of {key:?} won {MAX_TRIES} times in a row"
            ),
        })
    }
}

/// Permits as keys on leases beside the locks (see the module
/// documentation); linearizable, as the locks.
impl SendSemaphore for EtcdLocker {
    type Error = EtcdError;

    async fn try_acquire(
        &self,
        key: &str,
        permits: Permits,
        lease: Ttl,
    ) -> Result<Option<Token>, EtcdError> {
        super::on_tokio(self.try_acquire_inner(key, permits, lease)).await
    }

    async fn renew(&self, key: &str, token: &Token, lease: Ttl) -> Result<Renewal, EtcdError> {
        checked_semaphore_key(key)?;
        super::on_tokio(self.move_held(&permit_key(key, token.id()), token, lease, None)).await
    }

    async fn release(&self, key: &str, token: &Token) -> Result<(), UnlockError<EtcdError>> {
        checked_semaphore_key(key).map_err(UnlockError::Backend)?;
        super::on_tokio(self.delete_held(&permit_key(key, token.id()), token, &[], &[])).await
    }

    async fn holders(&self, key: &str) -> Result<u32, EtcdError> {
        checked_semaphore_key(key)?;
        let (start, end) = permit_range(key);
        let (count, _) = super::on_tokio(self.count_permits(&start, &end)).await?;
        u32::try_from(count).map_err(|_| EtcdError::BadReply {
            call: Call::PermitCount,
            endpoint: "the cluster".to_owned(),
            detail: format!("count {count}"),
        })
    }
}

//! `EtcdLocker` as a [`ClaimStore`](guard_core::claim::ClaimStore).
//!
//! A delivery's record is two keys:
//!
//! - the record, at the key as given, on a lease of `max(lease, keep)`
//!   granted at each write: `<state>:<attempt>:<token hex>:<result>`,
//!   state `r` running, `f` failed, `d` done (the result only when done);
//! - the attempt's lease, at `<key>%run` (a `%` never stands unescaped in
//!   a key guard-core's `claim_key` builds), its value the token, on a
//!   lease of the attempt's lease: it exists exactly while the lease runs.
//!
//! An attempt starts in one transaction that checks neither key changed
//! since they were read and puts both: its revision is the fence, the
//! record's mod revision and the lease key's create revision. An extend
//! moves the lease key to a new lease (as a lock's renewal does) and
//! keeps the record's lease alive; a settle checks the record's mod
//! revision is still the fence (nothing began since), so it takes effect
//! past the lease's end too, while nobody took over. etcd is
//! linearizable: at most one attempt's lease runs, for every client.

use std::time::Duration;

use etcd_client::proto::{PbKeyValue, PbTxnOpResponse};
use etcd_client::{Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp, TxnResponse};
use guard_core::claim::{Begin, SendClaimStore, Settled, Start};
use guard_core::lock::{Renewal, Token, TokenId, Ttl};

use super::{EtcdLocker, checked_key, hex, on_tokio};
use crate::error::{Call, EtcdError};

/// The lease key of record `key`.
fn lease_key(key: &str) -> String {
    format!("{key}%run")
}

/// A record's value, parsed.
struct Record<'a> {
    state: u8,
    attempt: u32,
    token: &'a [u8],
    result: &'a [u8],
}

impl<'a> Record<'a> {
    fn parse(value: &'a [u8]) -> Option<Self> {
        let mut parts = value.splitn(4, |&b| b == b':');
        let state = match parts.next()? {
            [s @ (b'r' | b'f' | b'd')] => *s,
            _ => return None,
        };
        let attempt = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        let token = parts.next()?;
        let result = parts.next()?;
        Some(Record {
            state,
            attempt,
            token,
            result,
        })
    }

    fn encode(state: u8, attempt: u32, token: &TokenId, result: &[u8]) -> Vec<u8> {
        let mut value = format!("{}:{attempt}:{}:", char::from(state), hex(token)).into_bytes();
        value.extend_from_slice(result);
        value
    }
}

/// The key-values the `n`-th operation of a transaction read or replaced.
fn kvs(reply: &TxnResponse, n: usize) -> Option<&[PbKeyValue]> {
    match reply.0.responses.get(n)?.response.as_ref()? {
        PbTxnOpResponse::ResponseRange(range) => Some(&range.kvs),
        PbTxnOpResponse::ResponsePut(put) => Some(put.prev_kv.as_slice()),
        PbTxnOpResponse::ResponseDeleteRange(deleted) => Some(&deleted.prev_kvs),
        PbTxnOpResponse::ResponseTxn(_) => None,
    }
}

impl EtcdLocker {
    /// Reads record `key` and its lease key in one revision.
    async fn read_claim(
        &self,
        key: &str,
    ) -> Result<(Option<PbKeyValue>, Option<PbKeyValue>, String), EtcdError> {
        let txn = Txn::new().and_then([TxnOp::get(key, None), TxnOp::get(lease_key(key), None)]);
        let (reply, endpoint) = self.txn(Call::ClaimRead, txn).await?;
        match (kvs(&reply, 0), kvs(&reply, 1)) {
            (Some(record), Some(lease)) => Ok((
                record.first().cloned(),
                lease.first().cloned(),
                endpoint.to_owned(),
            )),
            _ => Err(Self::bad_reply(
                Call::ClaimRead,
                endpoint,
                format!("not two ranges: {:?}", reply.0.responses),
            )),
        }
    }

    fn bad_record(endpoint: String, key: &str, value: &[u8]) -> EtcdError {
        EtcdError::BadReply {
            call: Call::ClaimRead,
            endpoint,
            detail: format!(
                "claim record {key} holds {:?}, not <r|f|d>:<attempt>:<token>:<result>",
                String::from_utf8_lossy(value)
            ),
        }
    }

    /// The time left on `lease`, in whole seconds (zero if it is gone or
    /// cannot be asked).
    async fn time_left(&self, lease: i64) -> Duration {
        let asked = self
            .request(Call::ClaimRead, |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await;
        match asked {
            Ok((reply, _)) => Duration::from_secs(u64::try_from(reply.ttl()).unwrap_or(0)),
            Err(e) => {
                tracing::debug!("claim lease {lease:x}: time left unknown: {e}");
                Duration::ZERO
            }
        }
    }

    async fn begin_inner(
        &self,
        key: &str,
        lease: Ttl,
        keep: Ttl,
        result: &mut [u8],
    ) -> Result<Begin, EtcdError> {
        checked_key(key)?;
        let (record, running, endpoint) = self.read_claim(key).await?;
        let parsed = match &record {
            Some(kv) => Some(
                Record::parse(&kv.value)
                    .ok_or_else(|| Self::bad_record(endpoint, key, &kv.value))?,
            ),
            None => None,
        };
        if let Some(done) = parsed.as_ref().filter(|r| r.state == b'd') {
            return Ok(Begin::done_with(done.result, result));
        }
        if let Some(running) = running {
            return Ok(Begin::Running {
                lease_left: self.time_left(running.lease).await.min(lease.as_duration()),
            });
        }
        let (after, last) = match &parsed {
            None => (Start::Fresh, 0),
            Some(r) if r.state == b'f' => (Start::AfterFailure, r.attempt),
            Some(r) => (Start::AfterExpiry, r.attempt),
        };
        let attempt = last.saturating_add(1);
        let id = self.ids.next_id();
        let run_lease = self.grant_lease(lease).await?;
        let keep_lease = match self.grant_lease(keep.max(lease)).await {
            Ok(id) => id,
            Err(e) => {
                self.revoke(run_lease).await;
                return Err(e);
            }
        };
        let seen = record.as_ref().map_or(0, |kv| kv.mod_revision);
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key, CompareOp::Equal, seen),
                Compare::create_revision(lease_key(key), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(
                    lease_key(key),
                    hex(&id),
                    Some(PutOptions::new().with_lease(run_lease)),
                ),
                TxnOp::put(
                    key,
                    Record::encode(b'r', attempt, &id, &[]),
                    Some(PutOptions::new().with_lease(keep_lease)),
                ),
            ]);
        let (reply, endpoint) = match self.txn(Call::ClaimBegin, txn).await {
            Ok(reply) => reply,
            Err(e) => {
                // The token is never handed out: the leases may go even if
                // the transaction was applied and only its answer lost.
                self.revoke(run_lease).await;
                self.revoke(keep_lease).await;
                return Err(e);
            }
        };
        if !reply.succeeded() {
            // Another begin came between the read and this: it runs.
            self.revoke(run_lease).await;
            self.revoke(keep_lease).await;
            return Ok(Begin::Running {
                lease_left: Duration::ZERO,
            });
        }
        if let Some(old) = record {
            self.revoke(old.lease).await;
        }
        let fence = reply.header().map(|h| h.revision());
        match fence.and_then(|r| u64::try_from(r).ok()).filter(|&r| r > 0) {
            Some(fence) => Ok(Begin::Started {
                token: Token::new(id, fence),
                attempt,
                after,
            }),
            None => Err(Self::bad_reply(Call::ClaimBegin, endpoint, "no revision")),
        }
    }

    async fn extend_inner(
        &self,
        key: &str,
        token: &Token,
        lease: Ttl,
    ) -> Result<Renewal, EtcdError> {
        checked_key(key)?;
        let Ok(fence) = i64::try_from(token.fence()) else {
            return Ok(Renewal::Lost);
        };
        let run = lease_key(key);
        let new_lease = self.grant_lease(lease).await?;
        let txn = Txn::new()
            .when([
                Compare::create_revision(run.as_str(), CompareOp::Equal, fence),
                Compare::value(run.as_str(), CompareOp::Equal, hex(token.id())),
            ])
            .and_then([
                TxnOp::put(
                    run.as_str(),
                    hex(token.id()),
                    Some(PutOptions::new().with_lease(new_lease).with_prev_key()),
                ),
                TxnOp::get(key, None),
            ]);
        // On an error the new lease is kept, as a lock's renewal keeps it.
        let (reply, _) = self.txn(Call::ClaimExtend, txn).await?;
        if !reply.succeeded() {
            self.revoke(new_lease).await;
            return Ok(Renewal::Lost);
        }
        if let Some(old) = kvs(&reply, 0).and_then(|kv| kv.first())
            && old.lease != new_lease
        {
            self.revoke(old.lease).await;
        }
        // The record must outlive the lease: its own lease starts over.
        if let Some(record) = kvs(&reply, 1).and_then(|kv| kv.first()) {
            let keep_lease = record.lease;
            self.request(Call::LeaseKeepAlive, |mut c| async move {
                let (mut keeper, mut answers) = c.lease_keep_alive(keep_lease).await?;
                keeper.keep_alive().await?;
                answers.message().await.map(drop)
            })
            .await?;
        }
        Ok(Renewal::Held)
    }

    async fn settle_inner(
        &self,
        key: &str,
        token: &Token,
        keep: Ttl,
        state: u8,
        result: &[u8],
    ) -> Result<Settled, EtcdError> {
        checked_key(key)?;
        let Ok(fence) = i64::try_from(token.fence()) else {
            return Ok(Settled::Superseded);
        };
        let (record, _, endpoint) = self.read_claim(key).await?;
        // Written by this attempt's begin and by nothing since.
        let Some(record) = record.filter(|kv| kv.mod_revision == fence) else {
            return Ok(Settled::Superseded);
        };
        let attempt = match Record::parse(&record.value) {
            Some(r) if r.state == b'r' && r.token == hex(token.id()).as_bytes() => r.attempt,
            // Another token's attempt with this fence: not ours.
            Some(_) => return Ok(Settled::Superseded),
            None => return Err(Self::bad_record(endpoint, key, &record.value)),
        };
        let keep_lease = self.grant_lease(keep).await?;
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, fence)])
            .and_then([
                TxnOp::put(
                    key,
                    Record::encode(state, attempt, token.id(), result),
                    Some(PutOptions::new().with_lease(keep_lease)),
                ),
                TxnOp::delete(lease_key(key), Some(DeleteOptions::new().with_prev_key())),
            ]);
        let (reply, _) = match self.txn(Call::ClaimSettle, txn).await {
            Ok(reply) => reply,
            Err(e) => {
                self.revoke(keep_lease).await;
                return Err(e);
            }
        };
        if !reply.succeeded() {
            self.revoke(keep_lease).await;
            return Ok(Settled::Superseded);
        }
        self.revoke(record.lease).await;
        if let Some(run) = kvs(&reply, 1).and_then(|kv| kv.first()) {
            self.revoke(run.lease).await;
        }
        Ok(Settled::Recorded)
    }
}

impl SendClaimStore for EtcdLocker {
    type Error = EtcdError;

    async fn try_begin(
        &self,
        key: &str,
        lease: Ttl,
        keep: Ttl,
        result: &mut [u8],
    ) -> Result<Begin, EtcdError> {
        on_tokio(self.begin_inner(key, lease, keep, result)).await
    }

    async fn extend(&self, key: &str, token: &Token, lease: Ttl) -> Result<Renewal, EtcdError> {
        on_tokio(self.extend_inner(key, token, lease)).await
    }

    async fn complete(
        &self,
        key: &str,
        token: &Token,
        keep: Ttl,
        result: &[u8],
    ) -> Result<Settled, EtcdError> {
        on_tokio(self.settle_inner(key, token, keep, b'd', result)).await
    }

    async fn fail(&self, key: &str, token: &Token, keep: Ttl) -> Result<Settled, EtcdError> {
        on_tokio(self.settle_inner(key, token, keep, b'f', &[])).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_its_result_whatever_bytes_it_holds() {
        let id = TokenId([0xab; 16]);
        let value = Record::encode(b'd', 7, &id, b"a:b\x00\xff");
        let record = Record::parse(&value).expect("parsed");
        assert_eq!(
            (record.state, record.attempt, record.token, record.result),
            (b'd', 7, hex(&id).as_bytes(), &b"a:b\x00\xff"[..])
        );
        for bad in [&b""[..], b"x:1:t:", b"r:one:t:", b"r:1:t", b"rr:1:t:"] {
            assert!(Record::parse(bad).is_none(), "{bad:?}");
        }
    }
}

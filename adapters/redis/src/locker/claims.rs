//! `RedisLocker` as a [`ClaimStore`](guard_core::claim::ClaimStore): the
//! layout and scripts of [`guard_core::claim::redis`], on the locker's
//! connection and prefix.

use std::time::Duration;

use guard_core::claim::redis::{BEGIN_SCRIPT, DONE, EXTEND_SCRIPT, FAILED, SETTLE_SCRIPT};
use guard_core::claim::{Begin, SendClaimStore, Settled, Start};
use guard_core::lock::{Renewal, Token, TokenId, Ttl};
use redis::{Script, Value};

use super::{RedisLocker, lock_keys};
use crate::error::RedisGuardError;

/// The claim scripts, loaded once per locker.
pub(super) struct Scripts {
    begin: Script,
    extend: Script,
    settle: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        Scripts {
            begin: Script::new(BEGIN_SCRIPT),
            extend: Script::new(EXTEND_SCRIPT),
            settle: Script::new(SETTLE_SCRIPT),
        }
    }
}

fn unexpected(what: &str, reply: &[Value]) -> RedisGuardError {
    RedisGuardError::UnexpectedReply(format!("claim {what}: {reply:?}"))
}

fn int(value: Option<&Value>) -> Option<i64> {
    match value? {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

/// Reads BEGIN's reply (see [`BEGIN_SCRIPT`]).
fn begun(reply: &[Value], id: TokenId, result: &mut [u8]) -> Result<Begin, RedisGuardError> {
    match int(reply.first()) {
        Some(1) => {
            let fence = int(reply.get(1)).and_then(|f| u64::try_from(f).ok());
            let attempt = int(reply.get(2)).and_then(|n| u32::try_from(n).ok());
            let after = match int(reply.get(3)) {
                Some(0) => Some(Start::Fresh),
                Some(1) => Some(Start::AfterFailure),
                Some(2) => Some(Start::AfterExpiry),
                _ => None,
            };
            match (fence, attempt, after) {
                (Some(fence), Some(attempt), Some(after)) if fence > 0 && attempt > 0 => {
                    Ok(Begin::Started {
                        token: Token::new(id, fence),
                        attempt,
                        after,
                    })
                }
                _ => Err(unexpected("begin", reply)),
            }
        }
        Some(2) => match int(reply.get(1)).and_then(|ms| u64::try_from(ms).ok()) {
            Some(ms) => Ok(Begin::Running {
                lease_left: Duration::from_millis(ms),
            }),
            None => Err(unexpected("begin", reply)),
        },
        Some(3) => {
            let stored: &[u8] = match reply.get(1) {
                Some(Value::BulkString(bytes)) => bytes,
                Some(Value::SimpleString(s)) => s.as_bytes(),
                _ => return Err(unexpected("begin", reply)),
            };
            Ok(Begin::done_with(stored, result))
        }
        _ => Err(unexpected("begin", reply)),
    }
}

impl RedisLocker {
    async fn settle(
        &self,
        key: &str,
        token: &Token,
        keep: Ttl,
        state: &str,
        result: &[u8],
    ) -> Result<Settled, RedisGuardError> {
        let (record, _) = lock_keys(&self.prefix, key)?;
        let mut invocation = self.claims.settle.prepare_invoke();
        invocation
            .key(&record)
            .arg(Self::hex(token.id()))
            .arg(keep.as_millis_ceil())
            .arg(state)
            .arg(result);
        let recorded: i64 = self.conn.invoke(&invocation).await?;
        Ok(if recorded == 1 {
            Settled::Recorded
        } else {
            Settled::Superseded
        })
    }
}

/// Claim records beside the locks, on the same connection and prefix
/// (see [`guard_core::claim::redis`] for the layout): a record and its
/// fence counter share a hash slot, so each call is one script on a
/// cluster too, and leases run on the server's clock.
impl SendClaimStore for RedisLocker {
    type Error = RedisGuardError;

    async fn try_begin(
        &self,
        key: &str,
        lease: Ttl,
        keep: Ttl,
        result: &mut [u8],
    ) -> Result<Begin, RedisGuardError> {
        let (record, fence) = lock_keys(&self.prefix, key)?;
        let id = self.ids.next_id();
        let mut invocation = self.claims.begin.prepare_invoke();
        invocation
            .key(&record)
            .key(&fence)
            .arg(Self::hex(&id))
            .arg(lease.as_millis_ceil())
            .arg(keep.as_millis_ceil());
        let reply: Vec<Value> = self.conn.invoke(&invocation).await?;
        begun(&reply, id, result)
    }

    async fn extend(
        &self,
        key: &str,
        token: &Token,
        lease: Ttl,
    ) -> Result<Renewal, RedisGuardError> {
        let (record, _) = lock_keys(&self.prefix, key)?;
        let mut invocation = self.claims.extend.prepare_invoke();
        invocation
            .key(&record)
            .arg(Self::hex(token.id()))
            .arg(lease.as_millis_ceil());
        let extended: i64 = self.conn.invoke(&invocation).await?;
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
    ) -> Result<Settled, RedisGuardError> {
        self.settle(key, token, keep, DONE, result).await
    }

    async fn fail(&self, key: &str, token: &Token, keep: Ttl) -> Result<Settled, RedisGuardError> {
        self.settle(key, token, keep, FAILED, &[]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_the_scripts_never_give_is_an_error_naming_it() {
        let id = TokenId([1; 16]);
        for reply in [
            vec![],
            vec![Value::Int(9)],
            vec![Value::Int(1), Value::Int(0), Value::Int(1), Value::Int(0)],
            vec![Value::Int(1), Value::Int(5), Value::Int(1), Value::Int(7)],
            vec![Value::Int(2), Value::Int(-1)],
            vec![Value::Int(3), Value::Int(4)],
        ] {
            let error = begun(&reply, id, &mut []).expect_err("refused");
            assert!(error.to_string().contains("claim begin"), "{error}");
        }
    }

    #[test]
    fn a_done_reply_fills_the_buffer_and_gives_the_whole_length() {
        let reply = [Value::Int(3), Value::BulkString(b"abcdef".to_vec())];
        let mut buffer = [0u8; 4];
        assert_eq!(
            begun(&reply, TokenId([1; 16]), &mut buffer).unwrap(),
            Begin::Done { result_len: 6 }
        );
        assert_eq!(&buffer, b"abcd");
    }
}

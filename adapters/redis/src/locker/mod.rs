//! A fenced lock service on Redis, and a claim store and a semaphore
//! beside it.

mod claims;
mod semaphore;

use std::fmt;
use std::time::Duration;

use guard_core::lock::redis::{
    ACQUIRE_SCRIPT as ACQUIRE, InvalidRedisKey, RELEASE_SCRIPT as RELEASE, RENEW_SCRIPT as RENEW,
    RedisKeys, check_prefix,
};
use guard_core::lock::{Renewal, SendLeaseRenewer, SendLocker, Token, TokenId, Ttl, UnlockError};
use guard_std::TokenIds;
use redis::Script;

use crate::connection::RedisConnection;
use crate::error::{Parameter, RedisGuardError};

/// The Redis keys of lock `key`: `(lock, fence counter)`, as laid out by
/// [`guard_core::lock::redis`] (shared with the embedded locker), under
/// `prefix` as [`RedisLocker::with_prefix`] takes it (trimmed, a `:`
/// appended if missing): the keys a locker with that prefix uses.
///
/// A key or prefix guard-core refuses is
/// [`RedisGuardError::InvalidInput`] naming the key (or the prefix, when
/// the prefix is at fault), with guard-core's [`InvalidRedisKey`] as its
/// source.
pub fn lock_keys(prefix: &str, key: &str) -> Result<(String, String), RedisGuardError> {
    // A prefix is refused as it was given, before the `:` is appended.
    check_prefix(prefix.trim())
        .map_err(|e| RedisGuardError::refused_by(Parameter::LockerPrefix, prefix.trim(), e))?;
    let prefix = stored_prefix(prefix);
    let keys = redis_keys(&prefix, key)?;
    Ok((keys.lock().to_string(), keys.fence().to_string()))
}

/// `prefix` as keys carry it: trimmed, a `:` appended unless it is blank
/// or ends with one (as the original's prefix wrapper did).
fn stored_prefix(prefix: &str) -> String {
    let prefix = prefix.trim();
    if prefix.is_empty() || prefix.ends_with(':') {
        prefix.to_owned()
    } else {
        format!("{prefix}:")
    }
}

/// The Redis keys of `key` under `prefix`, or the error naming which of
/// the two is refused.
fn redis_keys<'a>(prefix: &'a str, key: &'a str) -> Result<RedisKeys<'a>, RedisGuardError> {
    RedisKeys::new(prefix, key).map_err(|e| match e {
        InvalidRedisKey::BraceInPrefix => {
            RedisGuardError::refused_by(Parameter::LockerPrefix, prefix, e)
        }
        _ => RedisGuardError::refused_by(Parameter::LockKey, key, e),
    })
}

/// A `Locker` and `LeaseRenewer` on Redis, with fencing (see
/// [`lock_keys`] for the key layout).
///
/// Works on standalone, sentinel and cluster deployments alike. The lock
/// is `SET NX PX` with the token's 32 hex digits as value; the fence is
/// `INCR` of the domain's counter in the same script. An optional prefix
/// namespaces an environment (`prod1:`); renewal is always supported, so
/// a prefix can never make a renewing locker look renew-less or the
/// opposite.
///
/// It is also a [`ClaimStore`](guard_core::claim::ClaimStore) and a
/// [`Semaphore`](guard_core::semaphore::Semaphore), beside the locks.
pub struct RedisLocker {
    conn: RedisConnection,
    prefix: String,
    /// Whether a domain without its fence counter waits one TTL before
    /// its first grant ([`with_quarantine`](Self::with_quarantine)).
    quarantine: bool,
    /// Replicas that must acknowledge a grant or renewal, and within how
    /// many milliseconds ([`with_replica_acks`](Self::with_replica_acks)).
    replica_acks: Option<(u32, u64)>,
    ids: TokenIds,
    acquire: Script,
    release: Script,
    renew: Script,
    claims: claims::Scripts,
    semaphore: semaphore::Scripts,
}

impl fmt::Debug for RedisLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLocker")
            .field("conn", &self.conn)
            .field("prefix", &self.prefix)
            .field("quarantine", &self.quarantine)
            .field("replica_acks", &self.replica_acks)
            .finish()
    }
}

impl RedisLocker {
    /// A locker on `conn` with no key prefix.
    pub fn new(conn: RedisConnection) -> Self {
        RedisLocker {
            conn,
            prefix: String::new(),
            quarantine: false,
            replica_acks: None,
            ids: TokenIds::new(),
            acquire: Script::new(ACQUIRE),
            release: Script::new(RELEASE),
            renew: Script::new(RENEW),
            claims: claims::Scripts::new(),
            semaphore: semaphore::Scripts::new(),
        }
    }

    /// Prefixes every Redis key with `prefix` (a `:` is appended if
    /// missing, as the original's prefix wrapper did); blank means none.
    /// A prefix with `{` or `}` is refused: it would put a lock and its
    /// fence counter in different cluster slots.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, RedisGuardError> {
        check_prefix(prefix.trim())
            .map_err(|e| RedisGuardError::refused_by(Parameter::LockerPrefix, prefix.trim(), e))?;
        self.prefix = stored_prefix(prefix);
        Ok(self)
    }

    /// With `on`, an acquisition in a domain whose fence counter is gone
    /// (the store lost its data: a `FLUSHALL`, a restart without
    /// persistence, a failover to a replica that never had it; or the
    /// domain never granted) grants nothing for one TTL, so that no holder
    /// the lost store had granted can still believe its lease when the
    /// next one is granted (see [`guard_core::lock::redis`], "A lost store
    /// waits one TTL"). The cost: one TTL without a holder then, and before
    /// a new domain's first grant. Every caller of a domain must ask for
    /// the same TTL. Off unless set.
    pub fn with_quarantine(mut self, on: bool) -> Self {
        self.quarantine = on;
        self
    }

    /// A grant counts only once `replicas` replicas acknowledged it within
    /// `within` (`WAIT`, after the script, on its connection): one that is
    /// not acknowledged in time is released and answered as not granted,
    /// and a renewal that is not is an error
    /// ([`RedisGuardError::NotAcknowledged`]), so the holder keeps its
    /// earlier deadline. A failover to a replica that acknowledged never
    /// grants again what it granted. For Sentinel and Cluster deployments,
    /// whose failovers otherwise lose the writes their replica had not
    /// received. The cost: every grant and renewal waits for a replica
    /// (at most `within`), and nothing is granted while fewer replicas
    /// than asked answer. `within` must be at least 1 ms and shorter than
    /// the connection's request timeout, which bounds the whole request.
    pub fn with_replica_acks(
        mut self,
        replicas: u32,
        within: Duration,
    ) -> Result<Self, RedisGuardError> {
        let ms = u64::try_from(within.as_millis()).unwrap_or(u64::MAX);
        if replicas == 0 || ms == 0 || within >= self.conn.timeout() {
            return Err(RedisGuardError::invalid(
                Parameter::ReplicaAcks,
                format!("{replicas} within {within:?}"),
                format!(
                    "at least 1 replica, within at least 1 ms and less than the request timeout ({:?})",
                    self.conn.timeout()
                ),
            ));
        }
        self.replica_acks = Some((replicas, ms));
        Ok(self)
    }

    /// The acquire script (KEYS: lock, fence, grant record, quarantine
    /// record; ARGV: token, TTL in ms, `1` for the quarantine),
    /// e.g. to load it into `redis-benchmark` for a side-by-side
    /// measurement.
    pub fn acquire_script_source() -> &'static str {
        ACQUIRE
    }

    /// The connection.
    pub fn connection(&self) -> &RedisConnection {
        &self.conn
    }

    fn hex(id: &TokenId) -> String {
        id.to_string()
    }
}

impl SendLocker for RedisLocker {
    type Error = RedisGuardError;

    fn is_invalid_input(error: &RedisGuardError) -> bool {
        matches!(error, RedisGuardError::InvalidInput { .. })
    }

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, RedisGuardError> {
        let keys = redis_keys(&self.prefix, key)?;
        let id = self.ids.next_id();
        let mut invocation = self.acquire.prepare_invoke();
        invocation
            .key(keys.lock().to_string())
            .key(keys.fence().to_string())
            .key(keys.grant().to_string())
            .arg(Self::hex(&id))
            .arg(ttl.as_millis_ceil());
        if self.quarantine {
            invocation.key(keys.quarantine().to_string()).arg("1");
        }
        let Some((replicas, within_ms)) = self.replica_acks else {
            let fence: i64 = self.conn.invoke(&invocation).await?;
            return Ok(granted(id, fence));
        };
        let (fence, acked): (i64, u32) = self
            .conn
            .invoke_acknowledged(&self.acquire, &invocation, replicas, within_ms)
            .await?;
        let Some(token) = granted(id, fence) else {
            return Ok(None);
        };
        if acked >= replicas {
            return Ok(Some(token));
        }
        // A failover could lose this grant and give the key again: it
        // does not count. Released, so the key is free at once; a release
        // that fails leaves it to its TTL, held by nobody.
        tracing::warn!(
            "lock {key}: granted, but {acked} of {replicas} replica(s) acknowledged within {within_ms} ms: released, not granted"
        );
        if let Err(e) = SendLocker::unlock(self, key, &token).await {
            tracing::warn!(
                "lock {key}: the unacknowledged grant was not released ({e}); it ends with its TTL"
            );
        }
        Ok(None)
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<RedisGuardError>> {
        let keys = redis_keys(&self.prefix, key).map_err(UnlockError::Backend)?;
        let mut invocation = self.release.prepare_invoke();
        invocation
            .key(keys.lock().to_string())
            .key(keys.grant().to_string())
            .arg(Self::hex(token.id()));
        match self.conn.invoke::<i64>(&invocation).await {
            Ok(1) => Ok(()),
            Ok(_) => Err(UnlockError::NotHeld),
            Err(e) => Err(UnlockError::Backend(e)),
        }
    }
}

/// The token for `id` if the acquire script's `reply` is a fence; held,
/// a grant that may still be believed (the lock key gone before the
/// grant's end) and a quarantine are refused all the same.
fn granted(id: TokenId, reply: i64) -> Option<Token> {
    (reply > 0).then(|| Token::new(id, reply.unsigned_abs()))
}

/// The fence counter of `key`'s domain: every lock of the domain draws
/// from it, so it is at least `key`'s last fence (exactly it when the
/// domain holds one key); `None` when it is gone (never granted, or lost
/// with the store's data).
impl guard_std::LastFence for RedisLocker {
    type Error = RedisGuardError;

    async fn last_fence(&self, key: &str) -> Result<Option<u64>, RedisGuardError> {
        let keys = redis_keys(&self.prefix, key)?;
        let mut cmd = redis::cmd("GET");
        cmd.arg(keys.fence().to_string());
        let counter: Option<String> = self.conn.query(&cmd).await?;
        counter
            .map(|text| {
                text.parse::<u64>().map_err(|_| {
                    RedisGuardError::UnexpectedReply(format!(
                        "fence counter {}: {text:?} is not a fence",
                        keys.fence()
                    ))
                })
            })
            .transpose()
    }
}

impl SendLeaseRenewer for RedisLocker {
    async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, RedisGuardError> {
        let keys = redis_keys(&self.prefix, key)?;
        let mut invocation = self.renew.prepare_invoke();
        invocation
            .key(keys.lock().to_string())
            .key(keys.grant().to_string())
            .arg(Self::hex(token.id()))
            .arg(ttl.as_millis_ceil());
        let renewed: i64 = match self.replica_acks {
            None => self.conn.invoke(&invocation).await?,
            Some((replicas, within_ms)) => {
                let (renewed, acked): (i64, u32) = self
                    .conn
                    .invoke_acknowledged(&self.renew, &invocation, replicas, within_ms)
                    .await?;
                // An extension a failover could lose is no extension: the
                // holder keeps its earlier deadline.
                if renewed == 1 && acked < replicas {
                    return Err(RedisGuardError::NotAcknowledged {
                        wanted: replicas,
                        acked,
                    });
                }
                renewed
            }
        };
        Ok(if renewed == 1 {
            Renewal::Held
        } else {
            Renewal::Lost
        })
    }
}

guard_std::impl_dyn_locker!(RedisLocker);

//! A local cache in front of a Redis token bucket: guard-core's
//! [`batch`](guard_core::limit::batch) on [`RedisTokenBucket`].

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use guard_core::limit::batch::{BatchSize, LocalTokens};
use guard_core::limit::{Decision, Tokens};
use guard_core::time::Instant;

use super::{Clock, RedisBucket, RedisTokenBucket, checked_cost, checked_key};
use crate::error::RedisGuardError;

/// One key's batch on this replica.
struct Local {
    tokens: LocalTokens,
    /// Until when (nanoseconds on the replica's clock) the shared bucket
    /// said it has no token: refused here without asking again.
    refused_until: AtomicU64,
    /// The size of the next batch, and when the batch being spent was
    /// taken. Held only by the caller with the refill turn.
    sizing: Mutex<(BatchSize, Instant)>,
}

/// A token bucket on Redis with a local cache per replica: each replica
/// takes tokens of a key from the shared bucket in batches
/// ([`RedisTokenBucket::take_up_to`], one round trip a batch) and admits
/// locally, with one compare-and-swap, until its batch runs out. The batch
/// adapts to the replica's share of the key's traffic (guard-core's
/// [`BatchSize`]: meant to last `target`, from `min` to `max` tokens).
///
/// **The bound.** Every token admitted was taken from the shared bucket
/// first, so over any window all replicas together admit at most the
/// bucket's own budget plus one batch (`max`) per replica. A refusal is
/// kept too: once the shared bucket says when its next token comes, the
/// replica refuses the key locally until then. A replica's
/// unspent batch is kept from the others until spent (as many fewer
/// admitted, at most). A replica takes one batch of a key at a time: a
/// caller that finds the batch spent while another caller of the replica
/// is taking the next one is decided by the shared bucket directly.
///
/// Keys share the bucket's keys with [`RedisTokenBucket`]: replicas with
/// and without the cache limit one key together. At most `max_keys` keys
/// are cached per replica; a key beyond is decided by the shared bucket
/// directly (memory stays bounded), as is a cost above the largest batch. Decisions are on the Redis server's
/// clock; a local decision says only admitted or refused (no report: the
/// shared bucket's count is not read for it).
pub struct RedisBatchedBucket {
    remote: RedisTokenBucket,
    sizing: BatchSize,
    max_keys: usize,
    keys: RwLock<HashMap<String, Arc<Local>>>,
    /// The origin of the local clock the batch sizes are timed on.
    origin: std::time::Instant,
}

impl fmt::Debug for RedisBatchedBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBatchedBucket")
            .field("remote", &self.remote)
            .field("sizing", &self.sizing)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl RedisBatchedBucket {
    /// A cache of up to `max_keys` keys in front of `remote`, batches
    /// sized by `sizing`.
    pub fn new(remote: RedisBucket<Tokens>, sizing: BatchSize, max_keys: usize) -> Self {
        RedisBatchedBucket {
            remote,
            sizing,
            max_keys,
            keys: RwLock::new(HashMap::new()),
            origin: std::time::Instant::now(),
        }
    }

    /// The shared bucket.
    pub fn remote(&self) -> &RedisTokenBucket {
        &self.remote
    }

    /// Keys cached on this replica now.
    pub fn cached_keys(&self) -> usize {
        self.keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn now(&self) -> Instant {
        let nanos = self.origin.elapsed().as_nanos();
        Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// `key`'s batch, made if it is new and there is room.
    fn local(&self, key: &str) -> Option<Arc<Local>> {
        if let Some(local) = self
            .keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
        {
            return Some(Arc::clone(local));
        }
        let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(local) = keys.get(key) {
            return Some(Arc::clone(local));
        }
        if keys.len() >= self.max_keys {
            return None;
        }
        let local = Arc::new(Local {
            tokens: LocalTokens::new(),
            refused_until: AtomicU64::new(0),
            sizing: Mutex::new((self.sizing, self.now())),
        });
        keys.insert(key.to_owned(), Arc::clone(&local));
        Some(local)
    }

    /// Decides one request for `key`.
    pub async fn check(&self, key: &str) -> Result<Decision, RedisGuardError> {
        self.check_n(key, 1).await
    }

    /// Decides a request of `cost` tokens for `key`: locally while the
    /// replica's batch holds them, else with one round trip (a new batch,
    /// or the shared bucket's own decision). A cost above the capacity is
    /// refused before anything is sent.
    pub async fn check_n(&self, key: &str, cost: u32) -> Result<Decision, RedisGuardError> {
        checked_cost(cost, self.remote.bucket().capacity())?;
        // A key the shared bucket would refuse takes no place in the cache.
        checked_key(key)?;
        // A cost above the largest batch, or a key beyond `max_keys`: the
        // shared bucket decides it directly.
        let local = match self.local(key) {
            Some(local) if cost <= self.sizing.max() => local,
            _ => {
                let report = self.remote.check_n(key, cost, Clock::Server).await?;
                return Ok(report.decision);
            }
        };
        if local.tokens.try_spend(cost) {
            return Ok(Decision::Allowed);
        }
        // The shared bucket said when its next token comes: refused here
        // until then, with no round trip (a refusal is never an admission,
        // so the bound holds).
        let now = self.now().as_nanos();
        let until = local.refused_until.load(Ordering::Acquire);
        if now < until {
            return Ok(Decision::Denied {
                retry_after: Duration::from_nanos(until - now),
            });
        }
        if !local.tokens.begin_refill() {
            // Another caller of this replica is taking the next batch.
            return Ok(self
                .remote
                .check_n(key, cost, Clock::Server)
                .await?
                .decision);
        }
        let want = {
            let sizing = local.sizing.lock().unwrap_or_else(PoisonError::into_inner);
            sizing.0.next().max(cost)
        };
        let taken = match self.remote.take_up_to(key, want, Clock::Server).await {
            Ok(taken) => taken,
            Err(e) => {
                local.tokens.end_refill(0);
                return Err(e);
            }
        };
        {
            let now = self.now();
            let mut sizing = local.sizing.lock().unwrap_or_else(PoisonError::into_inner);
            let (size, taken_at) = &mut *sizing;
            if taken.granted < want {
                size.on_short(taken.granted);
            } else {
                size.on_spent(*taken_at, now);
            }
            *taken_at = now;
        }
        if taken.granted >= cost {
            // This caller's tokens come out of the batch before anyone
            // else can spend them.
            local.tokens.end_refill(taken.granted.saturating_sub(cost));
            return Ok(Decision::Allowed);
        }
        let retry_after = taken.retry_after.unwrap_or(Duration::from_micros(1));
        if taken.granted == 0 {
            let until = self.now().saturating_add(retry_after).as_nanos();
            local.refused_until.store(until, Ordering::Release);
        }
        local.tokens.end_refill(taken.granted);
        Ok(Decision::Denied { retry_after })
    }
}

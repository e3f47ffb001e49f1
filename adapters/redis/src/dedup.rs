//! Deduplicators on Redis, atomic across processes.
//!
//! Every `check_and_mark` is one script, so concurrent clients can never
//! both see an item as new. `Ok(true)` means duplicate, `Ok(false)` new and
//! now marked (the original's convention).

use std::fmt;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use guard_core::dedup::{BloomParams, SecretHashState};
use guard_core::lock::TokenId;
use redis::Script;

use crate::connection::RedisConnection;
use crate::error::{Parameter, RedisGuardError};
use crate::limit::Clock;

/// The "seen log": a sorted set of items scored by when they count from.
/// ARGV: now (µs, '' = server time), op, window (µs, 0 = forever),
/// refresh (1: score is last seen; 0: score is first seen), backstop (ms,
/// 0 = none), item. Ops: 'check', 'mark', 'cam' (check and mark), 'count'.
const SEEN: &str = r"
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local op, window, refresh, backstop, item = ARGV[2], tonumber(ARGV[3]), ARGV[4] == '1', tonumber(ARGV[5]), ARGV[6]
-- A missing member reads as false (Redis maps a nil reply to false).
local function live(score)
  if not score then return false end
  return window == 0 or now - tonumber(score) < window
end
if op == 'check' then
  return live(redis.call('ZSCORE', KEYS[1], item)) and 1 or 0
end
-- Items whose time is over are pruned: an item exactly `window` old is
-- no longer a duplicate (open boundary).
if window > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - window))
end
if op == 'count' then
  return redis.call('ZCARD', KEYS[1])
end
local stamp = string.format('%.0f', now)
local duplicate = 0
if redis.call('ZADD', KEYS[1], 'NX', stamp, item) == 0 then
  duplicate = 1
  -- Last-seen refresh never moves an item's time backwards.
  if refresh then redis.call('ZADD', KEYS[1], 'GT', stamp, item) end
end
if backstop > 0 then redis.call('PEXPIRE', KEYS[1], backstop) end
if op == 'mark' then return 0 end
return duplicate
";

/// How a seen log scores and forgets items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scoring {
    /// Exact: first sight, forgotten `ttl` later (or never).
    FirstSeen { ttl_us: u64 },
    /// Windowed: last sight, forgotten `window` after it.
    LastSeen { window_us: u64 },
}

/// The margin of the windowed deduplicator's backstop TTL on its whole key
/// (the original's 60 s): a key nobody writes disappears by itself.
pub const BACKSTOP_MARGIN: Duration = Duration::from_secs(60);

fn micros(parameter: Parameter, d: Duration) -> Result<u64, RedisGuardError> {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    if us == 0 || us >= 1 << 53 {
        return Err(RedisGuardError::invalid(
            parameter,
            format!("{d:?}"),
            "must be between 1 µs and 2^53 µs",
        ));
    }
    Ok(us)
}

fn checked_name(name: &str) -> Result<String, RedisGuardError> {
    if name.is_empty() || name.contains(['{', '}']) {
        return Err(RedisGuardError::invalid(
            Parameter::DeduplicatorName,
            name,
            "must be non-empty and without braces",
        ));
    }
    Ok(format!("{{{name}}}"))
}

/// The shared engine of [`RedisSetDeduplicator`] and
/// [`RedisWindowedDeduplicator`].
struct SeenLog {
    conn: RedisConnection,
    key: String,
    scoring: Scoring,
    script: Script,
}

impl SeenLog {
    async fn run(&self, op: &str, item: &str, clock: Clock) -> Result<i64, RedisGuardError> {
        let (window, refresh, backstop) = match self.scoring {
            Scoring::FirstSeen { ttl_us } => (ttl_us, false, 0u128),
            Scoring::LastSeen { window_us } => (
                window_us,
                true,
                (Duration::from_micros(window_us) + BACKSTOP_MARGIN).as_millis(),
            ),
        };
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(&self.key)
            .arg(clock_arg(clock))
            .arg(op)
            .arg(window)
            .arg(if refresh { "1" } else { "0" })
            .arg(u64::try_from(backstop).unwrap_or(u64::MAX))
            .arg(item);
        self.conn.invoke(&invocation).await
    }

    async fn clear(&self) -> Result<(), RedisGuardError> {
        self.conn
            .query::<i64>(redis::cmd("DEL").arg(&self.key))
            .await
            .map(|_| ())
    }
}

fn clock_arg(clock: Clock) -> String {
    match clock {
        Clock::Caller(now) => (now.as_nanos() / 1_000).to_string(),
        Clock::Server => String::new(),
    }
}

macro_rules! seen_log_api {
    () => {
        /// Whether `item` counts as seen; changes nothing.
        pub async fn is_duplicate(
            &self,
            item: &str,
            clock: Clock,
        ) -> Result<bool, RedisGuardError> {
            Ok(self.log.run("check", item, clock).await? == 1)
        }

        /// Remembers `item` as seen.
        pub async fn mark_as_seen(&self, item: &str, clock: Clock) -> Result<(), RedisGuardError> {
            self.log.run("mark", item, clock).await.map(|_| ())
        }

        /// In one atomic step: `true` if `item` is a duplicate, `false` if
        /// it is new and now marked.
        pub async fn check_and_mark(
            &self,
            item: &str,
            clock: Clock,
        ) -> Result<bool, RedisGuardError> {
            Ok(self.log.run("cam", item, clock).await? == 1)
        }

        /// Distinct items that count as seen.
        pub async fn unique_count(&self, clock: Clock) -> Result<u64, RedisGuardError> {
            let n = self.log.run("count", "", clock).await?;
            Ok(u64::try_from(n).unwrap_or(0))
        }

        /// Forgets everything.
        pub async fn clear(&self) -> Result<(), RedisGuardError> {
            self.log.clear().await
        }

        /// The Redis key.
        pub fn redis_key(&self) -> &str {
            &self.log.key
        }
    };
}

/// Exact deduplication: every item is remembered from its first sight,
/// for `ttl` if one is given (the original's set grew forever).
///
/// Stored as a sorted set `<prefix>:{<name>}` scored by first sight.
pub struct RedisSetDeduplicator {
    log: SeenLog,
}

impl fmt::Debug for RedisSetDeduplicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSetDeduplicator")
            .field("key", &self.log.key)
            .finish()
    }
}

impl RedisSetDeduplicator {
    /// Remembers items under `<prefix>:{<name>}`, forever or for `ttl`.
    pub fn new(
        conn: RedisConnection,
        prefix: &str,
        name: &str,
        ttl: Option<Duration>,
    ) -> Result<Self, RedisGuardError> {
        let ttl_us = match ttl {
            Some(ttl) => micros(Parameter::DedupTtl, ttl)?,
            None => 0,
        };
        Ok(RedisSetDeduplicator {
            log: SeenLog {
                conn,
                key: format!("{prefix}:{}", checked_name(name)?),
                scoring: Scoring::FirstSeen { ttl_us },
                script: Script::new(SEEN),
            },
        })
    }

    seen_log_api!();
}

/// Time-windowed deduplication: an item seen again within `window` of its
/// **last** sight is a duplicate, and its window restarts; an item exactly
/// `window` old is not. Pruning happens in the same script as each write,
/// and the whole key carries a backstop TTL of `window + 60 s`.
pub struct RedisWindowedDeduplicator {
    log: SeenLog,
}

impl fmt::Debug for RedisWindowedDeduplicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisWindowedDeduplicator")
            .field("key", &self.log.key)
            .finish()
    }
}

impl RedisWindowedDeduplicator {
    /// Remembers items under `<prefix>:{<name>}` for `window` after they
    /// were last seen.
    pub fn new(
        conn: RedisConnection,
        prefix: &str,
        name: &str,
        window: Duration,
    ) -> Result<Self, RedisGuardError> {
        Ok(RedisWindowedDeduplicator {
            log: SeenLog {
                conn,
                key: format!("{prefix}:{}", checked_name(name)?),
                scoring: Scoring::LastSeen {
                    window_us: micros(Parameter::DedupWindow, window)?,
                },
                script: Script::new(SEEN),
            },
        })
    }

    seen_log_api!();
}

/// Test and set every bit; count the item if any bit was new.
/// KEYS[1] bits, KEYS[2] count. ARGV: 'check' or 'cam', then positions.
const BLOOM: &str = r"
local fresh = false
for i = 2, #ARGV do
  if redis.call('GETBIT', KEYS[1], ARGV[i]) == 0 then fresh = true break end
end
if ARGV[1] == 'check' then return fresh and 0 or 1 end
if not fresh then return 1 end
for i = 2, #ARGV do redis.call('SETBIT', KEYS[1], ARGV[i], 1) end
redis.call('INCR', KEYS[2])
return 0
";

/// The filter's secret, created if missing, in one step. KEYS[1] the
/// secret, KEYS[2] the bits. ARGV[1] a fresh secret (32 hex digits).
/// Returns the secret, or `false` for a filter written before secrets
/// were kept (bits without a secret: read as it was written).
const SECRET: &str = r"
local secret = redis.call('GET', KEYS[1])
if secret then return secret end
if redis.call('EXISTS', KEYS[2]) == 1 then return false end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
";

/// How a filter's items become bit positions.
#[derive(Clone, Copy, Debug)]
enum Hashing {
    /// SipHash-1-3 under the filter's secret: no outsider can craft items
    /// that fill another item's bits.
    Keyed(SecretHashState),
    /// The fixed FNV hash of a filter written before secrets were kept,
    /// so its marks stay readable; [`RedisBloomDeduplicator::clear`]
    /// starts it again keyed.
    Unkeyed,
}

/// A Bloom filter in a Redis string, shared by every process: no false
/// negatives, false positives at the sized rate, and a `check_and_mark`
/// that is atomic across processes (the original's was atomic only inside
/// one process). The count of new marks is shared too.
///
/// **Keyed.** Bit positions come from SipHash-1-3 of the item under a
/// 128-bit secret ([`SecretHashState`]), mixed and split into two hashes
/// (Kirsch–Mitzenmacher): a producer that does not know the secret cannot
/// craft ids whose bits cover an id it never sent (with a public hash, ten
/// crafted ids found in a fraction of a second make it read as a
/// duplicate and be dropped). The secret is given
/// ([`with_secret`](Self::with_secret), the same on every replica) or made
/// at the first call and kept beside the filter (`<prefix>:{<name>}:secret`,
/// one script: every replica reads the same one). A filter written before
/// secrets were kept (bits and no secret) is read with the fixed hash it
/// was written with until [`clear`](Self::clear).
pub struct RedisBloomDeduplicator {
    conn: RedisConnection,
    bits_key: String,
    count_key: String,
    secret_key: String,
    bits: u64,
    hashes: u32,
    script: Script,
    secret_script: Script,
    /// The secret given, if any.
    given: Option<SecretHashState>,
    /// How positions are hashed, once known (forgotten by `clear`).
    hashing: RwLock<Option<Hashing>>,
}

impl fmt::Debug for RedisBloomDeduplicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBloomDeduplicator")
            .field("key", &self.bits_key)
            .field("bits", &self.bits)
            .field("hashes", &self.hashes)
            .finish()
    }
}

/// The most bits a Redis string holds (512 MiB).
const MAX_BITS: u64 = 1 << 32;

impl RedisBloomDeduplicator {
    /// A filter sized by `params` (see [`BloomParams::for_capacity`]) under
    /// `<prefix>:{<name>}` and `<prefix>:{<name>}:count`, its secret kept
    /// at `<prefix>:{<name>}:secret`.
    pub fn new(
        conn: RedisConnection,
        prefix: &str,
        name: &str,
        params: BloomParams,
    ) -> Result<Self, RedisGuardError> {
        if params.bits == 0 || params.bits > MAX_BITS {
            return Err(RedisGuardError::invalid(
                Parameter::BloomBits,
                params.bits.to_string(),
                "a Redis Bloom filter holds 1 to 2^32 bits (a Redis string holds at most 512 MiB)",
            ));
        }
        if params.hashes == 0 || params.hashes > guard_core::dedup::MAX_HASHES {
            return Err(RedisGuardError::refused_by(
                Parameter::BloomHashes,
                params.hashes.to_string(),
                guard_core::dedup::BloomError::HashesOutOfRange {
                    hashes: params.hashes,
                },
            ));
        }
        let bits_key = format!("{prefix}:{}", checked_name(name)?);
        Ok(RedisBloomDeduplicator {
            conn,
            count_key: format!("{bits_key}:count"),
            secret_key: format!("{bits_key}:secret"),
            bits_key,
            bits: params.bits,
            hashes: params.hashes,
            script: Script::new(BLOOM),
            secret_script: Script::new(SECRET),
            given: None,
            hashing: RwLock::new(None),
        })
    }

    /// Hashes under `secret` (from configuration, the same on every
    /// replica) instead of one kept in Redis. A filter written under
    /// another secret, or before secrets were kept, reads as empty.
    #[must_use]
    pub fn with_secret(mut self, secret: [u8; 16]) -> Self {
        self.given = Some(SecretHashState::new(secret));
        self
    }

    /// How positions are hashed: the given secret, else the one kept in
    /// Redis (made now if this is a new filter), read once.
    async fn hashing(&self) -> Result<Hashing, RedisGuardError> {
        if let Some(secret) = self.given {
            return Ok(Hashing::Keyed(secret));
        }
        if let Some(hashing) = *self.hashing.read().unwrap_or_else(PoisonError::into_inner) {
            return Ok(hashing);
        }
        let fresh = guard_std::TokenIds::new().next_id().to_string();
        let mut invocation = self.secret_script.prepare_invoke();
        invocation
            .key(&self.secret_key)
            .key(&self.bits_key)
            .arg(&fresh);
        let kept: Option<String> = self.conn.invoke(&invocation).await?;
        let hashing = match kept {
            None => Hashing::Unkeyed,
            Some(hex) => match TokenId::from_hex(&hex) {
                Some(id) => Hashing::Keyed(SecretHashState::new(id.0)),
                None => {
                    return Err(RedisGuardError::UnexpectedReply(format!(
                        "the Bloom filter's secret at {} is not 32 hex digits",
                        self.secret_key
                    )));
                }
            },
        };
        *self.hashing.write().unwrap_or_else(PoisonError::into_inner) = Some(hashing);
        Ok(hashing)
    }

    fn positions(&self, item: &[u8], hashing: Hashing) -> impl Iterator<Item = u64> + use<> {
        let h = match hashing {
            Hashing::Keyed(secret) => secret.hash_bytes(item),
            Hashing::Unkeyed => stable_hash(item),
        };
        let step = (h.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15) | 1;
        let bits = self.bits;
        (0..u64::from(self.hashes)).map(move |i| h.wrapping_add(i.wrapping_mul(step)) % bits)
    }

    async fn run(&self, op: &str, item: &[u8]) -> Result<bool, RedisGuardError> {
        let hashing = self.hashing().await?;
        let mut invocation = self.script.prepare_invoke();
        invocation.key(&self.bits_key).key(&self.count_key).arg(op);
        for position in self.positions(item, hashing) {
            invocation.arg(position);
        }
        Ok(self.conn.invoke::<i64>(&invocation).await? == 1)
    }

    /// Whether `item` may have been seen (never a false negative).
    pub async fn is_duplicate(&self, item: &[u8]) -> Result<bool, RedisGuardError> {
        self.run("check", item).await
    }

    /// Marks `item`.
    pub async fn mark_as_seen(&self, item: &[u8]) -> Result<(), RedisGuardError> {
        self.run("cam", item).await.map(|_| ())
    }

    /// Atomically: `true` if all of `item`'s bits were set, else sets them
    /// and returns `false`.
    pub async fn check_and_mark(&self, item: &[u8]) -> Result<bool, RedisGuardError> {
        self.run("cam", item).await
    }

    /// Marks that set a new bit, across all processes.
    pub async fn unique_count(&self) -> Result<u64, RedisGuardError> {
        let n: Option<u64> = self
            .conn
            .query(redis::cmd("GET").arg(&self.count_key))
            .await?;
        Ok(n.unwrap_or(0))
    }

    /// Forgets everything, the kept secret included: the next call starts
    /// a new filter under a new secret. Other processes that read the old
    /// secret keep it until they are made again; give a secret
    /// ([`with_secret`](Self::with_secret)) where replicas clear a filter
    /// they share while running.
    pub async fn clear(&self) -> Result<(), RedisGuardError> {
        let mut del = redis::cmd("DEL");
        del.arg(&self.bits_key).arg(&self.count_key);
        if self.given.is_none() {
            del.arg(&self.secret_key);
        }
        self.conn.query::<i64>(&del).await?;
        *self.hashing.write().unwrap_or_else(PoisonError::into_inner) = None;
        Ok(())
    }
}

/// FNV-1a 64 followed by the splitmix64 finalizer: the fixed function of
/// filters written before secrets were kept.
fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::stable_hash;

    #[test]
    fn the_stable_hash_never_changes() {
        // Pinned (computed by an independent implementation): a filter
        // written today must be read the same tomorrow.
        assert_eq!(stable_hash(b""), 0xf52a_15e9_a9b5_e89b);
        assert_eq!(stable_hash(b"order-1"), 0xedf2_3fc2_e07f_a9d3);
        assert_ne!(stable_hash(b"order-1"), stable_hash(b"order-2"));
    }
}

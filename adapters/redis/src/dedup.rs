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
/// KEYS[1] bits, KEYS[2] count, KEYS[3] the kept secret. ARGV: 'check' or
/// 'cam', the secret the positions were hashed under ('' for one given,
/// not kept), then the positions. Returns -1, touching nothing, when the
/// kept secret is not the caller's (a clear, or an eviction, made another).
const BLOOM: &str = r"
if ARGV[2] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[2] then return -1 end
local fresh = false
for i = 3, #ARGV do
  if redis.call('GETBIT', KEYS[1], ARGV[i]) == 0 then fresh = true break end
end
if ARGV[1] == 'check' then return fresh and 0 or 1 end
if not fresh then return 1 end
for i = 3, #ARGV do redis.call('SETBIT', KEYS[1], ARGV[i], 1) end
redis.call('INCR', KEYS[2])
return 0
";

/// The kept secret, made if missing. KEYS[1] the secret. ARGV[1] a fresh
/// secret (32 hex digits). Returns the secret.
const SECRET: &str = r"
local secret = redis.call('GET', KEYS[1])
if secret then return secret end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
";

/// Forgets the filter and, when its secret is kept, puts a fresh one in
/// the same step (bits never stand without a secret). KEYS[1] bits,
/// KEYS[2] count, KEYS[3] secret. ARGV[1] the fresh secret, or ''.
const CLEAR: &str = r"
redis.call('DEL', KEYS[1], KEYS[2])
if ARGV[1] ~= '' then redis.call('SET', KEYS[3], ARGV[1]) end
return 1
";

/// The secret positions are hashed under: its hasher, and its text as
/// kept in Redis ('' for a secret given, which is not kept).
#[derive(Clone)]
struct Secret {
    hasher: SecretHashState,
    kept: String,
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
/// at the first call and kept beside the filter (`<prefix>:{<name>}:secret`).
/// Every call names the kept secret it hashed under and is refused, and
/// asked again under the kept one, if that is another: a replica never
/// marks under a secret the others no longer use, after a
/// [`clear`](Self::clear) elsewhere or an eviction of the secret. A filter
/// whose secret is gone is read under a new one: what it held may be
/// admitted once more, as after losing its bits.
pub struct RedisBloomDeduplicator {
    conn: RedisConnection,
    bits_key: String,
    count_key: String,
    secret_key: String,
    bits: u64,
    hashes: u32,
    script: Script,
    secret_script: Script,
    clear_script: Script,
    /// The secret given, if any.
    given: Option<SecretHashState>,
    /// The kept secret, once read (forgotten when Redis says it changed).
    kept: RwLock<Option<Secret>>,
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
            clear_script: Script::new(CLEAR),
            given: None,
            kept: RwLock::new(None),
        })
    }

    /// Hashes under `secret` (from configuration, the same on every
    /// replica) instead of one kept in Redis. A filter written under
    /// another secret reads as one with random bits set: its false
    /// positives rise and what it held may be admitted once more.
    #[must_use]
    pub fn with_secret(mut self, secret: [u8; 16]) -> Self {
        self.given = Some(SecretHashState::new(secret));
        self
    }

    /// The secret to hash under: the given one, else the kept one (read
    /// once, made now if the filter has none).
    async fn secret(&self) -> Result<Secret, RedisGuardError> {
        if let Some(hasher) = self.given {
            return Ok(Secret {
                hasher,
                kept: String::new(),
            });
        }
        if let Some(secret) = self
            .kept
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(secret);
        }
        let mut invocation = self.secret_script.prepare_invoke();
        invocation.key(&self.secret_key).arg(fresh_secret());
        let kept: String = self.conn.invoke(&invocation).await?;
        self.keep(kept)
    }

    /// `text`, read from Redis, as the secret this replica hashes under.
    fn keep(&self, text: String) -> Result<Secret, RedisGuardError> {
        let Some(id) = TokenId::from_hex(&text) else {
            return Err(RedisGuardError::UnexpectedReply(format!(
                "the Bloom filter's secret at {} is not 32 hex digits",
                self.secret_key
            )));
        };
        let secret = Secret {
            hasher: SecretHashState::new(id.0),
            kept: text,
        };
        *self.kept.write().unwrap_or_else(PoisonError::into_inner) = Some(secret.clone());
        Ok(secret)
    }

    fn positions(&self, item: &[u8], secret: &Secret) -> impl Iterator<Item = u64> + use<> {
        let h = secret.hasher.hash_bytes(item);
        let step = (h.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15) | 1;
        let bits = self.bits;
        (0..u64::from(self.hashes)).map(move |i| h.wrapping_add(i.wrapping_mul(step)) % bits)
    }

    /// One call of the filter's script; asked once more under the kept
    /// secret when Redis says it is not the one this replica read.
    async fn run(&self, op: &str, item: &[u8]) -> Result<bool, RedisGuardError> {
        for _ in 0..2 {
            let secret = self.secret().await?;
            let mut invocation = self.script.prepare_invoke();
            invocation
                .key(&self.bits_key)
                .key(&self.count_key)
                .key(&self.secret_key)
                .arg(op)
                .arg(&secret.kept);
            for position in self.positions(item, &secret) {
                invocation.arg(position);
            }
            match self.conn.invoke::<i64>(&invocation).await? {
                -1 => *self.kept.write().unwrap_or_else(PoisonError::into_inner) = None,
                reply => return Ok(reply == 1),
            }
        }
        Err(RedisGuardError::UnexpectedReply(format!(
            "the Bloom filter's secret at {} changed twice during one call",
            self.secret_key
        )))
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

    /// Forgets everything and, when the secret is kept, replaces it in the
    /// same step: every replica hashes under the new one from its next
    /// call.
    pub async fn clear(&self) -> Result<(), RedisGuardError> {
        let fresh = if self.given.is_some() {
            String::new()
        } else {
            fresh_secret()
        };
        let mut invocation = self.clear_script.prepare_invoke();
        invocation
            .key(&self.bits_key)
            .key(&self.count_key)
            .key(&self.secret_key)
            .arg(&fresh);
        self.conn.invoke::<i64>(&invocation).await?;
        if self.given.is_none() {
            self.keep(fresh)?;
        }
        Ok(())
    }
}

/// 128 bits the operating system's randomness chose, as 32 hex digits.
fn fresh_secret() -> String {
    guard_std::TokenIds::new().next_id().to_string()
}

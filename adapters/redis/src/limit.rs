//! Rate limiters on Redis, deciding exactly as guard-core's.
//!
//! Each decision is one script call. The arithmetic is guard-core's: the
//! buckets are GCRA (one settle instant per key; a token bucket and a
//! meter-style leaky bucket decide alike) and the sliding window is a log
//! of admissions with inclusive eviction at `now - window`, where a clock
//! read out of order is recorded at the newest instant. Given the same
//! trace of `(key, time)` calls they make the same decisions (tested with
//! shared vectors).
//!
//! Redis scripts compute in doubles, so times are **microseconds** (epoch
//! microseconds stay exact below 2^53) and intervals must be whole
//! microseconds. Time comes from the caller ([`Clock::Caller`]) or from
//! the Redis server (`TIME` in the script, [`Clock::Server`]), so that
//! clients with skewed clocks still agree.
//!
//! **Caller clocks.** A key's state is kept on the server for as long as
//! it can still matter, measured on the server's clock. On the caller's
//! clock that is longer than it looks: another caller may be behind, or
//! the caller's clock may run slower than the server's. So in
//! [`Clock::Caller`] mode keys are kept `(settle time) ×`
//! [`CALLER_RATE_BOUND_PPM`] stretch `+ 2 ×` [`CALLER_OFFSET_BOUND`], and
//! the decisions equal guard-core's for every caller whose clock is within
//! ±60 s of the server's and runs within ±1% of its rate (a key kept
//! longer than needed decides as a new key would, so the margin never
//! changes a decision, it only costs memory: keys live up to two minutes
//! longer). Outside that bound a key may expire early and admit as a new
//! key. [`Clock::Server`] needs no margin.
//!
//! Keys (the hash tag keeps each key's data in one cluster slot):
//! sliding window `<prefix>:{<key>}` and `<prefix>:{<key>}:seq`; buckets
//! `<prefix>:{<key>}:tb` or `:lb`. Keys expire once their state equals a
//! new key's, so memory follows the active keys.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use guard_core::limit::{Bucket, Decision, SlidingWindow, Tokens, Water};
use guard_core::time::Instant;
use redis::Script;

use crate::connection::RedisConnection;
use crate::error::{Parameter, RedisGuardError};

/// Where a limiter's `now` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// The caller's, passed with each call (as the original).
    Caller(Instant),
    /// The Redis server's (`TIME`): every client sees one clock.
    Server,
}

impl Clock {
    fn arg(&self) -> String {
        match self {
            // Whole microseconds since the caller's origin.
            Clock::Caller(now) => (now.as_nanos() / 1_000).to_string(),
            Clock::Server => String::new(),
        }
    }
}

/// The largest offset between a caller's clock and the server's for
/// which [`Clock::Caller`] decisions equal guard-core's.
pub const CALLER_OFFSET_BOUND: Duration = Duration::from_secs(60);

/// The largest rate difference (parts per million) between a caller's
/// clock and the server's for which [`Clock::Caller`] decisions equal
/// guard-core's.
pub const CALLER_RATE_BOUND_PPM: u64 = 10_000;

/// Reads `now` in microseconds from ARGV[1], or from the server's clock
/// when it is empty, and defines `keep_ms(us)`: how long (server
/// milliseconds, at least 1) to keep state that settles `us` caller
/// microseconds from now. On the server's clock that is exact; on a
/// caller's it is stretched for a clock up to CALLER_RATE_BOUND_PPM slower
/// and extended by twice CALLER_OFFSET_BOUND, for a caller that far behind
/// another (each within the bound of the server).
const NOW: &str = r"
local now
local caller = ARGV[1] ~= ''
if caller then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function keep_ms(us)
  if not caller then
    return math.max(1, math.ceil(us / 1000))
  end
  return math.ceil(us * STRETCH / 1000) + MARGIN_MS
end
";

/// [`NOW`] with the caller-clock bounds filled in.
fn now_preamble() -> String {
    let stretch = 1_000_000.0 / (1_000_000 - CALLER_RATE_BOUND_PPM) as f64;
    let margin_ms = 2 * CALLER_OFFSET_BOUND.as_millis();
    NOW.replace("STRETCH", &format!("{stretch:.9}"))
        .replace("MARGIN_MS", &margin_ms.to_string())
}

/// GCRA: KEYS[1] holds the settle instant. ARGV: now, interval, tolerance.
/// Returns {1, 0} admitted, or {0, wait} in microseconds.
const GCRA: &str = r"
local interval = tonumber(ARGV[2])
local tolerance = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local admit_from = tat - tolerance
if admit_from < 0 then admit_from = 0 end
if now < admit_from then
  return {0, admit_from - now}
end
local base = tat
if now > base then base = now end
local settles = base + interval
-- Keep the key exactly until the bucket has settled; after that it
-- decides as a new key would, so it may go.
redis.call('SET', KEYS[1], string.format('%.0f', settles), 'PX', keep_ms(settles - now))
return {1, 0}
";

/// Sliding-window log: KEYS[1] sorted set of admissions, KEYS[2] sequence.
/// ARGV: now, window, limit. Returns {1, 0} or {0, wait}.
const WINDOW: &str = r"
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
-- A denial measures its wait from the caller's own reading.
local reading = now
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if newest[2] and tonumber(newest[2]) > now then now = tonumber(newest[2]) end
if now - window >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - window))
end
if redis.call('ZCARD', KEYS[1]) < limit then
  local seq = redis.call('INCR', KEYS[2])
  redis.call('ZADD', KEYS[1], string.format('%.0f', now), string.format('%.0f', now) .. ':' .. seq)
  local ttl = keep_ms(window)
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  return {1, 0}
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, tonumber(oldest[2]) + window - reading}
";

/// Checks a user key: not empty, no braces (they would change the hash
/// tag and split a key's data over cluster slots). Colons are fine.
fn checked_key(key: &str) -> Result<&str, RedisGuardError> {
    if key.is_empty() {
        return Err(RedisGuardError::invalid(
            Parameter::RateLimitKey,
            key,
            "must not be empty",
        ));
    }
    if key.contains(['{', '}']) {
        return Err(RedisGuardError::invalid(
            Parameter::RateLimitKey,
            key,
            "contains a brace: braces select the Redis Cluster hash slot and are not allowed in keys",
        ));
    }
    Ok(key)
}

fn checked_prefix(prefix: &str) -> Result<String, RedisGuardError> {
    let prefix = prefix.trim();
    if prefix.is_empty() || prefix.contains(['{', '}']) {
        return Err(RedisGuardError::invalid(
            Parameter::LimiterPrefix,
            prefix,
            "must be non-empty and without braces",
        ));
    }
    Ok(prefix.to_owned())
}

fn whole_micros(parameter: Parameter, d: Duration) -> Result<u64, RedisGuardError> {
    let nanos = d.as_nanos();
    if nanos == 0 || !nanos.is_multiple_of(1_000) {
        return Err(RedisGuardError::invalid(
            parameter,
            format!("{d:?}"),
            "must be a whole, positive number of microseconds (Redis limiters work in microseconds)",
        ));
    }
    u64::try_from(nanos / 1_000)
        .ok()
        .filter(|us| *us < 1 << 53)
        .ok_or_else(|| {
            RedisGuardError::invalid(
                parameter,
                format!("{d:?}"),
                "is too long (Redis limiters count in microseconds below 2^53)",
            )
        })
}

fn decision(reply: (i64, i64)) -> Result<Decision, RedisGuardError> {
    match reply {
        (1, _) => Ok(Decision::Allowed),
        (0, wait) if wait > 0 => Ok(Decision::Denied {
            retry_after: Duration::from_micros(wait.unsigned_abs()),
        }),
        (0, _) => Ok(Decision::Denied {
            retry_after: Duration::from_micros(1),
        }),
        other => Err(RedisGuardError::UnexpectedReply(format!("{other:?}"))),
    }
}

/// A GCRA bucket on Redis: [`RedisTokenBucket`] or [`RedisLeakyBucket`].
pub struct RedisBucket<V> {
    conn: RedisConnection,
    prefix: String,
    suffix: &'static str,
    interval_us: u64,
    tolerance_us: u64,
    script: Script,
    view: PhantomData<V>,
}

impl<V> fmt::Debug for RedisBucket<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBucket")
            .field("prefix", &self.prefix)
            .field("suffix", &self.suffix)
            .field("interval_us", &self.interval_us)
            .finish()
    }
}

/// A token bucket on Redis: a new key starts full.
pub type RedisTokenBucket = RedisBucket<Tokens>;

/// A meter-style leaky bucket on Redis (the original had none): a new key
/// starts empty; admit if `water + 1 <= capacity`.
pub type RedisLeakyBucket = RedisBucket<Water>;

/// The default key prefix of token buckets.
pub const TOKEN_BUCKET_PREFIX: &str = "guard:tb";
/// The default key prefix of leaky buckets.
pub const LEAKY_BUCKET_PREFIX: &str = "guard:lb";
/// The default key prefix of sliding windows.
pub const SLIDING_WINDOW_PREFIX: &str = "guard:rl";

impl<V> RedisBucket<V> {
    fn with_suffix(
        conn: RedisConnection,
        bucket: Bucket<V>,
        prefix: &str,
        suffix: &'static str,
    ) -> Result<Self, RedisGuardError> {
        let interval_us = whole_micros(Parameter::RefillInterval, bucket.interval())?;
        let tolerance_us =
            interval_us.saturating_mul(u64::from(bucket.capacity()).saturating_sub(1));
        if tolerance_us >= 1 << 53 {
            return Err(RedisGuardError::invalid(
                Parameter::BucketSpan,
                format!("{} × {:?}", bucket.capacity(), bucket.interval()),
                "is too long for Redis (Redis limiters count in microseconds below 2^53)",
            ));
        }
        Ok(RedisBucket {
            conn,
            prefix: checked_prefix(prefix)?,
            suffix,
            interval_us,
            tolerance_us,
            script: Script::new(&Self::script_source()),
            view: PhantomData,
        })
    }

    /// The script each decision runs (KEYS: the bucket; ARGV: now in
    /// microseconds or empty for the server's clock, the interval and the
    /// tolerance in microseconds), for tools that load it themselves.
    pub fn script_source() -> String {
        format!("{}{GCRA}", now_preamble())
    }

    /// The Redis key of `key`.
    pub fn redis_key(&self, key: &str) -> Result<String, RedisGuardError> {
        Ok(format!(
            "{}:{{{}}}{}",
            self.prefix,
            checked_key(key)?,
            self.suffix
        ))
    }

    /// Decides one request for `key`: one round trip.
    pub async fn check(&self, key: &str, clock: Clock) -> Result<Decision, RedisGuardError> {
        let redis_key = self.redis_key(key)?;
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(redis_key)
            .arg(clock.arg())
            .arg(self.interval_us)
            .arg(self.tolerance_us);
        decision(self.conn.invoke(&invocation).await?)
    }
}

impl RedisBucket<Tokens> {
    /// A token bucket with guard-core's parameters; the refill interval
    /// must be a whole number of microseconds.
    pub fn new(conn: RedisConnection, bucket: Bucket<Tokens>) -> Result<Self, RedisGuardError> {
        Self::with_suffix(conn, bucket, TOKEN_BUCKET_PREFIX, ":tb")
    }

    /// Keys under `prefix` instead of [`TOKEN_BUCKET_PREFIX`].
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, RedisGuardError> {
        self.prefix = checked_prefix(prefix)?;
        Ok(self)
    }
}

impl RedisBucket<Water> {
    /// A leaky bucket with guard-core's parameters; the drain interval
    /// must be a whole number of microseconds.
    pub fn new(conn: RedisConnection, bucket: Bucket<Water>) -> Result<Self, RedisGuardError> {
        Self::with_suffix(conn, bucket, LEAKY_BUCKET_PREFIX, ":lb")
    }

    /// Keys under `prefix` instead of [`LEAKY_BUCKET_PREFIX`].
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, RedisGuardError> {
        self.prefix = checked_prefix(prefix)?;
        Ok(self)
    }
}

/// A sliding-window log on Redis: at most `limit` admissions per window.
pub struct RedisSlidingWindow {
    conn: RedisConnection,
    prefix: String,
    window_us: u64,
    limit: u32,
    script: Script,
}

impl fmt::Debug for RedisSlidingWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSlidingWindow")
            .field("prefix", &self.prefix)
            .field("window_us", &self.window_us)
            .field("limit", &self.limit)
            .finish()
    }
}

impl RedisSlidingWindow {
    /// A window with guard-core's parameters; the window must be a whole
    /// number of microseconds.
    pub fn new<const N: usize>(
        conn: RedisConnection,
        window: SlidingWindow<N>,
    ) -> Result<Self, RedisGuardError> {
        Ok(RedisSlidingWindow {
            conn,
            prefix: SLIDING_WINDOW_PREFIX.to_owned(),
            window_us: whole_micros(Parameter::SlidingWindow, window.window())?,
            limit: window.limit(),
            script: Script::new(&Self::script_source()),
        })
    }

    /// Keys under `prefix` instead of [`SLIDING_WINDOW_PREFIX`].
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, RedisGuardError> {
        self.prefix = checked_prefix(prefix)?;
        Ok(self)
    }

    /// The script each decision runs (KEYS: log, sequence; ARGV: now in
    /// µs or empty for server time, window in µs, limit), e.g. to load it
    /// into `redis-benchmark` for a side-by-side measurement.
    pub fn script_source() -> String {
        format!("{}{WINDOW}", now_preamble())
    }

    /// The Redis keys of `key`: the log and its sequence.
    pub fn redis_keys(&self, key: &str) -> Result<(String, String), RedisGuardError> {
        let log = format!("{}:{{{}}}", self.prefix, checked_key(key)?);
        let seq = format!("{log}:seq");
        Ok((log, seq))
    }

    /// Decides one request for `key`: one round trip.
    pub async fn check(&self, key: &str, clock: Clock) -> Result<Decision, RedisGuardError> {
        let (log, seq) = self.redis_keys(key)?;
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(log)
            .key(seq)
            .arg(clock.arg())
            .arg(self.window_us)
            .arg(self.limit);
        decision(self.conn.invoke(&invocation).await?)
    }
}

impl<V: Send + Sync> guard_std::ratelimit::RateLimiter for RedisBucket<V> {
    /// Decides on the Redis server's clock, so every replica agrees.
    fn check<'a>(&'a self, key: &'a str) -> guard_std::ratelimit::LimitFuture<'a> {
        guard_std::ratelimit::LimitFuture::Pending(Box::pin(async move {
            RedisBucket::check(self, key, Clock::Server)
                .await
                .map_err(guard_std::BackendError::new)
        }))
    }
}

impl guard_std::ratelimit::RateLimiter for RedisSlidingWindow {
    /// Decides on the Redis server's clock, so every replica agrees.
    fn check<'a>(&'a self, key: &'a str) -> guard_std::ratelimit::LimitFuture<'a> {
        guard_std::ratelimit::LimitFuture::Pending(Box::pin(async move {
            RedisSlidingWindow::check(self, key, Clock::Server)
                .await
                .map_err(guard_std::BackendError::new)
        }))
    }
}

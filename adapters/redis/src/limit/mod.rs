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
//! Keys (the hash tag keeps each key's data in one cluster slot; `<key>`
//! is the user's key through guard-core's key codec, so `%`, braces and
//! control characters stand as `%XX`, and a key longer than guard-std's
//! `MAX_KEY_LEN` is refused as invalid input):
//! sliding window `<prefix>:{<key>}` and `<prefix>:{<key>}:seq`; buckets
//! `<prefix>:{<key>}:tb` or `:lb`; bandwidths `<prefix>:{<key>}:bw<i>`, one
//! a bucket; fixed window `<prefix>:{<key>}:fw`. Keys expire once their state equals a
//! new key's, so memory follows the active keys.

mod bandwidths;
mod batched;
mod fixed_window;

pub use bandwidths::{BANDWIDTHS_PREFIX, RedisBandwidths};
pub use batched::RedisBatchedBucket;
pub use fixed_window::{FIXED_WINDOW_PREFIX, RedisFixedWindow};

use std::fmt;
use std::marker::PhantomData;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use guard_core::key::{Escaped, Reserved, escaped};
use guard_core::limit::{
    Bucket, CostAboveLimit, Decision, LimiterError, Rate, Report, SlidingWindow, Tokens, Water,
};
use guard_core::time::Instant;
use guard_std::ratelimit::{FromQuota, Quota, ReconfigureError};
use redis::{Script, ScriptInvocation};

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

/// GCRA on Redis, the functions every bucket script shares. A key holds
/// its settle instant and the parameters it was kept under,
/// `<settle>:<interval>:<capacity>` (a bare `<settle>` is read as kept
/// under the current ones).
///
/// `settle_of` reads a key's settle instant; a key kept under other
/// parameters is carried over first, as guard-core's `Gcra::carry_over`
/// does (the units it owes now rescaled to the new interval, rounded up,
/// at most one full bucket) and stored at once, so it is carried over
/// once. `admit_from` is the instant from which `cost` units are admitted,
/// `take` records them, `room` and `reset` are the report's remaining
/// units and reset time.
const GCRA_FUNCTIONS: &str = r"
local function settle_of(key, interval, capacity)
  local stored = redis.call('GET', key)
  if not stored then return 0 end
  local t, was_interval, was_capacity = string.match(stored, '^(%d+):?(%d*):?(%d*)$')
  if not t then
    return nil, 'guard: bucket state ' .. key .. ' is not <settle>:<interval>:<capacity>: ' .. stored
  end
  local tat = tonumber(t)
  was_interval = tonumber(was_interval) or interval
  was_capacity = tonumber(was_capacity) or capacity
  if tat > now and (was_interval ~= interval or was_capacity ~= capacity) then
    local debt = math.ceil((tat - now) * interval / was_interval)
    if debt > interval * capacity then debt = interval * capacity end
    tat = now + debt
    redis.call('SET', key, string.format('%.0f:%.0f:%.0f', tat, interval, capacity),
      'PX', keep_ms(debt))
  end
  return tat
end
local function admit_from(t, interval, capacity, cost)
  local from = t - (interval * capacity - cost * interval)
  if from < 0 then return 0 end
  return from
end
-- Keeps the key exactly until the bucket has settled; after that it
-- decides as a new key would, so it may go.
local function take(key, t, interval, capacity, cost)
  local base = t
  if now > base then base = now end
  local settles = base + cost * interval
  redis.call('SET', key, string.format('%.0f:%.0f:%.0f', settles, interval, capacity),
    'PX', keep_ms(settles - now))
  return settles
end
-- Whole units that could be admitted at now against settle instant t.
local function room(t, interval, capacity)
  local ahead = t - now
  if ahead < 0 then return capacity end
  local slack = interval * capacity - interval - ahead
  if slack < 0 then return 0 end
  return math.min(capacity, math.floor(slack / interval) + 1)
end
local function reset(t)
  if t > now then return t - now end
  return 0
end
";

/// One bucket: KEYS[1]; ARGV: now, interval, capacity, cost.
///
/// Returns redis-cell's five values in one reply: `{admitted (1 or 0),
/// limit, remaining, retry after, reset after}`, times in microseconds,
/// retry after 0 when admitted.
const GCRA: &str = r"
local interval = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local tat, bad = settle_of(KEYS[1], interval, capacity)
if not tat then return redis.error_reply(bad) end
if cost == 0 then
  return {1, capacity, room(tat, interval, capacity), 0, reset(tat)}
end
local from = admit_from(tat, interval, capacity, cost)
if now < from then
  return {0, capacity, room(tat, interval, capacity), from - now, reset(tat)}
end
local settles = take(KEYS[1], tat, interval, capacity, cost)
return {1, capacity, room(settles, interval, capacity), 0, settles - now}
";

/// Up to `want` tokens of one bucket, as many as it holds: KEYS[1];
/// ARGV: now, interval, capacity, want. Returns `{granted, retry after}`:
/// the tokens taken (0 to `want`) and, when none, the microseconds until
/// one is there. For a cache in front of the bucket (`RedisBatchedBucket`).
const TAKE_UP_TO: &str = r"
local interval = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local tat, bad = settle_of(KEYS[1], interval, capacity)
if not tat then return redis.error_reply(bad) end
local granted = math.min(want, room(tat, interval, capacity))
if granted <= 0 then
  return {0, admit_from(tat, interval, capacity, 1) - now}
end
take(KEYS[1], tat, interval, capacity, granted)
return {granted, 0}
";

/// Sliding-window log: KEYS[1] sorted set of admissions, KEYS[2] sequence.
/// ARGV: now, window, limit, cost. Returns the five values of [`GCRA`].
const WINDOW: &str = r"
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
-- A denial measures its wait from the caller's own reading.
local reading = now
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if newest[2] and tonumber(newest[2]) > now then now = tonumber(newest[2]) end
if now - window >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - window))
end
local held = redis.call('ZCARD', KEYS[1])
if held + cost <= limit then
  if cost > 0 then
    local seq = redis.call('INCRBY', KEYS[2], cost)
    local at = string.format('%.0f', now)
    for i = seq - cost + 1, seq do
      redis.call('ZADD', KEYS[1], at, at .. ':' .. string.format('%.0f', i))
    end
    local ttl = keep_ms(window)
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
    held = held + cost
  end
  local reset = 0
  if held > 0 then
    local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    reset = tonumber(last[2]) + window - reading
  end
  return {1, limit, limit - held, 0, reset}
end
-- Room for cost more once held + cost - limit admissions have left, the
-- oldest first.
local index = held + cost - limit - 1
local leaving = redis.call('ZRANGE', KEYS[1], index, index, 'WITHSCORES')
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local remaining = limit - held
if remaining < 0 then remaining = 0 end
return {0, limit, remaining, tonumber(leaving[2]) + window - reading, tonumber(last[2]) + window - reading}
";

/// A user key as it stands in a Redis key: checked by guard-std's key
/// rule (not empty, at most [`MAX_KEY_LEN`](guard_std::ratelimit::MAX_KEY_LEN)
/// bytes), then written through guard-core's key codec, so any other text
/// is a key of its own: a brace cannot move the hash tag and two keys
/// never meet. A refused key is [`RedisGuardError::InvalidInput`] with
/// guard-std's [`InvalidKey`](guard_std::ratelimit::InvalidKey) as its
/// source, which the limiters report as `LimitError::InvalidKey` (never as
/// the backend's failure).
fn checked_key(key: &str) -> Result<Escaped<'_>, RedisGuardError> {
    guard_std::ratelimit::check_key(key)
        .map_err(|e| RedisGuardError::refused_by(Parameter::RateLimitKey, excerpt(key), e))?;
    Ok(escaped(key, Reserved::HashTag))
}

/// At most the first 64 characters of `text`, marked when cut: a refused
/// key is named in the error without copying all of a hostile one.
fn excerpt(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
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

/// The five values of a limiter script's reply as guard-core's report.
fn report(reply: (i64, i64, i64, i64, i64)) -> Result<Report, RedisGuardError> {
    let unexpected = || RedisGuardError::UnexpectedReply(format!("{reply:?}"));
    let (admitted, limit, remaining, retry_us, reset_us) = reply;
    let micros = |us: i64| Duration::from_micros(us.max(0).unsigned_abs());
    let decision = match admitted {
        1 => Decision::Allowed,
        // A denial asks to wait at least one microsecond (the scripts'
        // resolution), as guard-core's asks for at least 1 ns.
        0 => Decision::Denied {
            retry_after: micros(retry_us).max(Duration::from_micros(1)),
        },
        _ => return Err(unexpected()),
    };
    Ok(Report {
        decision,
        limit: u32::try_from(limit).map_err(|_| unexpected())?,
        remaining: u32::try_from(remaining).map_err(|_| unexpected())?,
        reset_after: micros(reset_us),
    })
}

/// Refuses a cost above the quota before anything is sent.
fn checked_cost(cost: u32, limit: u32) -> Result<u32, RedisGuardError> {
    if cost > limit {
        return Err(RedisGuardError::refused_by(
            Parameter::Cost,
            cost.to_string(),
            CostAboveLimit { cost, limit },
        ));
    }
    Ok(cost)
}

/// A bucket's parameters as its script takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BucketParams {
    interval_us: u64,
    capacity: u32,
    rate: Rate,
}

impl BucketParams {
    /// The token bucket of these parameters (accepted by its constructor
    /// before they were stored).
    fn token_bucket(&self) -> Bucket<Tokens> {
        Bucket::new(self.capacity, self.rate)
            .unwrap_or_else(|_| unreachable!("stored bucket parameters are valid"))
    }

    fn of<V>(bucket: &Bucket<V>) -> Result<Self, RedisGuardError> {
        let interval_us = whole_micros(Parameter::RefillInterval, bucket.interval())?;
        if interval_us.saturating_mul(u64::from(bucket.capacity())) >= 1 << 53 {
            return Err(RedisGuardError::invalid(
                Parameter::BucketSpan,
                format!("{} × {:?}", bucket.capacity(), bucket.interval()),
                "is too long for Redis (Redis limiters count in microseconds below 2^53)",
            ));
        }
        Ok(BucketParams {
            interval_us,
            capacity: bucket.capacity(),
            rate: bucket.rate(),
        })
    }
}

/// A GCRA bucket on Redis: [`RedisTokenBucket`] or [`RedisLeakyBucket`].
///
/// Its parameters can be replaced while it serves ([`Self::reconfigure`]).
/// Each key keeps the parameters it was last decided under beside its
/// state, and its next decision carries it over as guard-core's
/// `Algorithm::carry_over` does, at that decision's reading: until then
/// the key refills at the rate it had. The rescaled debt is rounded up to
/// a whole microsecond (guard-core's to a nanosecond), so a key never
/// gains by it.
pub struct RedisBucket<V> {
    conn: RedisConnection,
    prefix: String,
    suffix: &'static str,
    params: RwLock<BucketParams>,
    script: Script,
    /// [`TAKE_UP_TO`], for token buckets.
    take_up_to: Script,
    view: PhantomData<V>,
}

impl<V: Copy> fmt::Debug for RedisBucket<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBucket")
            .field("prefix", &self.prefix)
            .field("suffix", &self.suffix)
            .field("params", &self.params())
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

impl<V: Copy> RedisBucket<V> {
    /// Whether `bucket` can run on Redis (the rule [`new`](RedisTokenBucket::new)
    /// applies): its refill interval a whole number of microseconds and its
    /// span below 2^53 of them. For a caller that validates parameters
    /// before it connects.
    pub fn runs_on_redis(bucket: &Bucket<V>) -> Result<(), RedisGuardError> {
        BucketParams::of(bucket).map(|_| ())
    }

    fn with_suffix(
        conn: RedisConnection,
        bucket: Bucket<V>,
        prefix: &str,
        suffix: &'static str,
    ) -> Result<Self, RedisGuardError> {
        let params = BucketParams::of(&bucket)?;
        Ok(RedisBucket {
            conn,
            prefix: checked_prefix(prefix)?,
            suffix,
            params: RwLock::new(params),
            script: Script::new(&Self::script_source()),
            take_up_to: Script::new(&format!("{}{GCRA_FUNCTIONS}{TAKE_UP_TO}", now_preamble())),
            view: PhantomData,
        })
    }

    fn params(&self) -> BucketParams {
        *self.params.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The parameters every key is limited by now.
    pub fn bucket(&self) -> Bucket<V> {
        let params = self.params();
        // They were accepted by this constructor before they were stored.
        Bucket::new(params.capacity, params.rate)
            .unwrap_or_else(|_| unreachable!("stored bucket parameters are valid"))
    }

    /// Replaces the parameters; every key carries its state over at its
    /// next decision (see the type's notes). Refused, keeping the old
    /// ones, when Redis cannot represent them.
    pub fn reconfigure(&self, bucket: Bucket<V>) -> Result<(), RedisGuardError> {
        let params = BucketParams::of(&bucket)?;
        *self.params.write().unwrap_or_else(PoisonError::into_inner) = params;
        Ok(())
    }

    /// The script each decision runs (KEYS: the bucket; ARGV: now in
    /// microseconds or empty for the server's clock, the interval in
    /// microseconds, the capacity, the cost), for tools that load it
    /// themselves. It replies redis-cell's five values: admitted (1 or
    /// 0), limit, remaining, retry after and reset after in microseconds.
    pub fn script_source() -> String {
        format!("{}{GCRA_FUNCTIONS}{GCRA}", now_preamble())
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
        // Sent directly rather than through `check_n`: one future less
        // in every caller's state machine.
        let invocation = self.invocation(key, 1, clock)?;
        Ok(report(self.conn.invoke(&invocation).await?)?.decision)
    }

    /// Decides a request of `cost` units for `key`, all or nothing, with
    /// the key's limit, remaining units and reset time: one round trip.
    /// A cost above the capacity is refused before anything is sent.
    pub async fn check_n(
        &self,
        key: &str,
        cost: u32,
        clock: Clock,
    ) -> Result<Report, RedisGuardError> {
        let invocation = self.invocation(key, cost, clock)?;
        report(self.conn.invoke(&invocation).await?)
    }

    /// The script call deciding `cost` units for `key`.
    fn invocation(
        &self,
        key: &str,
        cost: u32,
        clock: Clock,
    ) -> Result<ScriptInvocation<'_>, RedisGuardError> {
        let params = self.params();
        let cost = checked_cost(cost, params.capacity)?;
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(self.redis_key(key)?)
            .arg(clock.arg())
            .arg(params.interval_us)
            .arg(params.capacity)
            .arg(cost);
        Ok(invocation)
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

/// What [`RedisTokenBucket::take_up_to`] took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// Tokens taken: from 0 to the number asked.
    pub granted: u32,
    /// When none: how long until one is there (at least 1 µs).
    pub retry_after: Option<Duration>,
}

impl RedisBucket<Tokens> {
    /// Takes up to `want` tokens of `key`'s bucket, as many as it holds
    /// (at most the capacity): one round trip. What a cache in front of
    /// the bucket spends locally ([`RedisBatchedBucket`](crate::RedisBatchedBucket)).
    pub async fn take_up_to(
        &self,
        key: &str,
        want: u32,
        clock: Clock,
    ) -> Result<Taken, RedisGuardError> {
        let params = self.params();
        let want = want.min(params.capacity);
        let mut invocation = self.take_up_to.prepare_invoke();
        invocation
            .key(self.redis_key(key)?)
            .arg(clock.arg())
            .arg(params.interval_us)
            .arg(params.capacity)
            .arg(want);
        let reply: (i64, i64) = self.conn.invoke(&invocation).await?;
        let unexpected = || RedisGuardError::UnexpectedReply(format!("{reply:?}"));
        let granted = u32::try_from(reply.0).map_err(|_| unexpected())?;
        if granted > want {
            return Err(unexpected());
        }
        let retry_after =
            (granted == 0).then(|| Duration::from_micros(reply.1.max(1).unsigned_abs()));
        Ok(Taken {
            granted,
            retry_after,
        })
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

/// A window's parameters as its script takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WindowParams {
    window_us: u64,
    limit: u32,
}

/// A sliding-window log on Redis: at most `limit` admissions per window.
///
/// Its parameters can be replaced while it serves ([`Self::reconfigure`]):
/// each key keeps its admissions, measured against the new window and
/// limit from the next decision on.
pub struct RedisSlidingWindow {
    conn: RedisConnection,
    prefix: String,
    params: RwLock<WindowParams>,
    script: Script,
}

impl fmt::Debug for RedisSlidingWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSlidingWindow")
            .field("prefix", &self.prefix)
            .field("params", &self.params())
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
            params: RwLock::new(Self::params_of(&window)?),
            script: Script::new(&Self::script_source()),
        })
    }

    /// Whether `window` can run on Redis (the rule [`new`](Self::new)
    /// applies): its width a whole number of microseconds below 2^53. For
    /// a caller that validates parameters before it connects.
    pub fn runs_on_redis<const N: usize>(window: &SlidingWindow<N>) -> Result<(), RedisGuardError> {
        Self::params_of(window).map(|_| ())
    }

    fn params_of<const N: usize>(
        window: &SlidingWindow<N>,
    ) -> Result<WindowParams, RedisGuardError> {
        Ok(WindowParams {
            window_us: whole_micros(Parameter::SlidingWindow, window.window())?,
            limit: window.limit(),
        })
    }

    fn params(&self) -> WindowParams {
        *self.params.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The window's width now.
    pub fn window(&self) -> Duration {
        Duration::from_micros(self.params().window_us)
    }

    /// Admissions per window now.
    pub fn limit(&self) -> u32 {
        self.params().limit
    }

    /// Replaces the parameters (see the type's notes). Refused, keeping
    /// the old ones, when Redis cannot represent them.
    pub fn reconfigure<const N: usize>(
        &self,
        window: SlidingWindow<N>,
    ) -> Result<(), RedisGuardError> {
        let params = Self::params_of(&window)?;
        *self.params.write().unwrap_or_else(PoisonError::into_inner) = params;
        Ok(())
    }

    /// Keys under `prefix` instead of [`SLIDING_WINDOW_PREFIX`].
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, RedisGuardError> {
        self.prefix = checked_prefix(prefix)?;
        Ok(self)
    }

    /// The script each decision runs (KEYS: log, sequence; ARGV: now in
    /// µs or empty for server time, window in µs, limit, cost), e.g. to
    /// load it into `redis-benchmark` for a side-by-side measurement. It
    /// replies the five values of [`RedisBucket::script_source`].
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
        // Sent directly rather than through `check_n`: one future less
        // in every caller's state machine.
        let invocation = self.invocation(key, 1, clock)?;
        Ok(report(self.conn.invoke(&invocation).await?)?.decision)
    }

    /// Decides a request of `cost` admissions for `key`, all or nothing,
    /// with the key's limit, remaining admissions and reset time: one
    /// round trip. A cost above the limit is refused before anything is
    /// sent.
    pub async fn check_n(
        &self,
        key: &str,
        cost: u32,
        clock: Clock,
    ) -> Result<Report, RedisGuardError> {
        let invocation = self.invocation(key, cost, clock)?;
        report(self.conn.invoke(&invocation).await?)
    }

    /// The script call deciding `cost` admissions for `key`.
    fn invocation(
        &self,
        key: &str,
        cost: u32,
        clock: Clock,
    ) -> Result<ScriptInvocation<'_>, RedisGuardError> {
        let params = self.params();
        let cost = checked_cost(cost, params.limit)?;
        let (log, seq) = self.redis_keys(key)?;
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(log)
            .key(seq)
            .arg(clock.arg())
            .arg(params.window_us)
            .arg(params.limit)
            .arg(cost);
        Ok(invocation)
    }
}

/// A guard-std [`LimitError`](guard_std::ratelimit::LimitError) of a
/// Redis limiter's error: a refused cost is the cost error, a refused key
/// the key error, anything else the backend's.
fn limit_error(e: RedisGuardError) -> guard_std::ratelimit::LimitError {
    use std::error::Error as _;
    if let Some(cost) = e.source().and_then(|s| s.downcast_ref::<CostAboveLimit>()) {
        return guard_std::ratelimit::LimitError::Cost(*cost);
    }
    if let Some(key) = e
        .source()
        .and_then(|s| s.downcast_ref::<guard_std::ratelimit::InvalidKey>())
    {
        return guard_std::ratelimit::LimitError::InvalidKey(*key);
    }
    guard_std::ratelimit::LimitError::Backend(guard_std::BackendError::new(e))
}

fn reconfigure_error(e: RedisGuardError) -> ReconfigureError {
    ReconfigureError::Backend(guard_std::BackendError::new(e))
}

impl<V> guard_std::ratelimit::RateLimiter for RedisBucket<V>
where
    V: Copy + Send + Sync,
    Bucket<V>: FromQuota,
{
    /// Decides on the Redis server's clock, so every replica agrees.
    fn check_n<'a>(&'a self, key: &'a str, cost: u32) -> guard_std::ratelimit::LimitFuture<'a> {
        guard_std::ratelimit::LimitFuture::Pending(Box::pin(async move {
            RedisBucket::check_n(self, key, cost, Clock::Server)
                .await
                .map_err(limit_error)
        }))
    }

    fn quota(&self) -> Quota {
        self.bucket().quota()
    }

    fn reconfigure(&self, quota: Quota) -> Result<(), ReconfigureError> {
        RedisBucket::reconfigure(self, Bucket::<V>::from_quota(quota)?).map_err(reconfigure_error)
    }
}

impl guard_std::ratelimit::RateLimiter for RedisSlidingWindow {
    /// Decides on the Redis server's clock, so every replica agrees.
    fn check_n<'a>(&'a self, key: &'a str, cost: u32) -> guard_std::ratelimit::LimitFuture<'a> {
        guard_std::ratelimit::LimitFuture::Pending(Box::pin(async move {
            RedisSlidingWindow::check_n(self, key, cost, Clock::Server)
                .await
                .map_err(limit_error)
        }))
    }

    fn quota(&self) -> Quota {
        Quota::SlidingWindow {
            limit: self.limit(),
            window: self.window(),
        }
    }

    fn reconfigure(&self, quota: Quota) -> Result<(), ReconfigureError> {
        let Quota::SlidingWindow { limit, window } = quota else {
            return Err(ReconfigureError::OtherAlgorithm {
                limiter: "sliding window",
                quota: quota.kind(),
            });
        };
        // Redis keeps any number of admissions, so no log size bounds the
        // limit: guard-core checks the window (with a log of one) and a
        // limit of zero is refused as it refuses it.
        if limit == 0 {
            return Err(ReconfigureError::Invalid(LimiterError::ZeroLimit));
        }
        SlidingWindow::<1>::new(window, 1).map_err(ReconfigureError::Invalid)?;
        let params = WindowParams {
            window_us: whole_micros(Parameter::SlidingWindow, window).map_err(reconfigure_error)?,
            limit,
        };
        *self.params.write().unwrap_or_else(PoisonError::into_inner) = params;
        Ok(())
    }
}

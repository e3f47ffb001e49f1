//! guard-core's fixed window on Redis: one counter per key, charged in
//! the aligned window of the decision's reading.

use std::fmt;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use guard_core::limit::{Decision, FixedWindow, Report};
use guard_std::ratelimit::{FromQuota, Quota, ReconfigureError};
use redis::{Script, ScriptInvocation};

use super::{
    Clock, checked_cost, checked_key, checked_prefix, limit_error, now_preamble, reconfigure_error,
    report,
};
use crate::connection::RedisConnection;
use crate::error::{Parameter, RedisGuardError};

/// The default key prefix of fixed windows.
pub const FIXED_WINDOW_PREFIX: &str = "guard:fw";

/// The longest period Redis decides exactly: 2^52 microseconds (about
/// 142 years), so that a window's end, its start plus the period, stays
/// below 2^53 (a double's exact integers) for readings before 2112.
const MAX_PERIOD_US: u64 = 1 << 52;

/// Fixed window: KEYS[1] holds `<start>:<used>:<period>:<offset>`, the
/// window the key was last charged in, the units used there, and the
/// parameters it was kept under. ARGV: now, period, offset, limit, cost.
/// Returns the five values of the other limiters' scripts.
///
/// A key kept under other parameters is carried over first, as
/// guard-core's `FixedWindow::carry_over` does: what it used stays
/// charged to the new window that holds the reading (or its own start,
/// if later), unless its window had ended.
const FIXED: &str = r"
local period = tonumber(ARGV[2])
local offset = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local function start_of(t, p, o)
  if t < o then return 0 end
  return t - ((t - o) % p)
end
local function end_of(s, p, o)
  if s < o then return o end
  return s + p
end
local start = start_of(now, period, offset)
local used = 0
local stored = redis.call('GET', KEYS[1])
if stored then
  local s, u, p, o = string.match(stored, '^(%d+):(%d+):(%d+):(%d+)$')
  if not s then
    return redis.error_reply('guard: fixed window state ' .. KEYS[1] .. ' is not <start>:<used>:<period>:<offset>: ' .. stored)
  end
  s, u, p, o = tonumber(s), tonumber(u), tonumber(p), tonumber(o)
  if u > 0 and (p ~= period or o ~= offset) then
    if now >= end_of(s, p, o) then
      u = 0
      redis.call('DEL', KEYS[1])
    else
      local at = now
      if s > at then at = s end
      s = start_of(at, period, offset)
      -- Stored at once, admitted or not: the key is carried over once.
      redis.call('SET', KEYS[1], string.format('%.0f:%.0f:%.0f:%.0f', s, u, period, offset),
        'PX', keep_ms(end_of(s, period, offset) - now))
    end
  end
  -- A reading out of order is charged to the newest window.
  if u > 0 and s >= start then
    start, used = s, u
  end
end
local finish = end_of(start, period, offset)
local function reset(u)
  if u == 0 then return 0 end
  return finish - now
end
if used + cost <= limit then
  if cost > 0 then
    used = used + cost
    -- Kept until its window ends; after that it decides as a new key.
    redis.call('SET', KEYS[1], string.format('%.0f:%.0f:%.0f:%.0f', start, used, period, offset),
      'PX', keep_ms(finish - now))
  end
  return {1, limit, limit - used, 0, reset(used)}
end
local remaining = limit - used
if remaining < 0 then remaining = 0 end
return {0, limit, remaining, finish - now, reset(used)}
";

/// A window's parameters as its script takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WindowParams {
    period_us: u64,
    offset_us: u64,
    limit: u32,
}

impl WindowParams {
    fn of(window: &FixedWindow) -> Result<Self, RedisGuardError> {
        let micros = |d: Duration| {
            let nanos = d.as_nanos();
            (nanos.is_multiple_of(1_000))
                .then(|| u64::try_from(nanos / 1_000).ok())
                .flatten()
        };
        let period_us = micros(window.period())
            .filter(|us| *us > 0 && *us <= MAX_PERIOD_US)
            .ok_or_else(|| {
                RedisGuardError::invalid(
                    Parameter::FixedWindowPeriod,
                    format!("{:?}", window.period()),
                    "must be a whole number of microseconds up to 2^52 of them (about 142 \
                     years): Redis limiters count in microseconds below 2^53",
                )
            })?;
        let offset_us = micros(window.offset()).ok_or_else(|| {
            RedisGuardError::invalid(
                Parameter::FixedWindowOffset,
                format!("{:?}", window.offset()),
                "must be a whole number of microseconds (Redis limiters work in microseconds)",
            )
        })?;
        Ok(WindowParams {
            period_us,
            offset_us,
            limit: window.limit(),
        })
    }

    fn window(&self) -> FixedWindow {
        // They were accepted by guard-core before they were stored.
        FixedWindow::new(Duration::from_micros(self.period_us), self.limit)
            .unwrap_or_else(|_| unreachable!("stored window parameters are valid"))
            .with_offset(Duration::from_micros(self.offset_us))
    }
}

/// guard-core's [`FixedWindow`] on Redis: at most `limit` units in each
/// aligned window, decided as guard-core decides on the same readings.
///
/// On the server's clock ([`Clock::Server`]) windows align to the Unix
/// epoch, as guard-std's `MemoryLimiter::aligned` does on the caller's
/// wall clock, so the two agree on when a window starts. Readings before
/// 2112 (2^52 microseconds since the epoch) are decided exactly.
///
/// Its parameters can be replaced while it serves ([`Self::reconfigure`]):
/// each key keeps the parameters it was last charged under beside its
/// count and is carried over at its next decision, at that decision's
/// reading (guard-core carries every key over at the reconfiguration's).
pub struct RedisFixedWindow {
    conn: RedisConnection,
    prefix: String,
    params: RwLock<WindowParams>,
    script: Script,
}

impl fmt::Debug for RedisFixedWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFixedWindow")
            .field("prefix", &self.prefix)
            .field("params", &self.params())
            .finish()
    }
}

impl RedisFixedWindow {
    /// A fixed window with guard-core's parameters; its period and offset
    /// must be whole numbers of microseconds.
    pub fn new(conn: RedisConnection, window: FixedWindow) -> Result<Self, RedisGuardError> {
        Ok(RedisFixedWindow {
            conn,
            prefix: FIXED_WINDOW_PREFIX.to_owned(),
            params: RwLock::new(WindowParams::of(&window)?),
            script: Script::new(&Self::script_source()),
        })
    }

    /// Whether `window` can run on Redis (the rule [`new`](Self::new)
    /// applies), for a caller that validates parameters before it
    /// connects.
    pub fn runs_on_redis(window: &FixedWindow) -> Result<(), RedisGuardError> {
        WindowParams::of(window).map(|_| ())
    }

    /// Keys under `prefix` instead of [`FIXED_WINDOW_PREFIX`].
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, RedisGuardError> {
        self.prefix = checked_prefix(prefix)?;
        Ok(self)
    }

    fn params(&self) -> WindowParams {
        *self.params.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The parameters every key is limited by now.
    pub fn window(&self) -> FixedWindow {
        self.params().window()
    }

    /// Replaces the parameters (see the type's notes). Refused, keeping
    /// the old ones, when Redis cannot represent them.
    pub fn reconfigure(&self, window: FixedWindow) -> Result<(), RedisGuardError> {
        let params = WindowParams::of(&window)?;
        *self.params.write().unwrap_or_else(PoisonError::into_inner) = params;
        Ok(())
    }

    /// The script each decision runs (KEYS: the count; ARGV: now in µs or
    /// empty for the server's clock, the period and the offset in µs, the
    /// limit, the cost). It replies the five values of
    /// [`RedisBucket::script_source`](super::RedisBucket::script_source).
    pub fn script_source() -> String {
        format!("{}{FIXED}", now_preamble())
    }

    /// The Redis key of `key`.
    pub fn redis_key(&self, key: &str) -> Result<String, RedisGuardError> {
        // The suffix keeps it apart from a sliding window's log under the
        // same prefix and key (the gateway's policies share one prefix).
        Ok(format!("{}:{{{}}}:fw", self.prefix, checked_key(key)?))
    }

    /// Decides one unit for `key`: one round trip.
    pub async fn check(&self, key: &str, clock: Clock) -> Result<Decision, RedisGuardError> {
        Ok(self.check_n(key, 1, clock).await?.decision)
    }

    /// Decides `cost` units for `key`, all or nothing, with the key's
    /// limit, remaining units and the time until its window ends: one
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

    fn invocation(
        &self,
        key: &str,
        cost: u32,
        clock: Clock,
    ) -> Result<ScriptInvocation<'_>, RedisGuardError> {
        let params = self.params();
        let cost = checked_cost(cost, params.limit)?;
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(self.redis_key(key)?)
            .arg(clock.arg())
            .arg(params.period_us)
            .arg(params.offset_us)
            .arg(params.limit)
            .arg(cost);
        Ok(invocation)
    }
}

impl guard_std::ratelimit::RateLimiter for RedisFixedWindow {
    /// Decides on the Redis server's clock: every replica agrees, and the
    /// windows align to the Unix epoch.
    fn check_n<'a>(&'a self, key: &'a str, cost: u32) -> guard_std::ratelimit::LimitFuture<'a> {
        guard_std::ratelimit::LimitFuture::Pending(Box::pin(async move {
            RedisFixedWindow::check_n(self, key, cost, Clock::Server)
                .await
                .map_err(limit_error)
        }))
    }

    fn quota(&self) -> Quota {
        self.window().quota()
    }

    fn reconfigure(&self, quota: Quota) -> Result<(), ReconfigureError> {
        RedisFixedWindow::reconfigure(self, FixedWindow::from_quota(quota)?)
            .map_err(reconfigure_error)
    }
}

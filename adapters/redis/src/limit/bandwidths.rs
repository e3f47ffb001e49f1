//! Several token buckets on one key, all or nothing, in one script call:
//! guard-core's [`Bandwidths`] on Redis.

use std::fmt;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use guard_core::limit::{Bandwidths, Decision, Report, TokenBucket};
use redis::{Script, ScriptInvocation};

use guard_std::BoxFuture;
use guard_std::ratelimit::{EachResult, FromQuota, LimitFuture, Quota, ReconfigureError};

use super::{
    BucketParams, Clock, GCRA_FUNCTIONS, checked_cost, checked_key, checked_prefix, limit_error,
    now_preamble,
};
use crate::connection::RedisConnection;
use crate::error::RedisGuardError;

/// The default key prefix of bandwidths.
pub const BANDWIDTHS_PREFIX: &str = "guard:bw";

/// Every bandwidth of a key: KEYS[i] the i-th bucket; ARGV: now, cost,
/// then each bucket's interval and capacity.
///
/// Each bucket decides on the functions of [`GCRA_FUNCTIONS`]; the request
/// is taken from every bucket only if each admits it. Returns `{admitted
/// (1 or 0), retry after, then limit, remaining, reset after of each
/// bucket}`, times in microseconds; retry after is the longest of the
/// refusing buckets' waits, 0 when admitted.
const BANDWIDTHS: &str = r"
local cost = tonumber(ARGV[2])
local tats, intervals, capacities = {}, {}, {}
local wait = 0
for i = 1, #KEYS do
  local interval = tonumber(ARGV[1 + 2 * i])
  local capacity = tonumber(ARGV[2 + 2 * i])
  local tat, bad = settle_of(KEYS[i], interval, capacity)
  if not tat then return redis.error_reply(bad) end
  tats[i], intervals[i], capacities[i] = tat, interval, capacity
  if cost > 0 then
    local from = admit_from(tat, interval, capacity, cost)
    if from - now > wait then wait = from - now end
  end
end
local admitted = 1
if wait > 0 then admitted = 0 end
local reply = {admitted, wait}
for i = 1, #KEYS do
  local t = tats[i]
  if admitted == 1 and cost > 0 then
    t = take(KEYS[i], t, intervals[i], capacities[i], cost)
  end
  reply[#reply + 1] = capacities[i]
  reply[#reply + 1] = room(t, intervals[i], capacities[i])
  reply[#reply + 1] = reset(t)
end
return reply
";

/// Several token buckets on one key (10 a second and 1,000 an hour),
/// deciding as guard-core's [`Bandwidths`] of [`TokenBucket`]s does: a
/// request is admitted only if every bucket admits it, counted in all of
/// them then and in none when refused, with the longest of the refusals'
/// waits. One round trip a decision; the buckets of a key share its hash
/// slot.
///
/// Keys: `<prefix>:{<key>}:bw<i>` for the i-th bucket, each kept as
/// [`RedisTokenBucket`](crate::RedisTokenBucket)'s are (its settle instant
/// and the parameters it was kept under, carried over when they change;
/// expired once settled).
pub struct RedisBandwidths {
    conn: RedisConnection,
    prefix: String,
    params: RwLock<Vec<BucketParams>>,
    script: Script,
}

impl fmt::Debug for RedisBandwidths {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBandwidths")
            .field("prefix", &self.prefix)
            .field("params", &self.params())
            .finish()
    }
}

impl RedisBandwidths {
    /// The bandwidths of `policy`; each refill interval must be a whole
    /// number of microseconds.
    pub fn new<const N: usize>(
        conn: RedisConnection,
        policy: Bandwidths<TokenBucket, N>,
    ) -> Result<Self, RedisGuardError> {
        Ok(RedisBandwidths {
            conn,
            prefix: BANDWIDTHS_PREFIX.to_owned(),
            params: RwLock::new(Self::params_of(&policy)?),
            script: Script::new(&Self::script_source()),
        })
    }

    fn params_of<const N: usize>(
        policy: &Bandwidths<TokenBucket, N>,
    ) -> Result<Vec<BucketParams>, RedisGuardError> {
        policy.limits().iter().map(BucketParams::of).collect()
    }

    fn params(&self) -> Vec<BucketParams> {
        self.params
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Keys under `prefix` instead of [`BANDWIDTHS_PREFIX`].
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, RedisGuardError> {
        self.prefix = checked_prefix(prefix)?;
        Ok(self)
    }

    /// Replaces the bandwidths: the i-th bucket of every key carries its
    /// state over to the i-th new one at its next decision (a bucket past
    /// the old count starts new). Refused, keeping the old ones, when Redis
    /// cannot represent them.
    pub fn reconfigure<const N: usize>(
        &self,
        policy: Bandwidths<TokenBucket, N>,
    ) -> Result<(), RedisGuardError> {
        let params = Self::params_of(&policy)?;
        *self.params.write().unwrap_or_else(PoisonError::into_inner) = params;
        Ok(())
    }

    /// The script each decision runs (KEYS: one per bucket; ARGV: now in
    /// microseconds or empty for the server's clock, the cost, then each
    /// bucket's interval in microseconds and capacity). It replies
    /// admitted (1 or 0) and the retry after, then each bucket's limit,
    /// remaining units and reset after, times in microseconds.
    pub fn script_source() -> String {
        format!("{}{GCRA_FUNCTIONS}{BANDWIDTHS}", now_preamble())
    }

    /// The Redis keys of `key`, one per bucket.
    pub fn redis_keys(&self, key: &str) -> Result<Vec<String>, RedisGuardError> {
        let key = checked_key(key)?;
        Ok((0..self.params().len())
            .map(|i| format!("{}:{{{key}}}:bw{i}", self.prefix))
            .collect())
    }

    /// Decides one request for `key`: one round trip.
    pub async fn check(&self, key: &str, clock: Clock) -> Result<Decision, RedisGuardError> {
        Ok(self.check_n(key, 1, clock).await?.decision)
    }

    /// Decides `cost` units for `key`, all or nothing, with the report of
    /// the tightest bucket ([`Report::tightest`]): one round trip.
    pub async fn check_n(
        &self,
        key: &str,
        cost: u32,
        clock: Clock,
    ) -> Result<Report, RedisGuardError> {
        let reports = self.check_each(key, cost, clock).await?;
        Report::tightest(&reports)
            .ok_or_else(|| RedisGuardError::UnexpectedReply("no bandwidth reported".to_owned()))
    }

    /// Decides `cost` units for `key`, all or nothing, with every bucket's
    /// report in the order given: one round trip. A cost above any
    /// bucket's capacity is refused before anything is sent.
    pub async fn check_each(
        &self,
        key: &str,
        cost: u32,
        clock: Clock,
    ) -> Result<Vec<Report>, RedisGuardError> {
        let params = self.params();
        let invocation = self.invocation(key, cost, clock, &params)?;
        let reply: Vec<i64> = self.conn.invoke(&invocation).await?;
        reports(&reply, params.len())
    }

    fn invocation(
        &self,
        key: &str,
        cost: u32,
        clock: Clock,
        params: &[BucketParams],
    ) -> Result<ScriptInvocation<'_>, RedisGuardError> {
        for p in params {
            checked_cost(cost, p.capacity)?;
        }
        let mut invocation = self.script.prepare_invoke();
        for k in self.redis_keys(key)? {
            invocation.key(k);
        }
        invocation.arg(clock.arg()).arg(cost);
        for p in params {
            invocation.arg(p.interval_us).arg(p.capacity);
        }
        Ok(invocation)
    }
}

/// Several bandwidths for guard-std's callers (guard-tower's layer, one
/// `RateLimit` entry per bandwidth), on the Redis server's clock so every
/// replica agrees. Its `quota` is the first bandwidth's; a new policy is
/// set with [`RedisBandwidths::reconfigure`], as one quota cannot say
/// which bandwidth to change.
impl guard_std::ratelimit::RateLimiter for RedisBandwidths {
    fn check_n<'a>(&'a self, key: &'a str, cost: u32) -> LimitFuture<'a> {
        LimitFuture::Pending(Box::pin(async move {
            RedisBandwidths::check_n(self, key, cost, Clock::Server)
                .await
                .map_err(limit_error)
        }))
    }

    fn quota(&self) -> Quota {
        self.params()
            .first()
            .map(|p| p.token_bucket().quota())
            .unwrap_or_else(|| unreachable!("a policy has at least one bandwidth"))
    }

    fn reconfigure(&self, _: Quota) -> Result<(), ReconfigureError> {
        Err(ReconfigureError::SeveralBandwidths {
            bandwidths: self.params().len(),
        })
    }

    fn bandwidths(&self) -> Option<Vec<Quota>> {
        Some(
            self.params()
                .iter()
                .map(|p| p.token_bucket().quota())
                .collect(),
        )
    }

    fn check_each<'a>(&'a self, key: &'a str, cost: u32) -> BoxFuture<'a, EachResult> {
        Box::pin(async move {
            RedisBandwidths::check_each(self, key, cost, Clock::Server)
                .await
                .map_err(limit_error)
        })
    }
}

/// The script's reply as one report per bucket.
fn reports(reply: &[i64], buckets: usize) -> Result<Vec<Report>, RedisGuardError> {
    let unexpected = || RedisGuardError::UnexpectedReply(format!("{reply:?}"));
    let micros = |us: i64| Duration::from_micros(us.max(0).unsigned_abs());
    let (&[admitted, retry_us], each) = reply.split_first_chunk::<2>().ok_or_else(unexpected)?;
    if each.len() != 3 * buckets {
        return Err(unexpected());
    }
    let decision = match admitted {
        1 => Decision::Allowed,
        // At least one microsecond, the script's resolution.
        0 => Decision::Denied {
            retry_after: micros(retry_us).max(Duration::from_micros(1)),
        },
        _ => return Err(unexpected()),
    };
    each.chunks_exact(3)
        .map(|bucket| {
            let &[limit, remaining, reset_us] = bucket else {
                return Err(unexpected());
            };
            Ok(Report {
                decision,
                limit: u32::try_from(limit).map_err(|_| unexpected())?,
                remaining: u32::try_from(remaining).map_err(|_| unexpected())?,
                reset_after: micros(reset_us),
            })
        })
        .collect()
}

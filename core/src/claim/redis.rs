//! The Redis layout of a claim record and its scripts: the one source for
//! every Redis claim store.
//!
//! A record key (`<prefix>claim:<scope>:<delivery key>`) is laid out as a
//! lock key is ([`RedisKeys`](crate::lock::redis::RedisKeys)): the record
//! at `<prefix>{<domain>}:<last>`, a hash, and fences drawn from the
//! domain's counter `<prefix>fence:{<domain>}` as a lock's are (so they
//! never go backwards when the counter is lost, within the limit stated
//! in [`crate::lock::redis`]). The hash's fields:
//!
//! | field | what |
//! |---|---|
//! | `s` | `r` running, `f` failed, `d` done |
//! | `t` | the running or last attempt's token, 32 hex digits |
//! | `f` | its fence |
//! | `n` | its attempt number |
//! | `u` | while running: the lease's end, ms on the server's clock |
//! | `v` | when done: the result (absent for none) |
//!
//! Each write sets the hash's expiry: `max(lease, keep)` at a begin,
//! `keep` when settled, and never below the lease at an extend. Leases
//! run on the server's clock (`TIME`), so replicas' clocks do not matter.
//! Requires Redis 5 or later (scripts replicate their effects).

/// Begins an attempt. KEYS: record, fence counter; ARGV: token hex, lease
/// ms, keep ms. Returns `{1, fence, attempt, after}` (after: 0 fresh, 1
/// after a failure, 2 after an expiry), `{2, lease ms left}` or `{3,
/// result}`; an error reply for a record it does not know.
pub const BEGIN_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local r = redis.call('HMGET', KEYS[1], 's', 'u', 'n', 'v')
local after = 0
if r[1] == 'd' then
  return {3, r[4] or ''}
elseif r[1] == 'r' then
  local left = (tonumber(r[2]) or 0) - now
  if left > 0 then return {2, left} end
  after = 2
elseif r[1] == 'f' then
  after = 1
elseif r[1] then
  return redis.error_reply('guard: claim record ' .. KEYS[1] .. ' has unknown state ' .. tostring(r[1]))
end
local f = math.max((tonumber(redis.call('GET', KEYS[2])) or 0) + 1, t[1] * 1000000 + t[2])
redis.call('SET', KEYS[2], string.format('%.0f', f))
local n = (tonumber(r[3]) or 0) + 1
local lease = tonumber(ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'r', 't', ARGV[1], 'f', string.format('%.0f', f), 'n', n,
  'u', string.format('%.0f', now + lease))
redis.call('PEXPIRE', KEYS[1], math.max(lease, tonumber(ARGV[3])))
return {1, f, n, after}
";

/// Extends a running lease that has not ended. KEYS: record; ARGV: token
/// hex, lease ms. Returns 1 if extended.
pub const EXTEND_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local r = redis.call('HMGET', KEYS[1], 's', 't', 'u')
if r[1] == 'r' and r[2] == ARGV[1] and (tonumber(r[3]) or 0) > now then
  local lease = tonumber(ARGV[2])
  redis.call('HSET', KEYS[1], 'u', string.format('%.0f', now + lease))
  if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], lease) end
  return 1
end
return 0
";

/// Settles the attempt that holds the record, even past its lease.
/// KEYS: record; ARGV: token hex, keep ms, state (`d` or `f`), result
/// (done only; empty for none). Returns 1 if recorded.
pub const SETTLE_SCRIPT: &str = r"
local r = redis.call('HMGET', KEYS[1], 's', 't')
if r[1] == 'r' and r[2] == ARGV[1] then
  redis.call('HSET', KEYS[1], 's', ARGV[3])
  redis.call('HDEL', KEYS[1], 'u')
  if ARGV[3] == 'd' and ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'v', ARGV[4]) end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
";

/// `s` of a done record, the SETTLE script's third argument.
pub const DONE: &str = "d";

/// `s` of a failed record, the SETTLE script's third argument.
pub const FAILED: &str = "f";

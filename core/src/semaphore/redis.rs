//! The Redis layout of a semaphore and its scripts: the one source for
//! every Redis semaphore.
//!
//! A semaphore key is laid out as a lock key is
//! ([`RedisKeys`](crate::lock::redis::RedisKeys)): its permits in a hash
//! at `<prefix>{<domain>}:<last>`, fences drawn from the domain's counter
//! `<prefix>fence:{<domain>}` as a lock's are (so they never go backwards
//! when the counter is lost, within the limit stated in
//! [`crate::lock::redis`]). The hash has one field a permit: the token id
//! (32 hex digits), whose value is the end of its lease in ms on the
//! server's clock (`TIME`), so replicas' clocks do not matter.
//!
//! An acquisition deletes the fields whose leases ended, counts the rest
//! and adds its own if fewer than the permits are left, all in one
//! script. The hash expires with its longest lease, so a semaphore nobody
//! holds leaves nothing behind. Requires Redis 5 or later (scripts
//! replicate their effects, so `TIME` may precede a write).

/// Puts before a script's body the server's clock in ms (`now`, and
/// `t` as `TIME` answered), `lease_ms`, which reads a lease and refuses
/// one a Lua number cannot hold exactly (before anything is written), and
/// `lease_end`, which reads a permit's lease end and refuses a field that
/// is not one (a foreign key in the way).
macro_rules! with_prelude {
    ($body:literal) => {
        concat!(
            r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local function lease_ms(v)
  local ms = tonumber(v)
  if not ms or ms < 1 or ms >= 9007199254740992 then
    return error('guard: semaphore ' .. KEYS[1] .. ': a lease is 1 ms to 2^53 ms, not ' .. tostring(v))
  end
  return ms
end
local function lease_end(v)
  local u = tonumber(v)
  if not u then
    return error('guard: semaphore ' .. KEYS[1] .. ' holds a field that is not a lease end: ' .. tostring(v))
  end
  return u
end
",
            $body
        )
    };
}

/// Takes a permit if fewer than the permits are live. KEYS: hash, fence
/// counter; ARGV: token hex, permits, lease ms (below 2^53, else an error
/// before any write). Returns the fence, or 0 when the permits are taken.
pub const ACQUIRE_SCRIPT: &str = with_prelude!(
    r"
local lease = lease_ms(ARGV[3])
local held = redis.call('HGETALL', KEYS[1])
local live = 0
for i = 1, #held, 2 do
  if lease_end(held[i + 1]) > now then
    live = live + 1
  else
    redis.call('HDEL', KEYS[1], held[i])
  end
end
if live >= tonumber(ARGV[2]) then return 0 end
local f = math.max((tonumber(redis.call('GET', KEYS[2])) or 0) + 1, t[1] * 1000000 + t[2])
redis.call('SET', KEYS[2], string.format('%.0f', f))
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now + lease))
if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return f
"
);

/// Resets a live permit's lease. KEYS: hash; ARGV: token hex, lease ms.
/// Returns 1 if renewed.
pub const RENEW_SCRIPT: &str = with_prelude!(
    r"
local lease = lease_ms(ARGV[2])
local u = redis.call('HGET', KEYS[1], ARGV[1])
if u and lease_end(u) > now then
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now + lease))
  if redis.call('PTTL', KEYS[1]) < lease then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  return 1
end
return 0
"
);

/// Gives a live permit back. KEYS: hash; ARGV: token hex. Returns 1 if
/// released.
pub const RELEASE_SCRIPT: &str = with_prelude!(
    r"
local u = redis.call('HGET', KEYS[1], ARGV[1])
if u and lease_end(u) > now then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"
);

/// Counts the live permits. KEYS: hash. Returns the count.
pub const HOLDERS_SCRIPT: &str = with_prelude!(
    r"
local held = redis.call('HVALS', KEYS[1])
local live = 0
for _, v in ipairs(held) do
  if lease_end(v) > now then live = live + 1 end
end
return live
"
);

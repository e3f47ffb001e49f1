//! The Redis layout of a shared breaker and its scripts: the one source
//! for every Redis breaker.
//!
//! A breaker shared by replicas is one string key holding its snapshot
//! ([`CircuitBreaker::encode`](super::CircuitBreaker::encode)); a key
//! that does not exist is a new, closed breaker. A replica reads the
//! snapshot with the server's clock ([`READ_SCRIPT`]), decides with
//! guard-core's breaker, and writes the new snapshot back only if the key
//! still holds what it read ([`SWAP_SCRIPT`]); when another replica wrote
//! first it gets the new snapshot in the same reply and decides again.
//! So the replicas' decisions are one breaker's, in the order their
//! writes landed, on the server's clock. The key never expires: a breaker
//! is one key per protected service.

/// Reads the snapshot and the server's clock. KEYS: the breaker. Returns
/// `{snapshot or false, seconds, microseconds}`.
pub const READ_SCRIPT: &str = r"
local t = redis.call('TIME')
return {redis.call('GET', KEYS[1]), t[1], t[2]}
";

/// Writes a new snapshot if the key holds the one read. KEYS: the
/// breaker; ARGV: the snapshot read (empty for none), the new one.
/// Returns `{1}` if written, else `{0, snapshot or false, seconds,
/// microseconds}`: what to decide on again.
pub const SWAP_SCRIPT: &str = r"
local held = redis.call('GET', KEYS[1])
if (held or '') == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return {1}
end
local t = redis.call('TIME')
return {0, held, t[1], t[2]}
";

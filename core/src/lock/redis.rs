//! The Redis layout of a fenced lock, shared by every Redis locker: the
//! server one (guard-redis, on the `redis` crate) and the embedded one
//! (guard-embassy's `RespLocker`, on a raw RESP2 connection). Both use
//! these keys and scripts, so an MCU gateway and a server replica exclude
//! each other on one Redis and draw fences from one counter.
//!
//! A lock key is split at its last `:` into a *domain* and a last segment
//! (`guard:once:<scope>` and `<slot>`, say). The lock is stored at
//! `<prefix>{<domain>}:<last>` and the domain's fence counter at
//! `<prefix>fence:{<domain>}`: the hash tag puts both in one cluster slot,
//! and every key of a domain (every slot of one schedule) shares one
//! counter, so unique keys do not leave one counter each behind. A key
//! without `:` is its own domain (`{<key>}`).
//!
//! The value of a lock is its token id as 32 lowercase hex digits.
//!
//! # Fences that never go backwards
//!
//! A fence is `max(counter + 1, TIME in microseconds)` of the server that
//! grants, and that value becomes the counter. While the counter survives,
//! fences strictly increase as with a plain counter. When it does not (a
//! restart without persistence, a failover to a replica that had not
//! received the last grants), the next grant starts from the server's
//! clock, which has moved past every earlier grant's clock reading. No
//! persistence is needed.
//!
//! **The exact limit.** After the counter is lost, a fence can repeat or
//! go backwards only if the granting server's clock (µs since the Unix
//! epoch) reads no more than the largest fence issued before the loss:
//! that is, if its clock is behind the clock of the server that issued
//! that fence, at that grant, by more than the time that has passed
//! between the two grants (a clock stepped back, or a promoted replica
//! whose clock lags its old primary by more than the failover takes). The
//! counter itself runs ahead of the clock only when one domain is granted
//! more than once per microsecond. Requires Redis 5 or later (scripts
//! replicate their effects, so `TIME` may precede a write).
//!
//! # A grant outlives its key
//!
//! Beside each lock, its *grant record* `<prefix>grant:{<domain>}:<last>`
//! holds the token of the last grant and expires when that grant does
//! (set at every grant and renewal, with the same TTL). An acquisition is
//! refused while the record lives, whether the lock key is there or not:
//! a lock key deleted by hand, evicted or flushed alone leaves the record,
//! so nobody is granted the key while its holder may still believe it
//! holds it, and the holder's next renewal, finding its key gone, tells
//! it so. A release deletes the record with the lock (the holder believes
//! nothing any more).
//!
//! **The limit.** The record protects only while it survives the loss of
//! the lock key: a loss of both (a `FLUSHALL`, a restart without
//! persistence, a failover to a replica that never received them, an
//! eviction of both) can grant the key again while its old holder still
//! believes it, until that holder's next renewal, unless the quarantine
//! below is on. An operator who frees a stuck lock by hand deletes both
//! keys (or waits for the record's TTL).
//!
//! # A lost store waits one TTL (opt-in)
//!
//! The fence counter has no TTL: once a domain has granted, only a loss
//! of the store's data (or of the counter itself) removes it. With the
//! quarantine on, an acquisition that finds no counter takes it for such
//! a loss: it writes the counter (from `TIME`, as a grant would) and a
//! quarantine record `<prefix>quarantine:{<domain>}` that lives for the
//! acquisition's TTL, and refuses, as every acquisition in the domain does
//! while the record lives. Any holder the lost store had granted has then
//! seen its lease end (a holder believes a grant for at most its TTL, and
//! every caller of the domain asks for the same TTL), so no two grants
//! overlap even across a `FLUSHALL`. **The cost:** one TTL without a
//! holder after the store lost its data, and before the first grant of a
//! domain that has never granted (a new deployment, a new schedule); a
//! caller that asks for a shorter TTL than an earlier holder's shortens
//! the wait to its own.

use core::fmt;

/// Takes the lock (`SET NX PX`) unless its grant record lives (see the
/// module notes) and, if taken, writes the grant record and advances the
/// fence to `max(counter + 1, TIME in µs)`; the keys share a hash slot,
/// so this is one atomic script in a cluster too. KEYS: lock, fence,
/// grant, and the quarantine record when `ARGV[3]` is `1`; ARGV: token hex,
/// TTL in ms, and `1` for the quarantine (see the module notes). Returns
/// the fence if granted; otherwise minus the ms left of the last grant
/// while its record lives (the key held, or lost before the grant's end)
/// or of the quarantine, and 0 for a lock key held without a record
/// (taken by an earlier version of the script).
///
/// Lua numbers are doubles: exact up to 2^53, which the clock in µs
/// reaches in the year 2255. Kept short: an embedded locker sends it
/// whole with every acquisition, with the three keys, in one buffer.
pub const ACQUIRE_SCRIPT: &str = r"
local g=redis.call('PTTL',KEYS[3])
if g>0 then return -g end
if ARGV[3]=='1' then
g=redis.call('PTTL',KEYS[4])
if g>0 then return -g end
if redis.call('EXISTS',KEYS[2])==0 then
local t=redis.call('TIME')
redis.call('SET',KEYS[2],string.format('%.0f',t[1]*1000000+t[2]))
redis.call('SET',KEYS[4],'1','PX',ARGV[2])
return -tonumber(ARGV[2])
end
end
if redis.call('SET',KEYS[1],ARGV[1],'NX','PX',ARGV[2]) then
local t=redis.call('TIME')
local f=math.max((tonumber(redis.call('GET',KEYS[2])) or 0)+1,t[1]*1000000+t[2])
redis.call('SET',KEYS[2],string.format('%.0f',f))
redis.call('SET',KEYS[3],ARGV[1],'PX',ARGV[2])
return f
end
return 0
";

/// Compare-and-delete: a stale holder never frees someone else's lock;
/// the holder's grant record goes with it. KEYS: lock, grant; ARGV: token
/// hex. Returns 1 if the lock was released.
pub const RELEASE_SCRIPT: &str = r"
if redis.call('GET',KEYS[2])==ARGV[1] then redis.call('DEL',KEYS[2]) end
if redis.call('GET',KEYS[1])==ARGV[1] then
return redis.call('DEL',KEYS[1])
end
return 0
";

/// Compare-and-extend, the grant record with the lock. KEYS: lock,
/// grant; ARGV: token hex, TTL in ms. Returns 1 if still held.
pub const RENEW_SCRIPT: &str = r"
if redis.call('GET',KEYS[1])==ARGV[1] then
redis.call('SET',KEYS[2],ARGV[1],'PX',ARGV[2])
return redis.call('PEXPIRE',KEYS[1],ARGV[2])
end
return 0
";

/// A lock key or prefix that cannot be stored so that the lock and its
/// fence counter share one Redis Cluster slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum InvalidRedisKey {
    /// The lock key is empty.
    Empty,
    /// The prefix contains `{` or `}`, which would move the hash tag.
    BraceInPrefix,
    /// The key's domain (the part before its last `:`, or the whole key)
    /// starts with `}`: the hash tag `{}` would be empty, so Redis would
    /// hash the lock and the fence counter by their whole names.
    DomainStartsWithBrace,
}

impl fmt::Display for InvalidRedisKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InvalidRedisKey::Empty => "a lock key must not be empty",
            InvalidRedisKey::BraceInPrefix => {
                "a Redis key prefix must not contain '{' or '}' (they would move the cluster hash tag)"
            }
            InvalidRedisKey::DomainStartsWithBrace => {
                "a lock key's domain (before its last ':') must not start with '}' (the cluster hash tag would be empty)"
            }
        })
    }
}

impl core::error::Error for InvalidRedisKey {}

/// Checks a Redis key prefix (see [`InvalidRedisKey::BraceInPrefix`]).
pub fn check_prefix(prefix: &str) -> Result<(), InvalidRedisKey> {
    if prefix.contains(['{', '}']) {
        return Err(InvalidRedisKey::BraceInPrefix);
    }
    Ok(())
}

/// The Redis keys of one lock key; see the module documentation.
///
/// ```
/// use guard_core::lock::redis::RedisKeys;
///
/// let keys = RedisKeys::new("prod1:", "guard:once:report:1700000000000")?;
/// assert_eq!(keys.lock().to_string(), "prod1:{guard:once:report}:1700000000000");
/// assert_eq!(keys.fence().to_string(), "prod1:fence:{guard:once:report}");
/// assert_eq!(keys.grant().to_string(), "prod1:grant:{guard:once:report}:1700000000000");
/// assert_eq!(keys.quarantine().to_string(), "prod1:quarantine:{guard:once:report}");
/// # Ok::<(), guard_core::lock::redis::InvalidRedisKey>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedisKeys<'a> {
    prefix: &'a str,
    domain: &'a str,
    last: Option<&'a str>,
}

impl<'a> RedisKeys<'a> {
    /// The keys of `key` under `prefix` (empty for none); refuses what
    /// would split the lock and its counter across cluster slots.
    pub fn new(prefix: &'a str, key: &'a str) -> Result<Self, InvalidRedisKey> {
        if key.is_empty() {
            return Err(InvalidRedisKey::Empty);
        }
        check_prefix(prefix)?;
        let (domain, last) = match key.rsplit_once(':') {
            Some((domain, last)) if !domain.is_empty() => (domain, Some(last)),
            _ => (key, None),
        };
        if domain.starts_with('}') {
            return Err(InvalidRedisKey::DomainStartsWithBrace);
        }
        Ok(RedisKeys {
            prefix,
            domain,
            last,
        })
    }

    /// The lock's key.
    pub fn lock(&self) -> impl fmt::Display + '_ {
        LockKey(self)
    }

    /// The domain's fence counter.
    pub fn fence(&self) -> impl fmt::Display + '_ {
        FenceKey(self)
    }

    /// The lock's grant record (see the module notes).
    pub fn grant(&self) -> impl fmt::Display + '_ {
        GrantKey(self)
    }

    /// The domain's quarantine record (see the module notes).
    pub fn quarantine(&self) -> impl fmt::Display + '_ {
        QuarantineKey(self)
    }
}

struct QuarantineKey<'k, 'a>(&'k RedisKeys<'a>);

impl fmt::Display for QuarantineKey<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}quarantine:{{{}}}", self.0.prefix, self.0.domain)
    }
}

struct LockKey<'k, 'a>(&'k RedisKeys<'a>);

impl fmt::Display for LockKey<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = self.0;
        write!(f, "{}{{{}}}", k.prefix, k.domain)?;
        match k.last {
            Some(last) => write!(f, ":{last}"),
            None => Ok(()),
        }
    }
}

struct FenceKey<'k, 'a>(&'k RedisKeys<'a>);

impl fmt::Display for FenceKey<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}fence:{{{}}}", self.0.prefix, self.0.domain)
    }
}

struct GrantKey<'k, 'a>(&'k RedisKeys<'a>);

impl fmt::Display for GrantKey<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = self.0;
        write!(f, "{}grant:{{{}}}", k.prefix, k.domain)?;
        match k.last {
            Some(last) => write!(f, ":{last}"),
            None => Ok(()),
        }
    }
}

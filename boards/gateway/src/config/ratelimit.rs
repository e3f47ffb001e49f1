//! `[ratelimit]` and its policies: from the file as written to validated
//! limiters, and the lookups the endpoints and schedules that name one
//! make.

use std::time::Duration;

use guard_core::limit::{FixedWindow, LeakyBucket, Rate, SlidingWindow, TokenBucket};

use super::check::{bounded, printable};
use super::raw;
use super::{
    Backend, ConfigError, Cost, DEFAULT_MEMORY_KEYS, MemoryTables, Policy, PolicyAlgorithm,
    RateLimits, invalid,
};
use guard_std::ratelimit::SHARD_KEYS;

/// The longest window of a sliding or fixed window: a week.
const MAX_WINDOW_MS: u64 = 7 * 24 * 3600 * 1000;

/// The policy `name` among `limiters`, for the key `key` that names it.
pub(crate) fn limiter<'a>(
    key: &str,
    name: &str,
    limiters: &[&'a Policy],
) -> Result<&'a Policy, ConfigError> {
    if let Some(policy) = limiters.iter().find(|p| p.name == name) {
        return Ok(policy);
    }
    let expected = if limiters.is_empty() {
        "a limiter, but none exists: set [ratelimit] enabled = true".to_owned()
    } else {
        let names: Vec<&str> = limiters.iter().map(|p| p.name.as_str()).collect();
        format!("one of the limiters: {}", names.join(", "))
    };
    Err(invalid(key, format!("{name:?}"), expected))
}

/// Refuses a policy that counts bytes for messages of up to
/// `max_payload_bytes` when its quota is smaller: such a message could
/// never pass. `key` is the endpoint's `limit`.
pub(super) fn bytes_fit(
    key: &str,
    policy: &Policy,
    max_payload_bytes: usize,
) -> Result<(), ConfigError> {
    let quota = policy.algorithm.quota();
    if policy.cost == Cost::Bytes && usize::try_from(quota).is_ok_and(|q| q < max_payload_bytes) {
        return Err(invalid(
            key,
            format!("{:?}", policy.name),
            format!(
                "a limiter whose quota covers one message: {:?} counts bytes with a quota of \
                 {quota}, below this endpoint's max_payload_bytes = {max_payload_bytes}, so a \
                 message that large could never pass (raise the quota or lower \
                 max_payload_bytes)",
                policy.name
            ),
        ));
    }
    Ok(())
}

pub(super) fn rate_limits(r: &raw::RateLimit) -> Result<RateLimits, ConfigError> {
    let memory = memory_tables(r)?;
    if r.default_name.is_empty() {
        return Err(invalid(
            "ratelimit.default_name",
            "\"\"",
            "a non-empty name",
        ));
    }
    printable("ratelimit.default_name", &r.default_name)?;
    let mut policies = Vec::new();
    for (name, p) in &r.policies {
        let at = format!("ratelimit.policies.{name}");
        if name.is_empty() || name.chars().any(char::is_control) {
            return Err(invalid(
                at,
                format!("{name:?}"),
                "a non-empty policy name without control characters",
            ));
        }
        policies.push(policy(r, name, p, &at, memory)?);
    }
    if !r.policies.contains_key(&r.default_name) {
        // The top-level window and limit make the default limiter, as in
        // the original starter.
        let default = raw::Policy {
            algorithm: raw::Algorithm::Sliding,
            backend: None,
            window_ms: None,
            limit: None,
            capacity: None,
            rate_per_second: None,
            key_prefix: None,
            utc_offset: None,
            cost: None,
        };
        policies.push(policy(r, &r.default_name, &default, "ratelimit", memory)?);
    }
    Ok(RateLimits {
        policies,
        default_name: r.default_name.clone(),
        memory,
        fallback_to_memory: r.fallback_to_memory,
    })
}

/// `memory_keys` or `memory_bytes`, never both.
fn memory_tables(r: &raw::RateLimit) -> Result<MemoryTables, ConfigError> {
    match (r.memory_keys, r.memory_bytes) {
        (Some(_), Some(bytes)) => Err(invalid(
            "ratelimit.memory_bytes",
            bytes,
            "unset while ratelimit.memory_keys is set: size the tables in keys or in bytes",
        )),
        (Some(0), None) => Err(invalid(
            "ratelimit.memory_keys",
            0,
            "a positive number of keys",
        )),
        (Some(keys), None) => usize::try_from(keys)
            .ok()
            .filter(|&keys| keys <= MAX_MEMORY_KEYS)
            .map(MemoryTables::Keys)
            .ok_or_else(|| {
                invalid(
                    "ratelimit.memory_keys",
                    keys,
                    format!("at most {MAX_MEMORY_KEYS} keys"),
                )
            }),
        (None, Some(bytes)) => usize::try_from(bytes)
            .map(MemoryTables::Bytes)
            .map_err(|_| invalid("ratelimit.memory_bytes", bytes, "fewer bytes")),
        (None, None) => Ok(MemoryTables::Keys(DEFAULT_MEMORY_KEYS)),
    }
}

/// The most keys `memory_keys` may give a table: 2^28, a table of
/// several GiB for the smallest algorithm.
const MAX_MEMORY_KEYS: usize = 1 << 28;

/// The keys `algorithm`'s in-memory table holds under `memory`; a size
/// in bytes that holds no whole shard is refused, naming the least that
/// does. `at` is the policy's place.
fn table_keys(
    at: &str,
    algorithm: &PolicyAlgorithm,
    memory: MemoryTables,
) -> Result<usize, ConfigError> {
    match memory {
        MemoryTables::Keys(keys) => Ok(keys),
        MemoryTables::Bytes(bytes) => {
            let per_key = algorithm.memory_bytes_per_key();
            match bytes / per_key / SHARD_KEYS * SHARD_KEYS {
                0 => Err(invalid(
                    "ratelimit.memory_bytes",
                    bytes,
                    format!(
                        "at least {} bytes: the table of {at} holds whole shards of \
                         {SHARD_KEYS} keys at up to {per_key} bytes a key",
                        per_key * SHARD_KEYS
                    ),
                )),
                keys if keys > MAX_MEMORY_KEYS => Err(invalid(
                    "ratelimit.memory_bytes",
                    bytes,
                    format!(
                        "at most {} bytes: the table of {at} would hold more than \
                         {MAX_MEMORY_KEYS} keys",
                        MAX_MEMORY_KEYS.saturating_mul(per_key)
                    ),
                )),
                keys => Ok(keys),
            }
        }
    }
}

/// One policy; `at` is where its keys are written (`ratelimit` for the
/// default one, built from the top-level keys).
fn policy(
    r: &raw::RateLimit,
    name: &str,
    p: &raw::Policy,
    at: &str,
    memory: MemoryTables,
) -> Result<Policy, ConfigError> {
    let key = |field: &str| format!("{at}.{field}");
    let only = |set: bool, field: &str, algorithm: &str| {
        if set {
            Err(invalid(
                key(field),
                "set",
                format!("no `{field}` for algorithm {algorithm}"),
            ))
        } else {
            Ok(())
        }
    };
    let algorithm = match p.algorithm {
        raw::Algorithm::Sliding => {
            only(p.capacity.is_some(), "capacity", "sliding")?;
            only(p.rate_per_second.is_some(), "rate_per_second", "sliding")?;
            only(p.utc_offset.is_some(), "utc_offset", "sliding")?;
            if p.cost == Some(raw::Cost::Bytes) {
                return Err(invalid(
                    key("cost"),
                    "\"bytes\"",
                    "\"message\" for a sliding window, which keeps an instant per unit: \
                     count bytes with fixed-window or a bucket",
                ));
            }
            let window_ms = p.window_ms.unwrap_or(r.window_ms);
            let limit = p.limit.unwrap_or(r.limit);
            let window_key = if p.window_ms.is_some() {
                key("window_ms")
            } else {
                "ratelimit.window_ms".to_owned()
            };
            bounded(&window_key, window_ms, MAX_WINDOW_MS, "milliseconds")?;
            let window =
                SlidingWindow::new(Duration::from_millis(window_ms), limit).map_err(|_| {
                    invalid(
                        key("limit"),
                        limit,
                        format!("between 1 and {}", super::MAX_SLIDING_LIMIT),
                    )
                })?;
            PolicyAlgorithm::Sliding(window)
        }
        raw::Algorithm::FixedWindow => {
            only(p.capacity.is_some(), "capacity", "fixed-window")?;
            only(
                p.rate_per_second.is_some(),
                "rate_per_second",
                "fixed-window",
            )?;
            // A quota states its numbers: the sliding default is no
            // quota for anyone's uplink.
            let stated = |value: Option<u64>, field: &str| {
                value.ok_or_else(|| {
                    invalid(
                        key(field),
                        "missing",
                        "a positive number: a fixed-window policy states its window_ms and limit",
                    )
                })
            };
            let window_ms = stated(p.window_ms, "window_ms")?;
            let limit = stated(p.limit.map(u64::from), "limit")?;
            bounded(&key("window_ms"), window_ms, MAX_WINDOW_MS, "milliseconds")?;
            if limit == 0 {
                return Err(invalid(key("limit"), 0, "a positive number"));
            }
            let window = FixedWindow::new(
                Duration::from_millis(window_ms),
                u32::try_from(limit).unwrap_or(u32::MAX),
            )
            .map_err(|e| invalid(key("window_ms"), window_ms, e.to_string()))?;
            let window = match &p.utc_offset {
                None => window,
                Some(text) => {
                    let east = utc_offset(text).ok_or_else(|| {
                        invalid(key("utc_offset"), format!("{text:?}"), UTC_OFFSET)
                    })?;
                    window.with_utc_offset(east).map_err(|e| {
                        invalid(key("utc_offset"), format!("{text:?}"), e.to_string())
                    })?
                }
            };
            PolicyAlgorithm::FixedWindow(window)
        }
        raw::Algorithm::TokenBucket | raw::Algorithm::LeakyBucket => {
            let algorithm = if p.algorithm == raw::Algorithm::TokenBucket {
                "token-bucket"
            } else {
                "leaky-bucket"
            };
            only(p.window_ms.is_some(), "window_ms", algorithm)?;
            only(p.limit.is_some(), "limit", algorithm)?;
            only(p.utc_offset.is_some(), "utc_offset", algorithm)?;
            // A bucket states its numbers: none is made up for it.
            let stated = |value: Option<u32>, field: &str| {
                value.ok_or_else(|| {
                    invalid(
                        key(field),
                        "missing",
                        format!("a positive number: a {algorithm} policy states its capacity and rate_per_second"),
                    )
                })
            };
            let capacity = stated(p.capacity, "capacity")?;
            let per_second = stated(p.rate_per_second, "rate_per_second")?;
            if capacity == 0 {
                return Err(invalid(key("capacity"), 0, "a positive number"));
            }
            if per_second == 0 {
                return Err(invalid(key("rate_per_second"), 0, "a positive number"));
            }
            let rate = Rate::per_second(per_second);
            let refused = |e: guard_core::limit::LimiterError| {
                invalid(key("capacity"), capacity, e.to_string())
            };
            if p.algorithm == raw::Algorithm::TokenBucket {
                PolicyAlgorithm::TokenBucket(TokenBucket::new(capacity, rate).map_err(refused)?)
            } else {
                PolicyAlgorithm::LeakyBucket(LeakyBucket::new(capacity, rate).map_err(refused)?)
            }
        }
    };
    let key_prefix = p.key_prefix.clone().unwrap_or_else(|| r.key_prefix.clone());
    if key_prefix.trim().is_empty() || key_prefix.contains(['{', '}']) {
        return Err(invalid(
            key("key_prefix"),
            format!("{key_prefix:?}"),
            "a non-empty prefix without braces",
        ));
    }
    let backend = match p.backend.unwrap_or(r.backend) {
        raw::Backend::Memory => Backend::Memory,
        raw::Backend::Redis => Backend::Redis,
    };
    if backend == Backend::Redis {
        // Redis's own rule, applied here so that `run` starts what
        // `check` accepts.
        let runs = match &algorithm {
            PolicyAlgorithm::Sliding(w) => guard_redis::RedisSlidingWindow::runs_on_redis(w),
            PolicyAlgorithm::FixedWindow(w) => guard_redis::RedisFixedWindow::runs_on_redis(w),
            PolicyAlgorithm::TokenBucket(b) => guard_redis::RedisTokenBucket::runs_on_redis(b),
            PolicyAlgorithm::LeakyBucket(b) => guard_redis::RedisLeakyBucket::runs_on_redis(b),
        };
        if let Err(e) = runs {
            let (field, value) = match (&algorithm, p.rate_per_second) {
                (PolicyAlgorithm::Sliding(w), _) => {
                    ("window_ms", w.window().as_millis().to_string())
                }
                (PolicyAlgorithm::FixedWindow(w), _) => {
                    ("window_ms", w.period().as_millis().to_string())
                }
                (_, Some(rate)) => ("rate_per_second", rate.to_string()),
                (_, None) => ("capacity", "set".to_owned()),
            };
            return Err(invalid(
                key(field),
                value,
                format!("a value Redis can count: {e}"),
            ));
        }
    }
    let memory_keys = table_keys(at, &algorithm, memory)?;
    Ok(Policy {
        name: name.to_owned(),
        backend,
        algorithm,
        memory_keys,
        key_prefix,
        cost: match p.cost {
            None | Some(raw::Cost::Message) => Cost::Messages,
            Some(raw::Cost::Bytes) => Cost::Bytes,
        },
    })
}

/// What `utc_offset` accepts.
const UTC_OFFSET: &str = "an offset from UTC such as \"+02:00\", \"-05:00\" or \"Z\" \
                          (a fixed offset: windows do not follow daylight saving time)";

/// Seconds east of UTC of `"+HH:MM"`, `"-HH:MM"` or `"Z"`; `None` for
/// anything else (hours up to 23, minutes up to 59).
fn utc_offset(text: &str) -> Option<i32> {
    if text == "Z" {
        return Some(0);
    }
    let (sign, rest) = match text.as_bytes().first()? {
        b'+' => (1, &text[1..]),
        b'-' => (-1, &text[1..]),
        _ => return None,
    };
    let (hours, minutes) = rest.split_once(':')?;
    let two_digits = |s: &str| {
        (s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<i32>().ok())
            .flatten()
    };
    let (hours, minutes) = (two_digits(hours)?, two_digits(minutes)?);
    (hours < 24 && minutes < 60).then_some(sign * (hours * 3_600 + minutes * 60))
}

#[cfg(test)]
mod tests {
    use super::utc_offset;

    #[test]
    fn utc_offsets_are_read_strictly() {
        assert_eq!(utc_offset("Z"), Some(0));
        assert_eq!(utc_offset("+00:00"), Some(0));
        assert_eq!(utc_offset("+02:00"), Some(7_200));
        assert_eq!(utc_offset("-05:00"), Some(-18_000));
        assert_eq!(utc_offset("+05:30"), Some(19_800));
        assert_eq!(utc_offset("+14:00"), Some(50_400));
        for bad in [
            "",
            "+",
            "02:00",
            "+2:00",
            "+02",
            "+0200",
            "+24:00",
            "+02:60",
            "+02:00 ",
            "UTC",
            "Europe/Berlin",
            "+０２:00",
            "-",
        ] {
            assert_eq!(utc_offset(bad), None, "{bad:?}");
        }
    }
}

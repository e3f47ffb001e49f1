//! The response fields: `RateLimit-Policy` and `RateLimit` of
//! draft-ietf-httpapi-ratelimit-headers (revision 11), `Retry-After`, and
//! the legacy `X-RateLimit-*` trio.

use std::sync::OnceLock;
use std::time::Duration;

use guard_std::ratelimit::Quota;
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::error::ConfigError;

/// `RateLimit-Policy`: the policy's quota and window.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`: what is left of the quota, and for how long.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// Legacy `X-RateLimit-Limit` (the quota).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// Legacy `X-RateLimit-Remaining`.
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// Legacy `X-RateLimit-Reset`, in seconds from now.
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds, rounded up: a client told to wait never comes back early.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// `name` as a structured-field string (RFC 9651 §3.3.3): quoted, with `"`
/// and `\` escaped. The draft requires the policy item to be a String.
pub(crate) fn sf_string(name: &str) -> Result<String, ConfigError> {
    let refuse = |reason| ConfigError::PolicyName {
        value: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(refuse("is empty: a policy needs a name clients can match"));
    }
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => {
                return Err(refuse(
                    "has a character outside printable ASCII (0x20 to 0x7E), which a \
                     structured-field string cannot carry",
                ));
            }
        }
    }
    out.push('"');
    Ok(out)
}

/// The `w` of a quota: the seconds its `q` units are spread over, rounded
/// up to at least one (the draft's window is a positive whole number of
/// seconds). A bucket's is the time an emptied bucket takes to refill
/// (`capacity` intervals); a window's is its width or length. `None` for a rate the
/// limiter would have refused.
pub(crate) fn window_secs(quota: &Quota) -> Option<u64> {
    let nanos: u128 = match quota {
        Quota::TokenBucket { capacity, rate } | Quota::LeakyBucket { capacity, rate } => {
            let interval = rate.interval_nanos().ok()?;
            u128::from(interval).saturating_mul(u128::from(*capacity))
        }
        Quota::SlidingWindow { window, .. } => window.as_nanos(),
        Quota::FixedWindow { period, .. } => period.as_nanos(),
    };
    let secs = nanos.div_ceil(1_000_000_000).max(1);
    Some(u64::try_from(secs).unwrap_or(u64::MAX))
}

/// Appends `n` in decimal: the fields are written on every response, and
/// this is several times cheaper than `core::fmt`.
fn push_decimal(out: &mut Vec<u8>, n: u64) {
    // Most significant digit first, one push each: a copy of a few bytes
    // from a scratch buffer is a call to `memmove`, dearer than the digits.
    let mut power = 10u64.pow(decimal_len(n) as u32 - 1);
    loop {
        out.push(b'0' + (n / power % 10) as u8);
        if power == 1 {
            break;
        }
        power /= 10;
    }
}

/// The number of decimal digits of `n`.
fn decimal_len(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

/// A field value built from ASCII we wrote ourselves, `text` filled to
/// its capacity exactly: `bytes` then keeps the vector as it is (a vector
/// with room to spare costs a second allocation, and a slower drop).
fn value(text: Vec<u8>) -> HeaderValue {
    debug_assert_eq!(text.len(), text.capacity());
    // Digits, `;`, `=` and a validated sf-string: always a valid value; the
    // fallback is never taken.
    HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `"<name>";q=<quota>;w=<window>` for `quota`.
pub(crate) fn policy_value(name: &str, quota: &Quota) -> HeaderValue {
    let q = u64::from(quota.limit());
    let w = window_secs(quota);
    let len = name.len() + 3 + decimal_len(q) + w.map_or(0, |w| 3 + decimal_len(w));
    let mut text = Vec::with_capacity(len);
    text.extend_from_slice(name.as_bytes());
    text.extend_from_slice(b";q=");
    push_decimal(&mut text, q);
    if let Some(w) = w {
        text.extend_from_slice(b";w=");
        push_decimal(&mut text, w);
    }
    value(text)
}

/// Distinct quotas whose `RateLimit-Policy` value a layer keeps; a limiter
/// reconfigured to more than these formats the value of the others per
/// response, as if uncached.
const CACHED_QUOTAS: usize = 8;

/// A policy's `RateLimit-Policy` value, formatted once per quota: every
/// response carries it, and the quota changes only when the limiter is
/// reconfigured. The values are keyed by the quota itself, so a value is
/// never shown for a quota other than the one just read from the limiter:
/// a reconfiguration shows on the next response.
///
/// Reading takes no lock and writes nothing shared but the value's
/// reference count: the slots are set once each, and a quota found in
/// none takes the first free one.
pub(crate) struct PolicyField {
    /// The name as a structured-field string, quotes included.
    name: String,
    cached: [OnceLock<(Quota, HeaderValue)>; CACHED_QUOTAS],
}

impl PolicyField {
    /// The field of policy `name` (an sf-string), formatted for `quota`.
    pub fn new(name: String, quota: Quota) -> Self {
        let field = PolicyField {
            name,
            cached: [const { OnceLock::new() }; CACHED_QUOTAS],
        };
        field.value(&quota);
        field
    }

    /// The name as a structured-field string.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The value for `quota`: the cached one (a reference count) when the
    /// quota is one cached, else formatted (and cached if a slot is free).
    pub fn value(&self, quota: &Quota) -> HeaderValue {
        for slot in &self.cached {
            match slot.get() {
                Some((cached, value)) if cached == quota => return value.clone(),
                Some(_) => {}
                None => {
                    let value = policy_value(&self.name, quota);
                    // Taken meanwhile by another response, for this quota
                    // or another: this one is cached by a later miss.
                    let _ = slot.set((*quota, value.clone()));
                    return value;
                }
            }
        }
        policy_value(&self.name, quota)
    }
}

/// `"<name>";r=<remaining>;t=<seconds>`.
pub(crate) fn ratelimit_value(name: &str, remaining: u32, t: u64) -> HeaderValue {
    let r = u64::from(remaining);
    let len = name.len() + 3 + decimal_len(r) + 3 + decimal_len(t);
    let mut text = Vec::with_capacity(len);
    text.extend_from_slice(name.as_bytes());
    text.extend_from_slice(b";r=");
    push_decimal(&mut text, r);
    text.extend_from_slice(b";t=");
    push_decimal(&mut text, t);
    value(text)
}

/// The rate-limit fields of one response, computed when the decision is
/// made and written when the response is there.
#[derive(Debug)]
pub(crate) struct Fields {
    pub policy: HeaderValue,
    /// `RateLimit` and its numbers, when a decision reported them.
    pub state: Option<(HeaderValue, u32, u64)>,
    /// The quota, for the legacy `X-RateLimit-Limit`; `None` when the
    /// legacy fields are off.
    pub legacy_limit: Option<u32>,
}

impl Fields {
    /// Adds the fields to `headers`. The draft's two are lists, so they are
    /// appended (an inner layer's policy stays); the legacy ones are single
    /// values and replaced.
    pub fn write(self, headers: &mut HeaderMap) {
        headers.append(RATELIMIT_POLICY, self.policy);
        if let Some((ratelimit, remaining, t)) = self.state {
            headers.append(RATELIMIT, ratelimit);
            if self.legacy_limit.is_some() {
                headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(remaining));
                headers.insert(X_RATELIMIT_RESET, HeaderValue::from(t));
            }
        }
        if let Some(limit) = self.legacy_limit {
            headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(limit));
        }
    }
}

/// `Retry-After: <seconds>`, at least one for any wait.
pub(crate) fn write_retry_after(headers: &mut HeaderMap, secs: u64) {
    headers.insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use guard_core::limit::Rate;

    #[test]
    fn decimals() {
        for n in [0, 7, 10, 4_294_967_295, u64::MAX] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
            assert_eq!(decimal_len(n), out.len());
        }
        assert_eq!(ratelimit_value("\"d\"", 0, 120), "\"d\";r=0;t=120");
    }

    #[test]
    fn rounds_up_to_whole_seconds() {
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
        assert_eq!(ceil_secs(Duration::from_millis(2_001)), 3);
    }

    #[test]
    fn policy_names_are_quoted_and_escaped() {
        assert_eq!(sf_string("default").unwrap(), "\"default\"");
        assert_eq!(sf_string(r#"a"b\c"#).unwrap(), r#""a\"b\\c""#);
        assert!(matches!(sf_string(""), Err(ConfigError::PolicyName { .. })));
        assert!(matches!(
            sf_string("d\u{e9}faut"),
            Err(ConfigError::PolicyName { .. })
        ));
        assert!(matches!(
            sf_string("tab\there"),
            Err(ConfigError::PolicyName { .. })
        ));
    }

    #[test]
    fn windows_map_as_documented() {
        let window = Quota::SlidingWindow {
            limit: 10,
            window: Duration::from_millis(1_500),
        };
        assert_eq!(window_secs(&window), Some(2));
        assert_eq!(policy_value("\"p\"", &window), "\"p\";q=10;w=2");

        // Five tokens at one per 300 ms: refilled in 1.5 s, advertised as 2.
        let bucket = Quota::TokenBucket {
            capacity: 5,
            rate: Rate::per(1, Duration::from_millis(300)),
        };
        assert_eq!(window_secs(&bucket), Some(2));
        // A fixed window's is its length.
        let day = Quota::FixedWindow {
            limit: 50_000_000,
            period: Duration::from_secs(86_400),
            offset: Duration::from_secs(79_200),
        };
        assert_eq!(policy_value("\"p\"", &day), "\"p\";q=50000000;w=86400");
        // A rate no limiter accepts has no window: `w` is left out.
        let broken = Quota::LeakyBucket {
            capacity: 5,
            rate: Rate::per(0, Duration::from_secs(1)),
        };
        assert_eq!(window_secs(&broken), None);
        assert_eq!(policy_value("\"p\"", &broken), "\"p\";q=5");
    }

    #[test]
    fn the_cached_policy_follows_the_quota_it_is_given() {
        let field = PolicyField::new("\"p\"".to_owned(), window_quota(3));
        assert_eq!(field.value(&window_quota(3)), "\"p\";q=3;w=2");
        assert_eq!(field.value(&window_quota(7)), "\"p\";q=7;w=2");
        assert_eq!(field.value(&window_quota(7)), "\"p\";q=7;w=2");
        assert_eq!(field.value(&window_quota(3)), "\"p\";q=3;w=2");
        // Past the slots, still right: formatted per call.
        let cached = |f: &PolicyField| f.cached.iter().filter(|s| s.get().is_some()).count();
        assert_eq!(cached(&field), 2);
        for limit in 10..40 {
            let expected = format!("\"p\";q={limit};w=2");
            assert_eq!(field.value(&window_quota(limit)), expected.as_str());
        }
        assert_eq!(cached(&field), CACHED_QUOTAS);
        assert_eq!(field.value(&window_quota(3)), "\"p\";q=3;w=2");
    }

    fn window_quota(limit: u32) -> Quota {
        Quota::SlidingWindow {
            limit,
            window: Duration::from_millis(1_500),
        }
    }
}

//! The checks every part of the configuration shares: bounds, the
//! expansion of `${NAME}`, the retry policy's defaults and how a
//! builder's refusal is named by its key. A leaf: it imports nothing of
//! the configuration but its error, so the per-kind modules and
//! `resolve` both build on it without importing each other.

use std::time::Duration;

use guard_core::retry::RetryPolicy;

use guard_endpoints::{Parameter, Refusal, redacted};

use super::tls::{self, TlsFiles, TlsKeys};
use super::{ConfigError, RedactedUrl, invalid};

/// Upper bounds of durations and sizes shared by several kinds, so that
/// a typo (an extra digit, a value in the wrong unit) is an error.
pub(crate) const MAX_TIMEOUT_MS: u64 = 3600 * 1000; // an hour
pub(crate) const MAX_BATCH: u64 = 10_000; // entries a round: one reply of a few MiB
pub(crate) const MAX_LEASE_MS: u64 = 24 * 3600 * 1000; // a day
/// The kinds in the lease scopes of the gateway's elected endpoints
/// (`endpoint/<kind>`, built by the endpoint modules): an owner and an
/// endpoint name are checked against the longest, so that what the
/// check lets through makes every key at start.
pub(crate) const ENDPOINT_SCOPE_KINDS: [&str; 5] = [
    scope_kind::REDIS,
    scope_kind::MQTT,
    scope_kind::NATS,
    scope_kind::AMQP,
    scope_kind::BINLOG,
];

/// The kinds in elected endpoints' lease scopes, one per source module.
pub(crate) mod scope_kind {
    /// Redis Pub/Sub.
    pub(crate) const REDIS: &str = "redis";
    /// A guarded MQTT subscription.
    pub(crate) const MQTT: &str = "mqtt";
    /// An elected core NATS subscriber.
    pub(crate) const NATS: &str = "nats";
    /// An elected RabbitMQ fanout consumer.
    pub(crate) const AMQP: &str = "amqp";
    /// The binlog reader.
    pub(crate) const BINLOG: &str = "binlog";
}

/// The longest elected endpoint scope component (see
/// [`ENDPOINT_SCOPE_KINDS`]).
pub(crate) fn longest_endpoint_component() -> String {
    let kind = ENDPOINT_SCOPE_KINDS
        .iter()
        .max_by_key(|kind| kind.len())
        .unwrap_or(&"");
    format!("endpoint/{kind}")
}

/// The retry defaults of every source that retries (the original's).
const DEFAULT_RETRIES: u32 = 3;
const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(100);

/// The retry policy of `retries` and `retry_delay_ms` (the original's
/// defaults), the delay bounded.
pub(crate) fn retry(
    retries: Option<u32>,
    delay_ms: Option<u64>,
    key: &dyn Fn(&str) -> String,
) -> Result<RetryPolicy, ConfigError> {
    if let Some(ms) = delay_ms {
        bounded(&key("retry_delay_ms"), ms, MAX_TIMEOUT_MS, "milliseconds")?;
    }
    Ok(RetryPolicy::new()
        .with_max_attempts(retries.unwrap_or(DEFAULT_RETRIES))
        .with_initial_delay(delay_ms.map_or(DEFAULT_RETRY_DELAY, Duration::from_millis)))
}

/// A source builder's refusal as the configuration key `field` that gave
/// the value: the value with the rule it breaks; any other error (a
/// builder that does not connect gives none) with its message. One
/// mapping for every source, through [`Refusal`].
#[allow(dead_code)] // Used only in builds with some source's feature.
pub(crate) fn refused(field: &str, key: &dyn Fn(&str) -> String, e: &dyn Refusal) -> ConfigError {
    match e.invalid_input() {
        Some(input) => refused_value(field, key, &input.value, &input.rule),
        None => invalid(key(field), "set", e.to_string()),
    }
}

/// A source builder's refusal of the URL in `url` (expanded from
/// `as_written`): named as written, its password hidden; a refusal of
/// another parameter as [`refused`] names it.
#[allow(dead_code)] // Used only in builds with some source's feature.
pub(crate) fn refused_url(
    key: &dyn Fn(&str) -> String,
    url: &RedactedUrl,
    as_written: &str,
    e: &dyn Refusal,
) -> ConfigError {
    match e.invalid_input() {
        Some(input) if input.parameter == Parameter::ServerUrl => {
            refused_url_rule(&key("url"), url, as_written, &input.rule)
        }
        _ => refused("url", key, e),
    }
}

/// The refusal of an endpoint kind whose feature this build lacks.
#[allow(dead_code)] // Used only in builds without some source's feature.
pub(crate) fn unsupported(kind: &str, feature: &str, key: &dyn Fn(&str) -> String) -> ConfigError {
    invalid(
        key("kind"),
        format!("{kind:?}"),
        format!("a gateway built with its `{feature}` feature"),
    )
}

/// A builder's refusal (`value` breaks `rule`) as the configuration key
/// `field` that gave the value.
#[allow(dead_code)] // Used only in builds with some source's feature.
pub(crate) fn refused_value(
    field: &str,
    key: &dyn Fn(&str) -> String,
    value: &str,
    rule: &str,
) -> ConfigError {
    invalid(key(field), format!("{value:?}"), as_expected(rule))
}

/// A builder's rule as what the configuration expects: "must be X" reads
/// "expected X".
pub(crate) fn as_expected(rule: &str) -> &str {
    rule.strip_prefix("must be ").unwrap_or(rule)
}

/// `url`'s refusal by its endpoint's builder (`rule`) as the
/// configuration key `key`: the URL named as written with its password
/// hidden, never as expanded (a `${NAME}` may hold a secret, and the
/// builder's own error names the URL it was given).
#[allow(dead_code)] // Used only in builds with some source's feature.
pub(crate) fn refused_url_rule(
    key: &str,
    url: &RedactedUrl,
    as_written: &str,
    rule: &str,
) -> ConfigError {
    let expanded = if url.as_str() == as_written {
        ""
    } else {
        " (after expanding the environment variables, whose values are not shown)"
    };
    invalid(
        key,
        format!("{url:?}"),
        format!("{}{expanded}", as_expected(rule)),
    )
}

pub(crate) type Env<'e> = &'e dyn Fn(&str) -> Option<String>;

/// `value` if it is in `1..=max`, else an error naming `key`.
pub(crate) fn bounded(key: &str, value: u64, max: u64, unit: &str) -> Result<u64, ConfigError> {
    if value == 0 || value > max {
        return Err(invalid(
            key,
            value,
            format!("a positive number of {unit}, at most {max}"),
        ));
    }
    Ok(value)
}

/// A name that ends up in keys, client ids and printed lines: no control
/// characters (a newline would break a log line, a NUL a Redis key).
pub(crate) fn printable(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.chars().any(char::is_control) {
        return Err(invalid(
            key,
            format!("{value:?}"),
            "no control characters (newlines, tabs, NUL)",
        ));
    }
    Ok(())
}

/// `value` with every `${NAME}` replaced from `env`.
pub(crate) fn expand(key: &str, value: &str, env: Env<'_>) -> Result<String, ConfigError> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start + 2..].find('}') else {
            return Err(invalid(
                key,
                format!("{value:?}"),
                "`${NAME}` closed by `}`",
            ));
        };
        let name = &rest[start + 2..start + 2 + len];
        if name.is_empty() {
            return Err(invalid(
                key,
                format!("{value:?}"),
                "a variable name inside `${}`",
            ));
        }
        let found = env(name).ok_or_else(|| {
            invalid(
                key,
                format!("{value:?}"),
                format!("the environment variable {name} to be set"),
            )
        })?;
        out.push_str(&rest[..start]);
        out.push_str(&found);
        rest = &rest[start + 3 + len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `value` of `field`, if not empty and free of control characters (a
/// name that reaches keys, subscriptions and log lines).
pub(crate) fn non_empty(
    key: &dyn Fn(&str) -> String,
    field: &str,
    value: &str,
    what: &str,
) -> Result<String, ConfigError> {
    if value.is_empty() {
        return Err(invalid(key(field), "\"\"", what));
    }
    printable(&key(field), value)?;
    Ok(value.to_owned())
}

/// A Redis URL, expanded and checked (scheme, host, port).
pub(crate) fn redis_url(key: &str, value: &str, env: Env<'_>) -> Result<String, ConfigError> {
    let url = expand(key, value, env)?;
    if url.chars().any(char::is_control) {
        return Err(invalid(
            key,
            format!("{:?}", redacted(value)),
            "a URL without control characters",
        ));
    }
    // The value as written in the errors, its password hidden: an
    // expanded secret is never echoed.
    let expanded = if url == value {
        ""
    } else {
        " (after expanding the environment variables, whose values are not shown)"
    };
    let shown = format!("{:?}", redacted(value));
    let Some(parsed) = redis::parse_redis_url(&url) else {
        return Err(invalid(
            key,
            shown,
            format!(
                "a Redis URL: redis://host:port/, rediss:// (TLS), redis+unix:///path or unix:///path{expanded}"
            ),
        ));
    };
    if let Err(e) = redis::IntoConnectionInfo::into_connection_info(url.as_str()) {
        let expected = if parsed.scheme().starts_with("rediss") {
            "redis:// (this build has no TLS support for rediss://)".to_owned()
        } else {
            format!(
                "a usable Redis URL ({})",
                e.detail().unwrap_or("not understood")
            )
        };
        return Err(invalid(key, shown, expected));
    }
    Ok(url)
}

/// Whether a Redis URL is `rediss://` (TLS).
pub(crate) fn is_tls(url: &str) -> bool {
    redis::parse_redis_url(url).is_some_and(|u| matches!(u.scheme(), "rediss" | "valkeys"))
}

/// The TLS settings of a Redis connection to `urls` (each with its key
/// and its value as written, checked already): `None` for `redis://`
/// URLs, which take no TLS keys; for `rediss://` ones, the files `keys`
/// name (none: the system's roots). A deployment's URLs are all TLS or
/// none.
pub(crate) fn redis_tls(
    urls: &[(String, &str, String)],
    keys: &TlsKeys<'_>,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Option<TlsFiles>, ConfigError> {
    let Some((first_key, _, first)) = urls.first() else {
        return Ok(None);
    };
    let tls = is_tls(first);
    if let Some((at, as_written, _)) = urls.iter().find(|(_, _, url)| is_tls(url) != tls) {
        let scheme = if tls { "rediss://" } else { "redis://" };
        return Err(invalid(
            at.as_str(),
            format!("{:?}", redacted(as_written)),
            format!("{scheme} like `{first_key}` (a deployment's URLs are all TLS or none)"),
        ));
    }
    // Without TLS support, a TLS key is refused as such, whatever the URL.
    if tls || (!cfg!(feature = "tls") && keys.first().is_some()) {
        return tls::read(keys, key, &|at, value| expand(at, value, env)).map(Some);
    }
    match keys.first() {
        Some((field, value)) => Err(invalid(
            key(field),
            format!("{value:?}"),
            "no TLS files with a redis:// URL (use rediss:// for TLS)",
        )),
        None => Ok(None),
    }
}

/// An endpoint that shares the locker's Redis takes its TLS settings too:
/// keys of its own are refused.
pub(crate) fn no_tls_without_url(
    keys: &TlsKeys<'_>,
    key: &dyn Fn(&str) -> String,
) -> Result<(), ConfigError> {
    match keys.first() {
        Some((field, value)) => Err(invalid(
            key(field),
            format!("{value:?}"),
            "no TLS keys without `url`: the locker's connection and its TLS settings are used",
        )),
        None => Ok(()),
    }
}

//! `[locker] kind = "etcd"`: the members' URLs and the request timeout,
//! checked here; refused, naming the feature, in a build without `etcd`.

use std::time::Duration;

use super::check::{Env, MAX_TIMEOUT_MS, bounded, expand};
use super::raw;
use super::{ConfigError, EtcdLocker, Locker, invalid};
use guard_endpoints::redacted;

/// An etcd locker's request timeout unless `request_timeout_ms` is set:
/// guard-etcd's own default (this layer does not depend on guard-etcd,
/// whose build needs `protoc`; a test of the gateway checks the two
/// agree).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why `url` is not an etcd member's client URL, if it is not: guard-etcd
/// speaks plain HTTP/2 to `http://host:port`.
fn url_rule(url: &str) -> Option<&'static str> {
    const RULE: &str = "an etcd client URL http://host:port (TLS is not supported)";
    let Some(rest) = url.strip_prefix("http://") else {
        return Some(RULE);
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let Some((host, port)) = authority.rsplit_once(':') else {
        return Some(RULE);
    };
    // An IPv6 address is bracketed (`[::1]`); any other host is one name
    // or address without ':', '/', '@', '?' or white space.
    let plain = |h: &str| {
        !h.is_empty()
            && !h.contains([':', '/', '@', '?', '[', ']'])
            && !h.contains(char::is_whitespace)
    };
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => {
            !v6.is_empty()
                && v6
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        }
        None => plain(host),
    };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p > 0);
    (!(host_ok && port_ok)).then_some(RULE)
}

/// `[locker] kind = "etcd"`.
pub(super) fn locker(l: &raw::Locker, env: Env<'_>) -> Result<Locker, ConfigError> {
    if l.urls.is_empty() {
        return Err(invalid(
            "locker.urls",
            "[]",
            "the members' client URLs, such as [\"http://10.0.0.1:2379\", \"http://10.0.0.2:2379\"]",
        ));
    }
    let endpoints = l
        .urls
        .iter()
        .enumerate()
        .map(|(i, url)| {
            let key = format!("locker.urls[{i}]");
            let expanded = expand(&key, url, env)?;
            match url_rule(&expanded) {
                // The value as written (an expanded one may hold a
                // secret), its password hidden.
                Some(rule) => Err(invalid(key, format!("{:?}", redacted(url)), rule)),
                None => Ok(expanded),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(i) = (1..endpoints.len()).find(|&i| endpoints[..i].contains(&endpoints[i])) {
        return Err(invalid(
            format!("locker.urls[{i}]"),
            format!("{:?}", redacted(&l.urls[i])),
            "each member once",
        ));
    }
    let request_timeout = match l.request_timeout_ms {
        None => DEFAULT_TIMEOUT,
        Some(ms) => Duration::from_millis(bounded(
            "locker.request_timeout_ms",
            ms,
            MAX_TIMEOUT_MS,
            "milliseconds",
        )?),
    };
    if cfg!(not(feature = "etcd")) {
        // The application builds the locker: for the gateway, its own
        // feature of that name.
        return Err(invalid(
            "locker.kind",
            "\"etcd\"",
            "a build with the `etcd` feature (the gateway: `cargo build -p guard-gateway --features etcd`; its build needs protoc)",
        ));
    }
    Ok(Locker::Etcd(EtcdLocker {
        endpoints,
        request_timeout,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_urls_are_plain_http_with_a_host_and_port() {
        for good in [
            "http://127.0.0.1:2379",
            "http://etcd-1:2379/",
            "http://[::1]:2379",
        ] {
            assert_eq!(url_rule(good), None, "{good}");
        }
        for bad in [
            "127.0.0.1:2379",
            "https://etcd:2379",
            "http://etcd",
            "http://:2379",
            "http://etcd:0",
            "http://etcd:99999",
            "http://u:p@etcd:2379",
            "http://etcd:2379/v3",
            "http://::1:2379",
            "http://et cd:2379",
            "http://[]:2379",
        ] {
            assert!(url_rule(bad).is_some(), "{bad}");
        }
    }
}

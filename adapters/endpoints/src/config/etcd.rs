//! `[locker] kind = "etcd"`: the members' URLs and the request timeout,
//! checked here; refused, naming the feature, in a build without `etcd`.

use std::time::Duration;

use super::raw;
use super::resolve::{Env, MAX_TIMEOUT_MS, bounded, expand};
use super::{ConfigError, EtcdLocker, Locker, invalid};

/// An etcd locker's request timeout unless `request_timeout_ms` is set:
/// guard-etcd's own default (this layer does not depend on guard-etcd,
/// whose build needs `protoc`; a test of the gateway checks the two
/// agree).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why `url` is not an etcd member's client URL, if it is not: guard-etcd
/// speaks plain HTTP/2 to `http://host:port`.
fn url_rule(url: &str) -> Option<&'static str> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Some("an etcd client URL http://host:port (TLS is not supported)");
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let port = authority
        .rsplit_once(':')
        .map(|(host, port)| (host, port.parse::<u16>()));
    match port {
        Some((host, Ok(port)))
            if !host.is_empty() && port > 0 && !host.contains(['/', '@', '?']) =>
        {
            None
        }
        _ => Some("an etcd client URL http://host:port (TLS is not supported)"),
    }
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
                // The value as written: an expanded one may hold a secret.
                Some(rule) => Err(invalid(key, format!("{url:?}"), rule)),
                None => Ok(expanded),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
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
        ] {
            assert!(url_rule(bad).is_some(), "{bad}");
        }
    }
}

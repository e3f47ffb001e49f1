//! Requests that bypass the limiter: an allowlist of keys and networks.

use std::collections::HashSet;
use std::net::IpAddr;

use http::request::Parts;
use ipnet::IpNet;

use crate::error::ConfigError;
use crate::extract::{ClientIp, Key};

/// Keys and client networks the layer lets through without deciding:
/// nothing is counted against them and no rate-limit fields are written
/// (health checks, your own services, a monitoring host).
///
/// A request is allowed when its key (what the layer's
/// [`KeyExtractor`](crate::KeyExtractor) read) is one of the keys, or when
/// its client address falls in one of the networks. The address is read
/// by a [`ClientIp`] of its own, [`ClientIp::peer`] unless
/// [`client_ip`](Self::client_ip) says otherwise: behind proxies, give it
/// the same trust as the layer's key, or every request from your proxy
/// would match the proxy's network.
///
/// ```
/// use guard_tower::AllowList;
///
/// let allow = AllowList::new()
///     .key("internal-batch-job")
///     .network("10.0.0.0/8")?
///     .network("2001:db8:42::/48")?
///     .network("192.0.2.7")?; // one host
/// # Ok::<(), guard_tower::ConfigError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct AllowList {
    keys: HashSet<String>,
    networks: Vec<IpNet>,
    client_ip: ClientIp,
}

impl AllowList {
    /// An empty list: nothing bypasses the limiter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets requests whose key is `key` through.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.keys.insert(key.into());
        self
    }

    /// Lets requests from the network `network` through: `10.0.0.0/8`,
    /// `2001:db8::/32`, or one address. A network with bits set past its
    /// prefix (`10.0.0.1/8`) is refused rather than read as a guess.
    pub fn network(mut self, network: &str) -> Result<Self, ConfigError> {
        let refused = |reason: String| ConfigError::AllowedNetwork {
            value: network.to_owned(),
            reason,
        };
        let text = network.trim();
        let parsed = match text.parse::<IpNet>() {
            Ok(net) => net,
            Err(_) => match text.parse::<IpAddr>() {
                Ok(addr) => IpNet::from(addr),
                Err(_) => {
                    return Err(refused(
                        "not an address or a network in CIDR form (10.0.0.0/8, 2001:db8::/32)"
                            .to_owned(),
                    ));
                }
            },
        };
        if parsed.trunc() != parsed {
            return Err(refused(format!(
                "has bits set past its /{} prefix (the network is {})",
                parsed.prefix_len(),
                parsed.trunc()
            )));
        }
        self.networks.push(parsed);
        Ok(self)
    }

    /// How a request's client address is read for the networks;
    /// [`ClientIp::peer`] by default.
    pub fn client_ip(mut self, client_ip: ClientIp) -> Self {
        self.client_ip = client_ip;
        self
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.networks.is_empty()
    }

    /// Whether the request, whose key is `key`, bypasses the limiter.
    pub(crate) fn admits(&self, request: &Parts, key: Option<&Key<'_>>) -> bool {
        key.is_some_and(|key| self.keys.contains(key.as_str()))
            || (!self.networks.is_empty()
                && self
                    .client_ip
                    .client_addr(request)
                    .is_some_and(|ip| self.networks.iter().any(|net| net.contains(&ip))))
    }
}

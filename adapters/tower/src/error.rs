//! Parameters the layer refuses, as values.

use std::fmt;
use std::time::Duration;

/// A parameter the layer cannot work with. Each variant names the
/// parameter and carries the value given, so the message says both.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// [`HeaderKey::new`](crate::HeaderKey::new): not a valid HTTP header
    /// name.
    HeaderName {
        /// The name given.
        value: String,
    },
    /// [`RateLimitLayerBuilder::policy_name`](crate::RateLimitLayerBuilder::policy_name):
    /// not a name the `RateLimit` fields can carry as a structured-field
    /// string.
    PolicyName {
        /// The name given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// [`ClientIp::x_forwarded_for`](crate::ClientIp::x_forwarded_for) or
    /// [`ClientIp::forwarded`](crate::ClientIp::forwarded) with no proxy.
    TrustedProxies {
        /// The count given.
        value: usize,
    },
    /// [`OnBackendError::FailClosed`](crate::OnBackendError::FailClosed)
    /// asking clients to retry after no time at all.
    BackendRetryAfter {
        /// The duration given.
        value: Duration,
    },
    /// [`RateLimitLayerBuilder::wait_up_to`](crate::RateLimitLayerBuilder::wait_up_to)
    /// with no time to wait.
    WaitUpTo {
        /// The duration given.
        value: Duration,
    },
    /// [`ClientIp::with_ipv6_prefix`](crate::ClientIp::with_ipv6_prefix)
    /// outside 1 to 128 bits.
    Ipv6Prefix {
        /// The bits given.
        value: u8,
    },
    /// [`AllowList::network`](crate::AllowList::network): not an address
    /// or a network (`10.0.0.0/8`, `2001:db8::/32`), or one with bits set
    /// past its prefix.
    AllowedNetwork {
        /// The text given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// [`RateLimitLayerBuilder::dry_run`](crate::RateLimitLayerBuilder::dry_run)
    /// together with
    /// [`wait_up_to`](crate::RateLimitLayerBuilder::wait_up_to): a dry
    /// run never holds a request.
    DryRunWithWait,
    /// [`RateLimitLayerBuilder::bandwidth_names`](crate::RateLimitLayerBuilder::bandwidth_names):
    /// not one name for each of the limiter's bandwidths.
    BandwidthNames {
        /// The names given.
        given: usize,
        /// The limiter's bandwidths (1 for a limiter of one quota).
        bandwidths: usize,
    },
    /// [`RateLimitLayerBuilder::wait_up_to`](crate::RateLimitLayerBuilder::wait_up_to)
    /// over a limiter of several bandwidths: waiting follows one quota.
    WaitWithBandwidths,
    /// [`BulkheadLayer::builder`](crate::BulkheadLayer::builder) or
    /// [`BulkheadLayer::set_max`](crate::BulkheadLayer::set_max) letting
    /// no request in.
    MaxConcurrent {
        /// The count given.
        value: u32,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::HeaderName { value } => write!(
                f,
                "key header: {value:?} is not a valid HTTP header name (a token of letters, \
                 digits and !#$%&'*+-.^_`|~)"
            ),
            ConfigError::PolicyName { value, reason } => {
                write!(f, "policy name: {value:?} {reason}")
            }
            ConfigError::TrustedProxies { value } => write!(
                f,
                "trusted proxies: {value}: trusting a forwarding header needs at least one proxy \
                 of yours in front of the server (ClientIp::peer() reads the peer address alone)"
            ),
            ConfigError::BackendRetryAfter { value } => write!(
                f,
                "backend retry-after: {value:?}: a refusal must ask the client to wait (at least \
                 1 s once rounded up to whole seconds)"
            ),
            ConfigError::WaitUpTo { value } => write!(
                f,
                "wait up to: {value:?}: a wait must be longer than zero (no refusal asks for \
                 less); leave the option out to refuse at once"
            ),
            ConfigError::Ipv6Prefix { value } => write!(
                f,
                "IPv6 prefix: {value} bits: an IPv6 client's key keeps 1 to 128 bits of its \
                 address (64, its network, by default)"
            ),
            ConfigError::AllowedNetwork { value, reason } => {
                write!(f, "allowed network: {value:?}: {reason}")
            }
            ConfigError::DryRunWithWait => f.write_str(
                "dry run and wait_up_to: a dry run never refuses, so it never holds a request; \
                 use one or the other",
            ),
            ConfigError::BandwidthNames { given, bandwidths } => write!(
                f,
                "bandwidth names: {given} given for a limiter of {bandwidths} bandwidth(s): \
                 each entry of the RateLimit fields needs one name per bandwidth"
            ),
            ConfigError::MaxConcurrent { value } => write!(
                f,
                "bulkhead max concurrent: {value}: it must let at least one request in"
            ),
            ConfigError::WaitWithBandwidths => f.write_str(
                "wait_up_to over several bandwidths: a request waits for one quota's turn; \
                 refuse at once (leave wait_up_to out) or limit by one bandwidth",
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

//! MQTT sources, with the seeds' rule, on smol.
//!
//! - A **shared subscription** (`$share/<group>/<filter>`) is delivered by
//!   the broker to one member of the group: replicas subscribe with the
//!   same group and need no guard. MQTT 5 standardises it; Mosquitto 2
//!   and EMQX support it (Mosquitto round-robins the group's members).
//! - A **plain subscription** is delivered to every subscriber. On its own
//!   it suits state every replica should see; for work that must happen
//!   once, give it an [`ActiveRunner`](guard_std::run::ActiveRunner) lease with
//!   [`MqttEndpoint::with_guard`], so only the elected replica subscribes.
//!   Messages published while no replica is subscribed (a takeover) are
//!   not delivered to anyone: the guard removes duplicate consumption, it
//!   does not add persistence.
//!
//! Messages are received at QoS 1 and acknowledged after the handler
//! returns, one at a time per endpoint (manual acknowledgement). The
//! client is `rumqttc` (MQTT 3.1.1), driven from smol through
//! `async-compat`. With the `tls` feature, `MqttOptions::with_tls` and
//! `MqttTls` connect over TLS, with a private CA and a client certificate
//! if needed.
//!
//! ```no_run
//! # smol::block_on(async {
//! use guard_endpoints::mqtt::{MqttEndpoint, MqttOptions, Subscription};
//!
//! let options = MqttOptions::new("127.0.0.1", 1883, "gateway-1")?;
//! let endpoint = MqttEndpoint::new(options, Subscription::shared("gateways", "sensors/+/temp")?);
//! let (_handle, control) = guard_smol::control();
//! endpoint
//!     .run(control, |message| async move { println!("{}: {:?}", message.topic, message.payload) })
//!     .await;
//! # Ok::<(), guard_endpoints::mqtt::MqttError>(())
//! # });
//! ```

mod connection;
mod endpoint;
#[cfg(feature = "tls")]
mod tls;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use guard_std::run::RunnerError;

use crate::delivery::ElectedLease;
use crate::parameter::Parameter;

pub use endpoint::MqttEndpoint;
#[cfg(feature = "tls")]
pub use tls::MqttTls;

/// Keep-alive interval unless set.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(30);
/// Limit on connecting and on the broker's answer to a subscription.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Wait before reconnecting an unguarded endpoint after its connection
/// failed.
pub const DEFAULT_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// An MQTT failure, or input that cannot work.
///
/// The message names what failed; [`source`](std::error::Error::source)
/// returns the cause where there is one: rumqttc's
/// [`ConnectionError`](rumqttc::ConnectionError) or
/// [`ClientError`](rumqttc::ClientError) (shared behind an [`Arc`], so
/// the error stays `Clone`), or guard-smol's
/// [`RunnerError`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum MqttError {
    /// A parameter that cannot be used.
    InvalidInput(crate::InvalidInput),
    /// The endpoint's guard (its lease runner) cannot be built.
    Guard(RunnerError),
    /// The broker could not be reached or refused the connection.
    Connect {
        /// `host:port`.
        broker: String,
        /// Why.
        source: Arc<rumqttc::ConnectionError>,
    },
    /// The SUBSCRIBE could not be sent.
    Subscribe {
        /// The filter, as sent.
        filter: String,
        /// Why.
        source: Arc<rumqttc::ClientError>,
    },
    /// The broker refused the subscription.
    SubscriptionRefused {
        /// The filter, as sent.
        filter: String,
        /// The broker's return codes, as text (they are the broker's
        /// answer, not an error of this client).
        return_codes: String,
    },
    /// No answer in time.
    Timeout(Duration),
    /// The connection ended: with rumqttc's error, or `None` when it
    /// ended before the broker confirmed the subscription (its error was
    /// reported where the connection was served).
    Closed(Option<Arc<rumqttc::ConnectionError>>),
    /// A message's acknowledgement could not be queued.
    Acknowledge(Arc<rumqttc::ClientError>),
}

impl MqttError {
    /// `value` of `parameter` breaks `rule`.
    pub(crate) fn invalid(
        parameter: Parameter,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> Self {
        MqttError::InvalidInput(crate::InvalidInput::new(parameter, value, rule))
    }
}

crate::parameter::refusal!(MqttError);

impl fmt::Display for MqttError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MqttError::InvalidInput(e) => fmt::Display::fmt(e, f),
            MqttError::Guard(e) => write!(f, "MQTT endpoint guard: {e}"),
            MqttError::Connect { broker, source } => write!(f, "mqtt connect: {broker}: {source}"),
            MqttError::Subscribe { filter, source } => {
                write!(f, "mqtt subscribe: {filter}: {source}")
            }
            MqttError::SubscriptionRefused {
                filter,
                return_codes,
            } => write!(
                f,
                "mqtt subscribe: the broker refused {filter}: {return_codes}"
            ),
            MqttError::Timeout(d) => write!(f, "mqtt: no answer within {d:?}"),
            MqttError::Closed(Some(e)) => write!(f, "mqtt: connection ended: {e}"),
            MqttError::Closed(None) => f.write_str("mqtt: connection ended before SUBACK"),
            MqttError::Acknowledge(e) => write!(f, "mqtt: acknowledge: {e}"),
        }
    }
}

impl std::error::Error for MqttError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MqttError::Guard(e) => Some(e),
            MqttError::Connect { source, .. } | MqttError::Closed(Some(source)) => Some(&**source),
            MqttError::Subscribe { source, .. } | MqttError::Acknowledge(source) => Some(&**source),
            _ => None,
        }
    }
}

/// Where the broker is and who this client is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MqttOptions {
    host: String,
    port: u16,
    client_id: String,
    keep_alive: Duration,
    connect_timeout: Duration,
    reconnect_delay: Duration,
    #[cfg(feature = "tls")]
    tls: Option<MqttTls>,
}

impl MqttOptions {
    /// A client `client_id` (unique per replica: a broker disconnects the
    /// older of two clients with one id) of the broker at `host:port`.
    pub fn new(host: &str, port: u16, client_id: &str) -> Result<Self, MqttError> {
        if host.is_empty() {
            return Err(MqttError::invalid(
                Parameter::BrokerHost,
                host,
                "must not be empty",
            ));
        }
        if client_id.is_empty() {
            return Err(MqttError::invalid(
                Parameter::ClientId,
                client_id,
                "must not be empty (each replica needs its own)",
            ));
        }
        Ok(MqttOptions {
            host: host.to_owned(),
            port,
            client_id: client_id.to_owned(),
            keep_alive: DEFAULT_KEEP_ALIVE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            reconnect_delay: DEFAULT_RECONNECT_DELAY,
            #[cfg(feature = "tls")]
            tls: None,
        })
    }

    /// Connects over TLS with `tls`'s certificates (the broker's TLS
    /// listener, usually port 8883). The host is the name the broker's
    /// certificate must be for (a DNS name or an IP address).
    #[cfg(feature = "tls")]
    pub fn with_tls(mut self, tls: MqttTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The keep-alive interval.
    pub fn with_keep_alive(mut self, interval: Duration) -> Self {
        self.keep_alive = interval;
        self
    }

    /// The limit on connecting and on the broker's SUBACK.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The wait before an unguarded endpoint reconnects.
    pub fn with_reconnect_delay(mut self, delay: Duration) -> Self {
        self.reconnect_delay = delay;
        self
    }

    /// The client id.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The broker's host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The broker's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The keep-alive interval.
    pub fn keep_alive(&self) -> Duration {
        self.keep_alive
    }

    /// How long a connection may take to be acknowledged.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The TLS settings, if the broker is reached over TLS.
    #[cfg(feature = "tls")]
    pub fn tls(&self) -> Option<&MqttTls> {
        self.tls.as_ref()
    }
}

/// What an endpoint subscribes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subscription {
    /// `$share/<group>/<filter>`: the broker delivers each message to one
    /// member of the group.
    Shared {
        /// The share group: every replica uses the same one.
        group: String,
        /// The topic filter.
        filter: String,
    },
    /// `<filter>`: every subscriber gets every message.
    Plain {
        /// The topic filter.
        filter: String,
    },
}

/// A filter a subscription may use: a valid MQTT topic filter (`#` only
/// last, `+` a whole level), not itself a `$share/` filter, and with no
/// control character (a NUL makes a broker drop the connection, and the
/// client reconnect in a loop).
fn checked_filter(filter: &str) -> Result<String, MqttError> {
    if filter.is_empty()
        || filter.starts_with("$share/")
        || !rumqttc::valid_filter(filter)
        || filter.chars().any(char::is_control)
    {
        return Err(MqttError::invalid(
            Parameter::TopicFilter,
            format!("{filter:?}"),
            "must be a valid MQTT topic filter (`#` only last, `+` a whole level) with no control character, and not itself a $share filter (use Subscription::shared)",
        ));
    }
    Ok(filter.to_owned())
}

impl Subscription {
    /// A shared subscription: `group` is non-empty and has no `/`, `+`,
    /// `#` (MQTT 5, 4.8.2), whitespace or control character; `filter`
    /// is a valid topic filter.
    pub fn shared(group: &str, filter: &str) -> Result<Self, MqttError> {
        if group.is_empty()
            || group.contains(['/', '+', '#'])
            || group.chars().any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(MqttError::invalid(
                Parameter::ShareGroup,
                format!("{group:?}"),
                "must be non-empty and contain no '/', '+', '#', whitespace or control character",
            ));
        }
        Ok(Subscription::Shared {
            group: group.to_owned(),
            filter: checked_filter(filter)?,
        })
    }

    /// A plain subscription.
    pub fn plain(filter: &str) -> Result<Self, MqttError> {
        Ok(Subscription::Plain {
            filter: checked_filter(filter)?,
        })
    }

    /// The filter as sent to the broker.
    pub fn topic_filter(&self) -> String {
        match self {
            Subscription::Shared { group, filter } => format!("$share/{group}/{filter}"),
            Subscription::Plain { filter } => filter.clone(),
        }
    }
}

/// One received message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MqttMessage {
    /// The topic it was published on.
    pub topic: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// For a guarded endpoint, the fence of the lease, checked valid
    /// immediately before the handler was called: pass it to a resource
    /// that refuses stale leaders.
    pub fence: Option<u64>,
    /// For a guarded endpoint, the lease the message was read under: a
    /// handler that waits before its side effect checks
    /// [`ElectedLease::is_valid`] again immediately before it.
    pub lease: Option<ElectedLease>,
}

#[cfg(test)]
mod subscription_tests {
    use super::*;

    #[test]
    fn filters_and_share_groups_with_control_characters_are_refused() {
        for filter in ["a/\0", "a/\r\nb", "sensors/#/x", "a+/b", "", "$share/g/a"] {
            let err = Subscription::plain(filter).unwrap_err();
            assert!(
                matches!(
                    &err,
                    MqttError::InvalidInput(crate::InvalidInput {
                        parameter: Parameter::TopicFilter,
                        ..
                    })
                ),
                "{filter:?}: {err}"
            );
        }
        for group in ["g\r\nx", "g\0", "g h", "", "g/h"] {
            let err = Subscription::shared(group, "a/#").unwrap_err();
            assert!(
                matches!(
                    &err,
                    MqttError::InvalidInput(crate::InvalidInput {
                        parameter: Parameter::ShareGroup,
                        ..
                    })
                ),
                "{group:?}: {err}"
            );
        }
        assert!(Subscription::plain("sensors/+/temp").is_ok());
        assert!(Subscription::shared("gateways", "sensors/#").is_ok());
    }
}

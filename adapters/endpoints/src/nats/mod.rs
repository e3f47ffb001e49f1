//! NATS sources, with the seeds' rule (the `nats` feature).
//!
//! - A **queue group** ([`Delivery::QueueGroup`]): the server delivers
//!   each message of the subject to one member of the group, so replicas
//!   that share the group need no guard.
//! - A **plain subject** is delivered to every subscriber. For state
//!   every replica should see, [`Delivery::Broadcast`]; for work that
//!   must happen once, [`Delivery::Elected`]: only the replica that holds
//!   the lease subscribes, checks the lease before every handler call and
//!   hands the fence with each message. Messages published while no
//!   replica is subscribed (a takeover) reach nobody: core NATS keeps
//!   nothing, and the guard adds no persistence.
//! - A **JetStream durable consumer** ([`JetStreamConsumer`]): the
//!   server keeps the messages, delivers each to one puller of the
//!   consumer, redelivers what is not acknowledged in time, and this
//!   endpoint dead-letters what failed on its last delivery.
//!
//! Core NATS has no acknowledgement: a [`NatsSubscriber`] retries a failing
//! handler in process under its [`RetryPolicy`](guard_core::retry::RetryPolicy),
//! then publishes the message to its dead-letter subject, if it has one,
//! with its origin in headers ([`ORIGIN_SUBJECT`], [`ERROR`],
//! [`ATTEMPTS`]); without one, the loss is counted in
//! [`NatsStats::given_up`] and logged. A JetStream stream that captures
//! the dead-letter subject keeps them.
//!
//! The client is `async-nats`, which runs on tokio: inside a tokio
//! runtime it uses the caller's, elsewhere (smol, async-io) async-compat's
//! runtime thread. It reconnects by itself after the server restarts and
//! subscribes again; JetStream consumers pull again.
//!
//! ```no_run
//! # smol::block_on(async {
//! use guard_core::retry::Classifier;
//! use guard_endpoints::nats::{Delivery, NatsOptions, NatsSubscriber};
//!
//! let options = NatsOptions::new("nats://127.0.0.1:4222")?;
//! let subscriber = NatsSubscriber::new(options, "orders.created", Delivery::queue_group("billing")?)?;
//! let (_handle, control) = guard_smol::control();
//! subscriber
//!     .run(control, Classifier::retry_all(), |message| async move {
//!         println!("{}: {:?}", message.subject, message.payload);
//!         Ok::<(), String>(())
//!     })
//!     .await;
//! # Ok::<(), guard_endpoints::nats::NatsError>(())
//! # });
//! ```

pub(crate) mod connection;
mod jetstream;
mod subscriber;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use guard_std::run::RunnerError;

use crate::delivery::ElectedLease;
use crate::parameter::{Parameter, redacted};

pub use jetstream::{
    DEFAULT_ACK_WAIT, DEFAULT_BATCH, DEFAULT_MAX_DELIVER, DEFAULT_REDELIVERY_DELAY,
    JetStreamConsumer, JetStreamMessage, JetStreamStats,
};
pub use subscriber::{NatsStats, NatsSubscriber};

/// Limit on connecting, and the wait before connecting again.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Wait before connecting again after a failed attempt.
pub const DEFAULT_RECONNECT_DELAY: Duration = Duration::from_secs(1);

/// The header naming the subject a dead letter was received on.
pub const ORIGIN_SUBJECT: &str = "Guard-Origin-Subject";
/// The header naming the JetStream stream a dead letter came from.
pub const ORIGIN_STREAM: &str = "Guard-Origin-Stream";
/// The header with a dead letter's sequence number in its stream.
pub const ORIGIN_SEQUENCE: &str = "Guard-Origin-Sequence";
/// The header with the last error of a dead letter's handler.
pub const ERROR: &str = "Guard-Error";
/// The header with the handler calls made for a dead letter (for a
/// JetStream message, those of its last delivery).
pub const ATTEMPTS: &str = "Guard-Attempts";
/// The header with how often JetStream delivered a dead letter.
pub const DELIVERIES: &str = "Guard-Deliveries";

/// A NATS failure, or input that cannot work.
///
/// The message names what failed; [`source`](std::error::Error::source)
/// returns async-nats's error where there is one (shared behind an
/// [`Arc`], so the error stays `Clone`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum NatsError {
    /// A parameter that cannot be used.
    InvalidInput(crate::InvalidInput),
    /// The endpoint's guard (its lease runner) cannot be built.
    Guard(RunnerError),
    /// A request to the server failed: connecting, subscribing, flushing,
    /// publishing a dead letter, or a JetStream request.
    Server {
        /// What was asked, e.g. `subscribe orders.created`.
        what: String,
        /// Why.
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
}

impl NatsError {
    pub(crate) fn invalid(
        parameter: Parameter,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> Self {
        NatsError::InvalidInput(crate::InvalidInput::new(parameter, value, rule))
    }

    pub(crate) fn server(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        NatsError::Server {
            what: what.into(),
            source: Arc::new(source),
        }
    }
}

crate::parameter::refusal!(NatsError);

impl fmt::Display for NatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NatsError::InvalidInput(e) => fmt::Display::fmt(e, f),
            NatsError::Guard(e) => write!(f, "NATS endpoint guard: {e}"),
            NatsError::Server { what, source } => write!(f, "nats: {what}: {source}"),
        }
    }
}

impl std::error::Error for NatsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NatsError::Guard(e) => Some(e),
            NatsError::Server { source, .. } => Some(&**source),
            NatsError::InvalidInput(_) => None,
        }
    }
}

/// Where the server is and how this client connects.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsOptions {
    url: String,
    name: Option<String>,
    connect_timeout: Duration,
    reconnect_delay: Duration,
}

impl fmt::Debug for NatsOptions {
    // The server without its password or token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsOptions")
            .field("server", &self.server())
            .field("name", &self.name)
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_delay", &self.reconnect_delay)
            .finish()
    }
}

impl NatsOptions {
    /// The server at `url` (`nats://host:port`, or `host:port`; user
    /// and password or a token before an `@`). A refused URL is named in
    /// the error with its password or token hidden.
    pub fn new(url: &str) -> Result<Self, NatsError> {
        if let Err(e) = url.parse::<async_nats::ServerAddr>() {
            return Err(NatsError::invalid(
                Parameter::ServerUrl,
                redacted(url),
                format!("must be nats://host:port ({e})"),
            ));
        }
        Ok(NatsOptions {
            url: url.to_owned(),
            name: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            reconnect_delay: DEFAULT_RECONNECT_DELAY,
        })
    }

    /// The client's name, as the server's monitoring shows it.
    pub fn with_name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// The limit on connecting.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The wait before connecting again after a failed first connection
    /// (once connected, the client reconnects by itself).
    pub fn with_reconnect_delay(mut self, delay: Duration) -> Self {
        self.reconnect_delay = delay;
        self
    }

    /// The server's URL, credentials included: for connecting, never
    /// for printing (see [`server`](Self::server)).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server's URL without its password or token, for errors and
    /// logs.
    pub fn server(&self) -> String {
        redacted(&self.url)
    }
}

/// Who receives each message of a [`NatsSubscriber`]'s subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// One member of the queue group: no guard.
    QueueGroup(String),
    /// Every replica (state every replica should see).
    Broadcast,
    /// Only the replica holding the lease (see
    /// [`NatsSubscriber::with_guard`]).
    Elected,
}

impl Delivery {
    /// A queue group: non-empty, no whitespace (a NATS token).
    pub fn queue_group(group: &str) -> Result<Self, NatsError> {
        if group.is_empty() || group.contains(char::is_whitespace) {
            return Err(NatsError::invalid(
                Parameter::QueueGroup,
                group,
                "must be non-empty and contain no whitespace",
            ));
        }
        Ok(Delivery::QueueGroup(group.to_owned()))
    }
}

/// A subject a subscriber may listen on: non-empty dot-separated tokens
/// without whitespace; wildcards (`*`, a final `>`) allowed only if
/// `wildcards`; refused naming `parameter`. The rule every subscriber
/// and dead-letter subject here is checked by, for a caller that
/// validates a subject before it builds one.
pub fn checked_subject(
    parameter: Parameter,
    subject: &str,
    wildcards: bool,
) -> Result<String, NatsError> {
    let tokens: Vec<&str> = subject.split('.').collect();
    let last = tokens.len() - 1;
    let bad_token = tokens.iter().enumerate().any(|(i, token)| {
        token.is_empty()
            || token.contains(char::is_whitespace)
            || (token.contains(['*', '>'])
                && !(wildcards && (*token == "*" || (*token == ">" && i == last))))
    });
    if subject.is_empty() || bad_token {
        let rule = if wildcards {
            "must be dot-separated non-empty tokens without whitespace; `*` and a final `>` are the only wildcards"
        } else {
            "must be dot-separated non-empty tokens without whitespace or wildcards"
        };
        return Err(NatsError::invalid(parameter, subject, rule));
    }
    Ok(subject.to_owned())
}

/// A header value of `text`: NATS header values are one line.
pub(crate) fn header_value(text: &str) -> String {
    text.replace(['\r', '\n'], " ")
}

/// One message of a core NATS subject, as the handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsMessage {
    /// The subject it was published on.
    pub subject: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// For an elected subscriber, the fence of the lease, checked valid
    /// immediately before the handler was called: pass it to a resource
    /// that refuses stale leaders.
    pub fence: Option<u64>,
    /// For an elected subscriber, the lease the message was read under:
    /// a handler that waits before its side effect checks
    /// [`ElectedLease::is_valid`] again immediately before it.
    pub lease: Option<ElectedLease>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_checked_token_by_token() {
        for good in ["orders", "orders.created", "a.*.c", "a.>"] {
            assert!(
                checked_subject(Parameter::Subject, good, true).is_ok(),
                "{good}"
            );
        }
        for bad in ["", "a..b", ".a", "a.", "a b", "a.>.b", "a*", "a.b>"] {
            let err = checked_subject(Parameter::Subject, bad, true).unwrap_err();
            assert!(err.to_string().contains("invalid subject"), "{err}");
        }
        let err = checked_subject(Parameter::DeadLetterSubject, "dlq.*", false).unwrap_err();
        assert!(
            err.to_string().contains("without whitespace or wildcards"),
            "{err}"
        );
    }

    #[test]
    fn bad_options_name_the_parameter_and_the_value() {
        let err = NatsOptions::new("http://[::1").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid server URL \"http://[::1\""),
            "{err}"
        );
        let err = Delivery::queue_group("a b").unwrap_err();
        assert!(err.to_string().contains("queue group \"a b\""), "{err}");
    }

    #[test]
    fn header_values_stay_on_one_line() {
        assert_eq!(header_value("a\r\nb"), "a  b");
    }
}

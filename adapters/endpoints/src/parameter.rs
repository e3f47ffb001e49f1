//! The parameters an endpoint refuses, named in the `InvalidInput`
//! variant of every endpoint's error type ([`MqttError`](crate::mqtt::MqttError),
//! [`EndpointError`](crate::redis::EndpointError), and those of the NATS,
//! AMQP, PostgreSQL and binlog endpoints), and how a URL is shown in
//! them.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// A parameter of an endpoint, as named in an `InvalidInput` error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Parameter {
    /// A stream consumer's stream.
    Stream,
    /// A stream consumer's group.
    ConsumerGroup,
    /// A stream consumer's own name.
    ConsumerName,
    /// Messages an endpoint reads or pulls per round.
    Batch,
    /// Messages an endpoint handles at once.
    Concurrency,
    /// How long an entry is idle before a stream consumer claims it.
    ClaimIdle,
    /// A stream consumer's retry policy.
    RetryPolicy,
    /// A Pub/Sub endpoint's patterns.
    Patterns,
    /// How many messages wait for an endpoint's handler.
    QueueCapacity,
    /// An MQTT broker's host.
    BrokerHost,
    /// An MQTT client id.
    ClientId,
    /// An MQTT share group.
    ShareGroup,
    /// An MQTT topic filter.
    TopicFilter,
    /// An MQTT subscription given a guard.
    GuardedSubscription,
    /// The lease timing of an endpoint's guard.
    LeaseTiming,
    /// A Redis server's URL.
    RedisUrl,
    /// The certificate authorities a TLS connection trusts (PEM).
    TlsRootCa,
    /// The client certificate a TLS connection presents (PEM).
    TlsClientCert,
    /// The private key of that client certificate (PEM).
    TlsClientKey,
    /// A server's URL (NATS, AMQP, PostgreSQL, MySQL).
    ServerUrl,
    /// A NATS subject.
    Subject,
    /// A NATS queue group.
    QueueGroup,
    /// A JetStream stream's name.
    StreamName,
    /// A JetStream durable consumer's name.
    DurableName,
    /// How often a message is delivered before it is dead-lettered.
    MaxDeliver,
    /// How long a delivered message waits for its acknowledgement.
    AckWait,
    /// Where given-up messages are published (a NATS subject).
    DeadLetterSubject,
    /// An AMQP queue.
    AmqpQueue,
    /// An AMQP exchange.
    Exchange,
    /// Messages delivered before any is acknowledged (AMQP prefetch).
    Prefetch,
    /// A database table.
    Table,
    /// How long a claimed row stays claimed.
    ClaimLease,
    /// Where a checkpoint is kept.
    Checkpoint,
    /// The lock service whose fences a checkpoint keeps.
    LockService,
    /// How long a request waits for the server's answer.
    RequestTimeout,
    /// How often a server sends a heartbeat on an idle stream.
    Heartbeat,
    /// Where a sink sends messages (an HTTP URL).
    SinkUrl,
    /// The media type of what a sink sends.
    ContentType,
    /// How long a sink remembers the ids it has taken.
    DuplicateWindow,
    /// The MQTT topic a sink publishes to.
    PublishTopic,
    /// Messages a sink has out at once.
    InFlight,
    /// A header a sink sends with every request.
    Header,
}

impl Parameter {
    /// Whether the value is text (quoted in messages, so an empty one
    /// shows) rather than a quantity or a list.
    fn is_text(self) -> bool {
        matches!(
            self,
            Parameter::Stream
                | Parameter::ConsumerGroup
                | Parameter::ConsumerName
                | Parameter::BrokerHost
                | Parameter::ClientId
                | Parameter::ShareGroup
                | Parameter::TopicFilter
                | Parameter::GuardedSubscription
                | Parameter::RedisUrl
                | Parameter::ServerUrl
                | Parameter::Subject
                | Parameter::QueueGroup
                | Parameter::StreamName
                | Parameter::DurableName
                | Parameter::DeadLetterSubject
                | Parameter::AmqpQueue
                | Parameter::Exchange
                | Parameter::Table
                | Parameter::Checkpoint
                | Parameter::LockService
                | Parameter::SinkUrl
                | Parameter::ContentType
                | Parameter::PublishTopic
        )
    }
}

impl fmt::Display for Parameter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Parameter::Stream => "stream",
            Parameter::ConsumerGroup => "consumer group",
            Parameter::ConsumerName => "consumer name",
            Parameter::Batch => "batch",
            Parameter::Concurrency => "concurrency",
            Parameter::ClaimIdle => "claim idle time",
            Parameter::RetryPolicy => "retry policy",
            Parameter::Patterns => "Pub/Sub patterns",
            Parameter::QueueCapacity => "handler queue capacity",
            Parameter::BrokerHost => "broker host",
            Parameter::ClientId => "client id",
            Parameter::ShareGroup => "share group",
            Parameter::TopicFilter => "topic filter",
            Parameter::GuardedSubscription => "guarded subscription",
            Parameter::LeaseTiming => "lease timing",
            Parameter::RedisUrl => "Redis URL",
            Parameter::TlsRootCa => "TLS root CA",
            Parameter::TlsClientCert => "TLS client certificate",
            Parameter::TlsClientKey => "TLS client key",
            Parameter::ServerUrl => "server URL",
            Parameter::Subject => "subject",
            Parameter::QueueGroup => "queue group",
            Parameter::StreamName => "JetStream stream",
            Parameter::DurableName => "durable consumer name",
            Parameter::MaxDeliver => "max deliveries",
            Parameter::AckWait => "ack wait",
            Parameter::DeadLetterSubject => "dead-letter subject",
            Parameter::AmqpQueue => "AMQP queue",
            Parameter::Exchange => "AMQP exchange",
            Parameter::Prefetch => "prefetch",
            Parameter::Table => "table",
            Parameter::ClaimLease => "claim lease",
            Parameter::Checkpoint => "checkpoint",
            Parameter::LockService => "lock service",
            Parameter::RequestTimeout => "request timeout",
            Parameter::Heartbeat => "heartbeat period",
            Parameter::SinkUrl => "sink URL",
            Parameter::ContentType => "content type",
            Parameter::DuplicateWindow => "duplicate window",
            Parameter::PublishTopic => "topic to publish to",
            Parameter::InFlight => "messages in flight",
            Parameter::Header => "request header",
        })
    }
}

/// A value a source's builder refused: which parameter, the value as
/// given (as text; a URL without its password or token) and the rule it
/// breaks, with the cause where a library gave one. Every source's error
/// carries it as its `InvalidInput` variant, so a caller maps any of them
/// to its own names (a configuration key) in one place.
///
/// ```
/// use guard_endpoints::Parameter;
/// use guard_endpoints::mqtt::{MqttError, Subscription};
///
/// let Err(MqttError::InvalidInput(refused)) = Subscription::plain("") else {
///     panic!("an empty filter is refused");
/// };
/// assert_eq!(refused.parameter, Parameter::TopicFilter);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct InvalidInput {
    /// What was refused.
    pub parameter: Parameter,
    /// The value given, as text.
    pub value: String,
    /// The rule it breaks.
    pub rule: String,
    /// The library's own error, where it gave one (a URL parser's, a
    /// client's), shared so the error stays `Clone`.
    pub source: Option<Arc<dyn Error + Send + Sync>>,
}

impl InvalidInput {
    /// `value` of `parameter` breaks `rule`.
    pub(crate) fn new(
        parameter: Parameter,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> Self {
        InvalidInput {
            parameter,
            value: value.into(),
            rule: rule.into(),
            source: None,
        }
    }
}

impl fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_invalid(f, self.parameter, &self.value, &self.rule)
    }
}

impl Error for InvalidInput {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// A source's error that may be a refused parameter: lets a caller map
/// every source's refusals to its own names in one place.
pub trait Refusal: fmt::Display {
    /// The refused parameter, when that is what this error is.
    fn invalid_input(&self) -> Option<&InvalidInput>;
}

/// `Refusal` for a source's error enum with an `InvalidInput` variant.
macro_rules! refusal {
    ($error:ty) => {
        impl $crate::parameter::Refusal for $error {
            fn invalid_input(&self) -> Option<&$crate::parameter::InvalidInput> {
                match self {
                    Self::InvalidInput(input) => Some(input),
                    _ => None,
                }
            }
        }
    };
}
pub(crate) use refusal;

/// `invalid <parameter> <value>: <rule>`; a text value is quoted, an
/// empty quantity left out.
fn write_invalid(
    f: &mut fmt::Formatter<'_>,
    parameter: Parameter,
    value: &str,
    rule: &str,
) -> fmt::Result {
    if parameter.is_text() {
        write!(f, "invalid {parameter} {value:?}: {rule}")
    } else if value.is_empty() {
        write!(f, "invalid {parameter}: {rule}")
    } else {
        write!(f, "invalid {parameter} {value}: {rule}")
    }
}

/// A server's address with its secrets hidden, for errors, logs and
/// `Debug` output: guard-std's one redaction for every URL form and
/// key/value connection string.
pub use guard_std::redact::redacted;

//! RabbitMQ (AMQP 0.9.1) sources, with the seeds' rule, on smol.
//!
//! Which consumer to use depends on what the broker does with a message:
//!
//! - **A work queue** ([`WorkQueueConsumer`]): every replica consumes the
//!   same durable queue and the broker delivers each message to one of
//!   them, so there is no guard (a guard would turn the broker's
//!   legitimate redeliveries into losses). A message is acknowledged after
//!   its handler succeeded, retried in process under a
//!   [`RetryPolicy`](guard_core::retry::RetryPolicy) while its
//!   [`Classifier`](guard_core::retry::Classifier) allows, and once the
//!   retries are spent it is rejected without requeueing: the broker
//!   moves it to the queue's dead-letter queue (`<queue>.dead-letters`
//!   unless set), declared with it, and records its origin (queue,
//!   exchange, routing keys, reason `rejected`) in its `x-death` header.
//! - **A fanout exchange** ([`FanoutConsumer`]): every bound queue gets
//!   every message. Given a lease ([`FanoutConsumer::with_guard`]), only
//!   the elected replica binds a queue: on promotion it declares an
//!   exclusive, auto-delete queue bound to the exchange and consumes it;
//!   the lease is checked immediately before every handler call, retries
//!   included, and its fence handed over in [`AmqpMessage::fence`]; a
//!   demotion closes the connection, and the queue goes with it. Without
//!   a guard every replica consumes its own copy (state every replica
//!   should see). Either way a failing handler is retried under the
//!   consumer's policy, and once the retries are spent the message is
//!   rejected without requeueing: the broker moves it from the replica's
//!   exclusive queue to the durable dead-letter queue the replicas share
//!   (`<exchange>.dead-letters` unless set), with its origin (the
//!   exclusive queue, `amq.gen-…`; the exchange; routing keys; reason
//!   `rejected`) in its `x-death` header.
//! - **A single-active-consumer queue**
//!   ([`WorkQueueConsumer::with_single_active_consumer`]): a work queue
//!   declared with `x-single-active-consumer`; every replica consumes it
//!   and the broker delivers to one of them at a time, in queue order.
//!   See the comparison below before choosing it over a lease.
//!
//! # Guarantees and their limits
//!
//! - **Work queue: at least once, nothing lost.** A message leaves the
//!   queue only when acknowledged after its handler succeeded, or when
//!   rejected after its retries (then the dead-letter queue holds it). A
//!   message whose connection fails before its acknowledgement reaches
//!   the broker is delivered again, to this or another replica, and
//!   handled again ([`AmqpStats::redelivered`] counts such deliveries):
//!   make handlers idempotent, or deduplicate downstream.
//! - **Order**: messages are handled one at a time per consumer. A message
//!   being retried holds its place: the rest of the prefetch window waits
//!   behind it (behind an elected fanout consumer's, lost with it if
//!   leadership ends meanwhile). Across replicas a work queue keeps no
//!   order; a single-active-consumer queue does (one consumer at a time).
//! - **Elected fanout: one replica hands messages over, and only under a
//!   valid lease.** Nothing is handed to the handler once this replica's
//!   renew deadline has passed on its own clock (a paused process wakes up
//!   with deliveries buffered): such deliveries are counted in
//!   [`AmqpStats::refused_late`] and logged. Every call of the handler,
//!   retries included, is made under the lease the first call of its
//!   message was made under: before each retry, after its wait, the lease
//!   must still be valid with the same fence (checked before a call, not
//!   during it: a call that outlasts the lease runs on, so hand the fence
//!   to what refuses stale leaders). A message whose retries are
//!   cut short that way was not given up by its handler, so it is not
//!   dead-lettered: it is counted in [`AmqpStats::refused_late`], logged,
//!   and left unacknowledged in the exclusive queue, which the demotion
//!   that follows deletes (a deleted queue dead-letters nothing): it is
//!   lost. A message still in the handler or between its retries when the
//!   demotion (or the stop) closes the connection is lost likewise, and
//!   counted in [`AmqpStats::dropped_on_close`]. Messages published while no
//!   replica has its queue bound (a takeover: from the old leader's
//!   demotion or death until the new leader has bound its queue, up to
//!   the lease's ttl + interval after a crash) reach nobody, and so do the
//!   ones still queued for, or buffered in, a replica whose leadership
//!   ended: its exclusive queue is deleted with its connection (the
//!   buffered ones are counted in [`AmqpStats::dropped_on_close`]). The
//!   guard removes duplicate consumption; it adds no persistence. Where
//!   every message must be handled, publish to a work queue.
//! - **Fanout dead letters**: what the dead-letter queue holds outlives
//!   the replicas' exclusive queues (it is durable, not exclusive). A
//!   message given up under a lease is dead-lettered once (only the
//!   leader has a queue). Without a guard each replica handles, retries
//!   and gives up its own copy: the dead-letter queue holds one per
//!   replica that gave up, told apart by the queue in `x-death`.
//! - **Nothing is dropped silently**: every delivery is handled,
//!   dead-lettered, refused, left to the broker (which requeues what a
//!   closed channel had not acknowledged), or lost with a fanout
//!   consumer's exclusive queue, and counted in [`AmqpStats`]; failures
//!   and losses are logged (a burst of connection failures as its first,
//!   then a count).
//! - **Reconnection**: a failed connection (a broker restart, a network
//!   failure, a missed heartbeat) is opened again after the reconnect
//!   delay, and the queues, exchange and bindings are declared again. A
//!   declaration the broker refuses (a queue that exists with other
//!   arguments: `PRECONDITION_FAILED`; a name the user may not use:
//!   `ACCESS_REFUSED`) is no connection problem: `run` returns it as an
//!   [`AmqpError::Declare`] naming the queue or exchange.
//!
//! # Single active consumer: the broker's election and ours
//!
//! A single-active-consumer queue and an elected fanout consumer both keep
//! one replica consuming; they differ in what they promise:
//!
//! - **Failover.** The broker moves a single-active-consumer queue to the
//!   next consumer as soon as the active one's channel or connection
//!   closes: at once for a process that exits or is killed (its socket
//!   closes), after the heartbeat timeout for a host that dies or a
//!   network that partitions. A consumer that hangs while its connection
//!   stays up keeps the queue, and the queue stalls: the client's
//!   heartbeats are sent by its own I/O thread, so a handler that never
//!   returns does not stop them. Our lease moves after at most ttl +
//!   interval when the leader dies (at once when it stops), and likewise
//!   stays with a replica whose lease task runs while its handler hangs.
//! - **Fencing.** The broker hands out no token: an old active consumer
//!   that still holds unacknowledged messages (paused, or cut off until
//!   its heartbeat times out) may act on them while the new one handles
//!   the same messages, requeued. Nothing lets a resource tell the two
//!   apart. The lease gives every message its fence
//!   ([`AmqpMessage::fence`]), strictly increasing per leadership, and a
//!   replica hands nothing over past its renew deadline.
//! - **Loss.** A single-active-consumer queue is a durable queue: what the
//!   old consumer had not acknowledged is requeued to the new one, and
//!   nothing published during the switch is lost (delivery is at least
//!   once). The elected fanout consumer loses what is published during a
//!   takeover (see above).
//!
//! Use the broker's where at-least-once delivery in order matters and a
//! duplicate during failover is harmless; use the lease where a stale
//! consumer must be refused by what it acts on.
//!
//! The client is `lapin` on smol's executor; timers follow the caller's
//! runtime. TLS (`amqps://`) is not built in: such URLs are refused.
//!
//! ```no_run
//! # smol::block_on(async {
//! use std::time::Duration;
//! use guard_core::retry::{Classifier, RetryPolicy};
//! use guard_endpoints::amqp::{AmqpOptions, WorkQueueConsumer};
//!
//! let options = AmqpOptions::new("amqp://guest:guest@127.0.0.1:5672/%2f")?;
//! let consumer = WorkQueueConsumer::new(options, "orders")?
//!     .with_prefetch(32)?
//!     .with_retry(RetryPolicy::fixed_delay(2, Duration::from_millis(100)))?;
//! let (_handle, control) = guard_smol::control();
//! let stats = consumer
//!     .run(control, Classifier::retry_all(), |message| async move {
//!         println!("{:?}", message.payload);
//!         Ok::<(), String>(())
//!     })
//!     .await?;
//! println!("handled {}", stats.handled);
//! # Ok::<(), guard_endpoints::amqp::AmqpError>(())
//! # });
//! ```

mod error;
mod fanout;
mod session;
mod work;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lapin::types::ShortString;
use lapin::uri::{AMQPScheme, AMQPUri};

use crate::delivery::ElectedLease;
use crate::link::Link;
use crate::parameter::{Parameter, redacted};

pub use error::AmqpError;
pub use fanout::FanoutConsumer;
pub use work::WorkQueueConsumer;

/// Limit on connecting and on each round of declarations.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Wait before connecting again after a connection failed.
pub const DEFAULT_RECONNECT_DELAY: Duration = Duration::from_secs(1);
/// Messages the broker sends a consumer before any is acknowledged.
pub const DEFAULT_PREFETCH: u16 = 16;
/// What a dead-letter queue is called unless set: a work queue's
/// `<queue>`, a fanout consumer's `<exchange>`, followed by this.
pub const DEAD_LETTER_SUFFIX: &str = ".dead-letters";

/// Where the broker is, and how to reach it.
#[derive(Clone)]
pub struct AmqpOptions {
    uri: AMQPUri,
    connect_timeout: Duration,
    reconnect_delay: Duration,
    connection_name: Option<String>,
    link: Option<Link>,
}

impl fmt::Debug for AmqpOptions {
    // Without the credentials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpOptions")
            .field("server", &self.server())
            .field("connect_timeout", &self.connect_timeout)
            .field("reconnect_delay", &self.reconnect_delay)
            .field("connection_name", &self.connection_name)
            .finish()
    }
}

impl AmqpOptions {
    /// The broker at `url`: `amqp://user:password@host:port/vhost`, the
    /// virtual host percent-encoded (`%2f` for `/`, the default when the
    /// path is left out); the query may set `heartbeat` (seconds, 0 for
    /// none; the broker's proposal otherwise, 60 s by default) and
    /// `frame_max`.
    pub fn new(url: &str) -> Result<Self, AmqpError> {
        let uri = url.parse::<AMQPUri>().map_err(|e| {
            AmqpError::InvalidInput(crate::InvalidInput {
                parameter: Parameter::ServerUrl,
                value: redacted(url),
                rule: "must be an AMQP URL: amqp://user:password@host:port/vhost".to_owned(),
                source: Some(Arc::new(UrlError(e))),
            })
        })?;
        if uri.scheme == AMQPScheme::AMQPS {
            return Err(AmqpError::invalid(
                Parameter::ServerUrl,
                redacted(url),
                "amqps:// needs TLS, which this build does not include; use amqp://",
            ));
        }
        if uri.authority.host.is_empty() {
            return Err(AmqpError::invalid(
                Parameter::ServerUrl,
                redacted(url),
                "must name a host",
            ));
        }
        Ok(AmqpOptions {
            uri,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            reconnect_delay: DEFAULT_RECONNECT_DELAY,
            connection_name: None,
            link: None,
        })
    }

    /// The limit on connecting and on each round of declarations.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The wait before connecting again after a failure.
    pub fn with_reconnect_delay(mut self, delay: Duration) -> Self {
        self.reconnect_delay = delay;
        self
    }

    /// The name the broker shows for this replica's connections (its
    /// management UI, `rabbitmqctl list_connections client_properties`).
    pub fn with_connection_name(mut self, name: &str) -> Self {
        self.connection_name = Some(name.to_owned());
        self
    }

    /// Reports the consumer's connection to `link` (see [`crate::link`]):
    /// down from a failed connect or a connection that ended, up again
    /// when it is consuming.
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = Some(link);
        self
    }

    /// The link set with [`with_link`](Self::with_link), or one named
    /// `AMQP <label>`.
    pub(crate) fn link(&self, label: &str) -> Link {
        self.link
            .clone()
            .unwrap_or_else(|| Link::new(&format!("AMQP {label}")))
    }

    /// `host:port/vhost`, without the credentials.
    pub fn server(&self) -> String {
        format!(
            "{}:{}/{}",
            self.uri.authority.host, self.uri.authority.port, self.uri.vhost
        )
    }
}

/// The URL parser's complaint, as an error value.
#[derive(Debug)]
struct UrlError(String);

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UrlError {}

/// A queue or exchange name the broker accepts: non-empty unless
/// `empty_ok`, at most 255 bytes (an AMQP short string), not in the
/// broker's reserved `amq.` namespace.
fn checked_name(parameter: Parameter, name: &str) -> Result<ShortString, AmqpError> {
    if name.is_empty() {
        return Err(AmqpError::invalid(parameter, name, "must not be empty"));
    }
    if name.starts_with("amq.") {
        return Err(AmqpError::invalid(
            parameter,
            name,
            "must not start with \"amq.\" (reserved by the broker)",
        ));
    }
    ShortString::try_new(name).map_err(|e| {
        AmqpError::InvalidInput(crate::InvalidInput {
            parameter,
            value: name.to_owned(),
            rule: "must be at most 255 bytes".to_owned(),
            source: Some(Arc::new(e)),
        })
    })
}

/// A prefetch the broker applies: 0 would mean no limit at all, so a
/// consumer that falls behind would buffer the whole queue.
fn checked_prefetch(prefetch: u16) -> Result<u16, AmqpError> {
    if prefetch == 0 {
        return Err(AmqpError::invalid(
            Parameter::Prefetch,
            "0",
            "must be at least 1 (0 means unlimited to the broker)",
        ));
    }
    Ok(prefetch)
}

/// The default dead-letter queue of the queue or exchange `name`
/// (`placeholder` in the rule: `<queue>`, `<exchange>`):
/// `name` followed by [`DEAD_LETTER_SUFFIX`], which must fit in an AMQP
/// short string too.
fn default_dead_letters(
    parameter: Parameter,
    name: &str,
    placeholder: &str,
) -> Result<ShortString, AmqpError> {
    ShortString::try_new(format!("{name}{DEAD_LETTER_SUFFIX}")).map_err(|_| {
        AmqpError::invalid(
            parameter,
            name,
            format!(
                "must leave room for its dead-letter queue's name, {placeholder}{DEAD_LETTER_SUFFIX}, within 255 bytes"
            ),
        )
    })
}

/// Why an acknowledgement or rejection was not sent.
fn why_not_sent(sent: &Result<bool, lapin::Error>) -> String {
    match sent {
        Err(e) => e.to_string(),
        Ok(_) => "the channel had closed".to_owned(),
    }
}

/// One delivered message, as the handler sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct AmqpMessage {
    /// The exchange it was published to (empty: the default exchange).
    pub exchange: String,
    /// The routing key it was published with.
    pub routing_key: String,
    /// Its body.
    pub payload: Vec<u8>,
    /// Its properties: headers, message id, content type, ...
    pub properties: lapin::BasicProperties,
    /// Whether the broker delivered it before (to this or another
    /// consumer) without an acknowledgement.
    pub redelivered: bool,
    /// For an elected consumer, the fence of the lease, checked valid
    /// immediately before the handler was called (0 without a locker):
    /// pass it to a resource that refuses stale leaders.
    pub fence: Option<u64>,
    /// For an elected consumer, the lease the message was read under: a
    /// handler that waits before its side effect checks
    /// [`ElectedLease::is_valid`] again immediately before it.
    pub lease: Option<ElectedLease>,
}

impl AmqpMessage {
    /// The message of `delivery`, moved out of it (what stays is its
    /// acknowledgement handle), read under `lease`.
    fn take(delivery: &mut lapin::message::Delivery, lease: Option<&ElectedLease>) -> Self {
        AmqpMessage {
            exchange: std::mem::take(&mut delivery.exchange).into(),
            routing_key: std::mem::take(&mut delivery.routing_key).into(),
            payload: std::mem::take(&mut delivery.data),
            properties: std::mem::take(&mut delivery.properties),
            redelivered: delivery.redelivered,
            fence: lease.map(ElectedLease::fence),
            lease: lease.cloned(),
        }
    }
}

/// What a consumer did, counted from its creation.
///
/// A delivery ends in one of `handled`, `dead_lettered`, `refused_late`,
/// `unacknowledged` or `dropped_on_close`, or was still buffered when a
/// work queue's connection closed (the broker requeues it, and it comes
/// back flagged `redelivered`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AmqpStats {
    /// Messages whose handler succeeded, acknowledged.
    pub handled: u64,
    /// Messages whose retries were spent (or whose error the classifier
    /// refused to retry), rejected without requeueing: the broker moved
    /// them to the dead-letter queue.
    pub dead_lettered: u64,
    /// Deliveries the broker flagged as redelivered: an earlier delivery
    /// was never acknowledged (its consumer's channel closed).
    pub redelivered: u64,
    /// Deliveries an elected consumer did not hand over because its lease
    /// was no longer valid (past its renew deadline, or leadership already
    /// ended and the connection not yet closed), and messages whose
    /// retries it stopped because the lease no longer held the first
    /// call's fence (not dead-lettered: lost with the exclusive queue).
    pub refused_late: u64,
    /// Handled or given-up messages whose acknowledgement (or rejection)
    /// could not be sent (the channel had closed): a work queue's broker
    /// delivers them again; a fanout consumer's are lost with its
    /// exclusive queue.
    pub unacknowledged: u64,
    /// Deliveries buffered in a fanout consumer when its connection
    /// closed (a demotion, the stop, a failure), or in its handler or
    /// between their retries when a demotion or an elected consumer's
    /// stop closed it: its exclusive queue goes with it, so they are lost
    /// to this replica.
    pub dropped_on_close: u64,
    /// Connections opened again after a failure.
    pub reconnects: u64,
}

/// The counters behind [`AmqpStats`], shared by a consumer's tasks.
#[derive(Debug, Default)]
struct Counters {
    handled: AtomicU64,
    dead_lettered: AtomicU64,
    redelivered: AtomicU64,
    refused_late: AtomicU64,
    unacknowledged: AtomicU64,
    dropped_on_close: AtomicU64,
    reconnects: AtomicU64,
    /// The last connection (or attempt) failed: the next one that works
    /// is a reconnection.
    failed: AtomicBool,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A connection failed (or could not be opened).
    fn failed(&self) {
        self.failed.store(true, Ordering::Relaxed);
    }

    /// A connection is up: a reconnection if the last one failed.
    fn connected(&self) -> bool {
        let again = self.failed.swap(false, Ordering::Relaxed);
        if again {
            Counters::add(&self.reconnects, 1);
        }
        again
    }

    fn snapshot(&self) -> AmqpStats {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        AmqpStats {
            handled: read(&self.handled),
            dead_lettered: read(&self.dead_lettered),
            redelivered: read(&self.redelivered),
            refused_late: read(&self.refused_late),
            unacknowledged: read(&self.unacknowledged),
            dropped_on_close: read(&self.dropped_on_close),
            reconnects: read(&self.reconnects),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_password_never_shows_in_a_refused_url() {
        let err = AmqpOptions::new("amqps://user:secret@broker:5671/%2f").unwrap_err();
        let text = err.to_string();
        assert!(!text.contains("secret"), "{text}");
        assert!(text.contains("user:***@broker:5671/%2f"), "{text}");
    }

    #[test]
    fn a_url_the_parser_refuses_keeps_its_complaint_as_the_source() {
        let err = AmqpOptions::new("http://broker:5672").unwrap_err();
        assert!(
            matches!(
                &err,
                AmqpError::InvalidInput(crate::InvalidInput {
                    parameter: Parameter::ServerUrl,
                    ..
                })
            ),
            "{err:?}"
        );
        assert!(err.source().is_some(), "{err:?}");
        let copy = err.clone();
        assert_eq!(copy.to_string(), err.to_string());
    }

    #[test]
    fn the_server_is_named_without_credentials() {
        let options = AmqpOptions::new("amqp://guest:guest@127.0.0.1:5673/orders").unwrap();
        assert_eq!(options.server(), "127.0.0.1:5673/orders");
        assert!(!format!("{options:?}").contains("guest"));
        let default = AmqpOptions::new("amqp://127.0.0.1").unwrap();
        assert_eq!(default.server(), "127.0.0.1:5672//");
    }

    #[test]
    fn names_are_checked_as_the_broker_would() {
        assert!(checked_name(Parameter::AmqpQueue, "orders").is_ok());
        for bad in ["", "amq.orders"] {
            let err = checked_name(Parameter::AmqpQueue, bad).unwrap_err();
            assert!(
                matches!(&err, AmqpError::InvalidInput(crate::InvalidInput { value, .. }) if value == bad),
                "{err:?}"
            );
        }
        let long = "q".repeat(256);
        let err = checked_name(Parameter::Exchange, &long).unwrap_err();
        assert!(err.to_string().contains("at most 255 bytes"), "{err}");
        assert!(checked_prefetch(0).is_err());
        assert_eq!(checked_prefetch(1).unwrap(), 1);
    }

    #[test]
    fn a_reconnection_is_counted_once_per_failure() {
        let counters = Counters::default();
        assert!(!counters.connected(), "the first connection");
        counters.failed();
        counters.failed();
        assert!(counters.connected());
        assert!(!counters.connected());
        assert_eq!(counters.snapshot().reconnects, 1);
    }
}

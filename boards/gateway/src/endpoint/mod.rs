//! `[[endpoints]]`: each configured source becomes a task of the replica
//! that reports every handled message as an [`Event::Received`], after
//! its limiter (if any) admitted it. Each source kind is one module: its
//! entry as written, its check, its validated source (re-exported by
//! [`crate::config`]), what `check` prints of it and its assembly; what
//! every kind shares (the [`Inbox`] a message passes, the report of a
//! handled message) is here. Adding a kind is its module plus one line in
//! each enum that lists the kinds (`raw::Endpoint`, [`Source`]) and in
//! the matches over them, which are exhaustive.

#[cfg_attr(not(feature = "amqp"), allow(dead_code, unused_imports))]
pub(crate) mod amqp;
mod forward;
pub(crate) mod mqtt;
#[cfg_attr(not(feature = "mysql"), allow(dead_code, unused_imports))]
pub(crate) mod mysql;
#[cfg_attr(not(feature = "nats"), allow(dead_code, unused_imports))]
pub(crate) mod nats;
#[cfg_attr(not(feature = "postgres"), allow(dead_code, unused_imports))]
pub(crate) mod postgres;
pub(crate) mod redis;
#[cfg(any(
    feature = "nats",
    feature = "amqp",
    feature = "postgres",
    feature = "mysql"
))]
mod retrying;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use guard_core::guard::ActiveConfig;
use guard_core::lock::Scope;
use guard_core::retry::Classifier;
use guard_endpoints::delivery::{ElectedLease, Unhandled, UnhandledReason};
use guard_endpoints::link::Link;
use guard_endpoints::redis::StreamMessage;
use guard_smol::Control;
use guard_std::metered::MeteredDeadLetterQueue;
use guard_std::{Clock, SystemClock, Throttle};

use crate::admission::{Admission, DEAD_LETTERS, Refusal, Undelivered, Verdict};
use crate::built::{Built, limiter};
use crate::config::{Config, Endpoint, LimitKey, Source};
use crate::error::GatewayError;
use crate::event::{Content, Event};
use crate::readiness::Readiness;

/// A task of the replica.
pub(crate) type Task = Pin<Box<dyn Future<Output = ()>>>;

type Emit = Arc<dyn Fn(Event) + Send + Sync>;

/// Text of bytes, invalid UTF-8 replaced.
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Why a message is not handed to the handler.
#[derive(Debug)]
enum Refused {
    /// The limiter refused it: retried under the endpoint's policy.
    Limited(String),
    /// It can never be handled (too large, a field missing, refused for
    /// good by the sink): dead-lettered at once, with no retry.
    Invalid(String),
    /// The sink did not take it this time, its own retries spent:
    /// retried under the endpoint's policy.
    SinkFailed(String),
    /// The lease it was read under ended while it waited (for the
    /// limiter): no effect under it; the endpoint's delivery path hands
    /// it to the dead letters, or leaves it to a source that keeps it.
    // Made only by the sources that retry by themselves, each a feature.
    #[cfg_attr(
        not(any(
            feature = "nats",
            feature = "amqp",
            feature = "postgres",
            feature = "mysql"
        )),
        allow(dead_code)
    )]
    LeaseLost,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Limited(why) | Refused::Invalid(why) | Refused::SinkFailed(why) => {
                f.write_str(why)
            }
            Refused::LeaseLost => f.write_str(LEASE_LOST_WAITING),
        }
    }
}

/// The bytes each of a broadcast endpoint's tables in memory (its Pub/Sub
/// handler queue, its dead letters when not on disk) may hold: a
/// producer's long channel names and large payloads fill them at this,
/// long before their count of messages would take a GiB.
pub const MEMORY_BYTES: usize = 16 << 20;

/// The bound in bytes of the tables in memory of an endpoint whose
/// messages are at most `max_payload` bytes: [`MEMORY_BYTES`], or room for
/// two of its largest messages if that is more.
pub fn memory_bytes(max_payload: usize) -> usize {
    MEMORY_BYTES.max(max_payload.saturating_mul(2))
}

/// Why a message whose lease ended while it waited is not handled.
const LEASE_LOST_WAITING: &str =
    "the lease it was read under ended while it waited for the limiter";

/// What every message of one endpoint passes before its handler: the
/// size bound, for a stream entry its required fields, and the limiter,
/// if any; and where a broadcast message that cannot pass goes (the
/// source keeps nothing itself).
struct Inbox {
    name: String,
    max_payload: usize,
    limit: Option<(Admission, LimitKey)>,
    dead_letters: Arc<MeteredDeadLetterQueue<Undelivered, String, DEAD_LETTERS>>,
    /// The dead letters on disk, which take the place of the in-memory
    /// ones when configured.
    on_disk: Option<Arc<crate::dead_letters::DeadLetterStore>>,
    /// The sink a message goes to once it passed, if any.
    forward: Option<forward::Forward>,
    clock: SystemClock,
    /// A flood of refusals is logged once per interval.
    warnings: Throttle,
    /// A flood of drops (the dead-letter queue full) likewise, apart from
    /// the refusals so that a drop is never hidden behind them.
    drops: Throttle,
}

/// The limiter key of a message of endpoint `name` from `from` (its
/// channel or topic), or, for a stream entry, with its `fields`.
fn limit_key<'a>(
    name: &'a str,
    key: &'a LimitKey,
    from: &'a str,
    fields: Option<&'a StreamMessage>,
) -> &'a str {
    // A channel or value no limiter takes (missing, empty, not UTF-8,
    // over the key rule's length) is limited under the whole source's
    // key, which an entry that leaves the field out shares anyway: never
    // unlimited, never refused for its name.
    let usable = |k: &&str| guard_std::ratelimit::check_key(k).is_ok();
    match key {
        LimitKey::Source => name,
        LimitKey::Topic => Some(from).filter(usable).unwrap_or(name),
        LimitKey::Field(field) => fields
            .and_then(|m| m.field(field))
            .and_then(|v| std::str::from_utf8(v).ok())
            .filter(usable)
            .unwrap_or(name),
    }
}

impl Inbox {
    fn new(
        built: &Built,
        config: &Config,
        entry: &Endpoint,
        control: &Control,
    ) -> Result<Self, GatewayError> {
        let limit = match &entry.limit {
            Some(limit) => Some((
                Admission::new(limiter(built, &limit.limiter)?, limit.when_limited)
                    .counting(limit.cost),
                limit.key.clone(),
            )),
            None => None,
        };
        Ok(Inbox {
            name: entry.name.clone(),
            max_payload: entry.max_payload_bytes,
            limit,
            dead_letters: Arc::new(MeteredDeadLetterQueue::bounded_in_bytes(
                &entry.name,
                memory_bytes(entry.max_payload_bytes),
                Undelivered::weight,
            )),
            on_disk: built.dead_letters.as_ref().map(|(store, _)| store.clone()),
            forward: match &entry.to {
                None => None,
                Some(to) => {
                    let (sink, retry) = crate::sink::made(built, config, to)?;
                    Some(forward::Forward::new(to, sink, retry, control.clone()))
                }
            },
            clock: SystemClock::new(),
            warnings: Throttle::new(),
            drops: Throttle::new(),
        })
    }

    /// The limiter key of a message from `from` (its channel or topic),
    /// or, for a stream entry, with its `fields`.
    fn key_of<'a>(
        &'a self,
        key: &'a LimitKey,
        from: &'a str,
        fields: Option<&'a StreamMessage>,
    ) -> &'a str {
        limit_key(&self.name, key, from, fields)
    }

    fn too_large(&self, size: usize) -> Option<String> {
        (size > self.max_payload).then(|| {
            format!(
                "payload of {size} bytes over max_payload_bytes = {}",
                self.max_payload
            )
        })
    }

    /// Passes a stream entry: `Ok` when the handler may run.
    async fn check_entry(&self, message: &StreamMessage, fields: &[String]) -> Result<(), Refused> {
        let size = message.fields.values().map(Vec::len).sum();
        if let Some(why) = self.too_large(size) {
            return Err(Refused::Invalid(why));
        }
        let missing: Vec<&str> = fields
            .iter()
            .filter(|f| message.field(f).is_none())
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(Refused::Invalid(format!(
                "entry without the field(s) {missing:?}"
            )));
        }
        if let Some((admission, key)) = &self.limit
            && let Verdict::Refused(why) = admission
                .admit(self.key_of(key, &message.id, Some(message)), size)
                .await
        {
            return Err(Refused::Limited(why.to_string()));
        }
        Ok(())
    }

    /// Keeps a message this endpoint did not handle in its dead letters
    /// with `why`, the attempts made and the fence it was read under, and
    /// reports it; `false` when the dead-letter queue is full (nothing
    /// kept).
    fn keep(&self, letter: Letter<'_>, emit: &Emit) -> bool {
        let Letter {
            from,
            payload,
            why,
            attempts,
            fence,
        } = letter;
        if let Some(store) = &self.on_disk {
            let letter = crate::dead_letters::DeadLetter {
                place: "endpoint".to_owned(),
                name: self.name.clone(),
                sink: self.forward.as_ref().map(|f| f.sink_name.clone()),
                id: None,
                from: from.to_owned(),
                fence,
                reason: why.clone(),
                attempts,
                at_ms: crate::dead_letters::now_ms(),
                payload: payload.to_vec(),
            };
            if let Err(e) = crate::dead_letters::kept(store, &letter) {
                tracing::error!(
                    "endpoint {}: {from}: not kept as a dead letter: {e}",
                    self.name
                );
                return false;
            }
        } else {
            let message = Undelivered {
                from: from.to_owned(),
                payload: payload.to_vec(),
                fence,
            };
            if self
                .dead_letters
                .add(message, Some(why.clone()), attempts, self.clock.now())
                .is_err()
            {
                return false;
            }
        }
        if let Some(held) = self.warnings.admit() {
            tracing::warn!(
                "endpoint {}: {from}: {why}; dead-lettered ({held} more not logged)",
                self.name
            );
        }
        emit(Event::DeadLettered {
            endpoint: self.name.clone(),
            from: from.to_owned(),
            reason: why,
        });
        true
    }

    /// What an elected source read and did not handle, kept in the
    /// dead letters; a full queue counts it as dropped, loudly.
    fn keep_unhandled(&self, message: Unhandled, emit: &Emit) {
        let why = message.reason.to_string();
        let letter = Letter {
            from: &message.origin,
            payload: &message.payload,
            why: why.clone(),
            attempts: message.reason.attempts(),
            fence: message.fence,
        };
        if !self.keep(letter, emit) {
            self.dropped(
                &message.origin,
                &format!("{why}; the dead-letter queue is full"),
            );
        }
    }

    /// A message with nowhere left to go: counted in
    /// `guard_sink_dropped_total` each time, logged at error level once
    /// per interval with the count held back.
    fn dropped(&self, from: &str, why: &str) {
        metrics::counter!(guard_std::metrics::SINK_DROPPED, "name" => self.name.clone())
            .increment(1);
        if let Some(held) = self.drops.admit() {
            tracing::error!(
                "endpoint {}: {from}: {why}; message dropped ({held} more dropped, not logged)",
                self.name
            );
        }
    }

    /// Keeps a broadcast message whose lease ended before its effect, as
    /// an elected source keeps what it did not handle.
    fn lease_lost(
        &self,
        from: &str,
        payload: &[u8],
        lease: Option<&ElectedLease>,
        attempts: u32,
        error: String,
        emit: &Emit,
    ) {
        self.keep_unhandled(
            Unhandled {
                origin: from.to_owned(),
                payload: payload.to_vec(),
                fence: lease.map(ElectedLease::fence),
                reason: UnhandledReason::LeaseLost { attempts, error },
            },
            emit,
        );
    }

    /// The unhandled sink of an elected source: its dead letters.
    fn unhandled_to(self: &Arc<Self>, emit: &Emit) -> impl Fn(Unhandled) + Send + Sync + 'static {
        let (inbox, emit) = (self.clone(), emit.clone());
        move |message| inbox.keep_unhandled(message, &emit)
    }

    /// Passes a broadcast message read under `lease` or keeps it as a
    /// dead letter: true when the handler may make its effect, at once
    /// (the lease is checked last, after any wait). A message refused by
    /// the limiter whose dead-letter queue is full waits for the limiter
    /// however long that takes (back-pressure), so nothing is lost here;
    /// one that can never be handled (too large) and finds the queue full
    /// is dropped, logged and counted in `guard_sink_dropped_total`.
    async fn pass(
        &self,
        from: &str,
        payload: &[u8],
        lease: Option<&ElectedLease>,
        emit: &Emit,
    ) -> bool {
        let passed = self.pass_limits(from, payload, lease, emit).await;
        // The limiter's answer may have come past the lease: no effect
        // under it.
        if passed && lease.is_some_and(|lease| !lease.is_valid()) {
            self.lease_lost(from, payload, lease, 0, LEASE_LOST_WAITING.to_owned(), emit);
            return false;
        }
        passed
    }

    /// [`pass`](Self::pass)'s size bound and limiter. A message whose
    /// lease ends while it waits in the limiter takes nothing of its
    /// quota: the lease is asked before each request for a token.
    async fn pass_limits(
        &self,
        from: &str,
        payload: &[u8],
        lease: Option<&ElectedLease>,
        emit: &Emit,
    ) -> bool {
        let may_take = || lease.is_none_or(ElectedLease::is_valid);
        let why = match self.too_large(payload.len()) {
            Some(why) => why,
            None => match &self.limit {
                None => return true,
                Some((admission, key)) => match admission
                    .admit_while(self.key_of(key, from, None), payload.len(), may_take)
                    .await
                {
                    Verdict::Admitted => return true,
                    Verdict::Refused(Refusal::Withdrawn) => {
                        self.lease_lost(
                            from,
                            payload,
                            lease,
                            0,
                            LEASE_LOST_WAITING.to_owned(),
                            emit,
                        );
                        return false;
                    }
                    Verdict::Refused(why) => why.to_string(),
                },
            },
        };
        let letter = Letter {
            from,
            payload,
            why: why.clone(),
            attempts: 1,
            fence: lease.map(ElectedLease::fence),
        };
        if self.keep(letter, emit) {
            return false;
        }
        let waited = match &self.limit {
            Some((admission, key)) if self.too_large(payload.len()).is_none() => {
                if let Some(held) = self.warnings.admit() {
                    tracing::warn!(
                        "endpoint {}: {from}: {why}; the dead-letter queue is full, waiting for the limiter ({held} more not logged)",
                        self.name
                    );
                }
                admission
                    .admit_eventually_while(self.key_of(key, from, None), payload.len(), may_take)
                    .await
            }
            _ => {
                // Nowhere left to keep it: said loudly and counted.
                self.dropped(from, &why);
                return false;
            }
        };
        match waited {
            Ok(()) => true,
            Err(Refusal::Withdrawn) => {
                self.lease_lost(from, payload, lease, 0, LEASE_LOST_WAITING.to_owned(), emit);
                false
            }
            Err(failed) => {
                // Nowhere left to keep it: said loudly and counted.
                self.dropped(from, &failed.to_string());
                false
            }
        }
    }
}

/// A message an endpoint keeps in its dead letters: where it came from,
/// its payload, why, the attempts made and the fence it was read under.
struct Letter<'a> {
    from: &'a str,
    payload: &'a [u8],
    why: String,
    attempts: u32,
    fence: Option<u64>,
}

/// What every source's assembly takes: the endpoint's name and inbox,
/// the replica's guards, configuration and identity, where events go,
/// and what stops the task.
struct Assembly<'a> {
    name: String,
    identity: &'a str,
    built: &'a Built,
    config: &'a Config,
    timing: ActiveConfig,
    inbox: Arc<Inbox>,
    emit: Emit,
    control: Control,
    /// Whether the source reaches its server, watched by `/readyz`.
    link: Link,
    /// The replica's readiness and status, told the endpoint's lease.
    ready: &'a Readiness,
}

/// An error of endpoint `name`, with its cause.
fn failed(name: &str, source: Box<dyn std::error::Error + Send + Sync>) -> GatewayError {
    GatewayError::Endpoint {
        name: name.to_owned(),
        source,
    }
}

/// The kinds in elected endpoints' lease scopes.
pub(crate) use crate::config::scope_kind as kind;

/// An elected endpoint's lease scope: its kind (one of [`kind`]) and its
/// name; its lease key is told to `ready`, for the status view.
fn elected_scope(
    built: &Built,
    ready: &Readiness,
    kind: &str,
    name: &str,
) -> Result<Scope, GatewayError> {
    // The configuration checked the owner and the name against these.
    debug_assert!(
        crate::config::ENDPOINT_SCOPE_KINDS.contains(&kind),
        "{kind}"
    );
    let scope = crate::config::lease_scope(&built.guards, kind, name)
        .map_err(|e| failed(name, e.into()))?;
    let key = guard_core::lock::active_key(built.guards.prefix(), &scope)
        .map_err(|e| failed(name, e.into()))?;
    ready.lease_of(
        &crate::reload::Unit::Endpoint(name.to_owned()).to_string(),
        key.as_str(),
    );
    Ok(scope)
}

/// Whether `source` connects as soon as it starts, on every replica;
/// an elected one connects when its replica is promoted (a standby
/// never does).
fn connects_at_start(source: &Source) -> bool {
    match source {
        Source::RedisPubsub(_) => false,
        Source::RedisStream(_) => true,
        Source::Mqtt(s) => !matches!(s.delivery, mqtt::MqttDelivery::Elected),
        #[cfg(feature = "nats")]
        Source::Nats(s) => !matches!(s.delivery, nats::NatsDelivery::Elected),
        #[cfg(feature = "nats")]
        Source::NatsJetStream(_) => true,
        #[cfg(feature = "amqp")]
        Source::Rabbitmq(s) => {
            !matches!(s.delivery, amqp::AmqpDelivery::Fanout { elected: true, .. })
        }
        #[cfg(feature = "postgres")]
        Source::PostgresQueue(_) => true,
        #[cfg(feature = "mysql")]
        Source::MysqlBinlog(_) => false,
    }
}

/// Builds the task of `entry`, in the module of its source kind. Only
/// the stream and table-of-work endpoints connect here; the others
/// connect when they subscribe.
pub(crate) async fn start(
    entry: &Endpoint,
    built: &Built,
    config: &Config,
    identity: &str,
    control: Control,
    emit: Emit,
    ready: &Readiness,
) -> Result<Task, GatewayError> {
    let link = Link::new(&entry.name);
    ready.watch(link.clone(), connects_at_start(&entry.source));
    let (watched, stop) = (link.clone(), control.clone());
    let cx = Assembly {
        name: entry.name.clone(),
        identity,
        built,
        config,
        timing: config.guards.active.into(),
        inbox: Arc::new(Inbox::new(built, config, entry, &control)?),
        emit,
        control,
        link,
        ready,
    };
    let task = match &entry.source {
        Source::RedisPubsub(source) => redis::pubsub(cx, source),
        Source::RedisStream(source) => redis::stream(cx, source).await,
        Source::Mqtt(source) => mqtt::start(cx, source),
        #[cfg(feature = "nats")]
        Source::Nats(source) => nats::subject(cx, source),
        #[cfg(feature = "nats")]
        Source::NatsJetStream(source) => nats::jetstream(cx, source),
        #[cfg(feature = "amqp")]
        Source::Rabbitmq(source) => amqp::start(cx, source),
        #[cfg(feature = "postgres")]
        Source::PostgresQueue(source) => postgres::start(cx, source).await,
        #[cfg(feature = "mysql")]
        Source::MysqlBinlog(source) => mysql::start(cx, source),
    }
    // One that cannot start (its server refused, on a reload) is down
    // with why, not "connecting": readiness and `guard_source_up` say so.
    .inspect_err(|e| watched.stopped(e))?;
    // An endpoint runs until the replica stops; one that ends before
    // (a declaration refused for good, a subscription that cannot be
    // made) leaves the replica not ready, whatever the source reported.
    Ok(Box::pin(async move {
        task.await;
        if !stop.is_stopped() && !watched.has_stopped() {
            watched.stopped(&"the endpoint ended while the replica runs (see the lines above)");
        }
    }))
}

/// What `check` prints of `source`'s kind and delivery (no URLs: they
/// may hold secrets).
pub(crate) fn describe(source: &Source) -> String {
    match source {
        Source::RedisPubsub(source) => redis::describe_pubsub(source),
        Source::RedisStream(source) => redis::describe_stream(source),
        Source::Mqtt(source) => mqtt::describe(source),
        #[cfg(feature = "nats")]
        Source::Nats(source) => nats::describe_subject(source),
        #[cfg(feature = "nats")]
        Source::NatsJetStream(source) => nats::describe_jetstream(source),
        #[cfg(feature = "amqp")]
        Source::Rabbitmq(source) => amqp::describe(source),
        #[cfg(feature = "postgres")]
        Source::PostgresQueue(source) => postgres::describe(source),
        #[cfg(feature = "mysql")]
        Source::MysqlBinlog(source) => mysql::describe(source),
    }
}

/// Retries every refusal but one that can never pass (too large, a field
/// missing).
fn never_invalid() -> Classifier<Refused> {
    Classifier::retry_all().never(|e: &Refused| matches!(e, Refused::Invalid(_)))
}

#[cfg(test)]
mod tests {
    use guard_endpoints::delivery::UnhandledReason;

    use super::*;

    #[test]
    fn an_entry_or_channel_without_a_usable_key_is_limited_under_the_source_s_key() {
        let key = LimitKey::Field("device".into());
        let entry = |value: Option<&[u8]>| StreamMessage {
            id: "1700000000000-0".into(),
            fields: value
                .map(|v| ("device".to_owned(), v.to_vec()))
                .into_iter()
                .collect(),
        };
        let long = vec![b'd'; guard_std::ratelimit::MAX_KEY_LEN + 1];
        for (value, expected) in [
            (Some(&b"pump-7"[..]), "pump-7"),
            (Some(&b"a}b{"[..]), "a}b{"),
            (None, "orders"),
            (Some(&b""[..]), "orders"),
            (Some(&b"\xff\xfe"[..]), "orders"),
            (Some(long.as_slice()), "orders"),
        ] {
            let message = entry(value);
            assert_eq!(
                limit_key("orders", &key, &message.id, Some(&message)),
                expected,
                "{value:?}"
            );
        }
        assert_eq!(limit_key("orders", &LimitKey::Source, "c", None), "orders");
        assert_eq!(limit_key("orders", &LimitKey::Topic, "c", None), "c");
        // A channel no limiter takes: the source's key, not a refusal.
        let channel = "c".repeat(guard_std::ratelimit::MAX_KEY_LEN + 1);
        assert_eq!(
            limit_key("orders", &LimitKey::Topic, &channel, None),
            "orders"
        );
        assert_eq!(limit_key("orders", &LimitKey::Topic, "", None), "orders");
    }

    /// A letter of `from`'s, refused by a limiter.
    fn limited(from: &str) -> Letter<'_> {
        Letter {
            from,
            payload: b"x",
            why: "rate limited".into(),
            attempts: 1,
            fence: None,
        }
    }

    /// The inbox of an endpoint `alerts` without limiter, sink or disk,
    /// keeping its dead letters in `dead_letters`.
    fn inbox(dead_letters: MeteredDeadLetterQueue<Undelivered, String, DEAD_LETTERS>) -> Inbox {
        Inbox {
            name: "alerts".into(),
            max_payload: 1024,
            limit: None,
            dead_letters: Arc::new(dead_letters),
            on_disk: None,
            forward: None,
            clock: SystemClock::new(),
            warnings: Throttle::new(),
            drops: Throttle::new(),
        }
    }

    #[test]
    fn a_full_dead_letter_queue_logs_what_it_drops_once_per_interval() {
        let log = guard_testkit::SpanLog::new();
        let inbox = inbox(MeteredDeadLetterQueue::new("alerts"));
        let emit: Emit = Arc::new(|_| {});
        let _logged = tracing::subscriber::set_default(log.subscriber());
        for n in 0..DEAD_LETTERS + 500 {
            inbox.keep_unhandled(
                Unhandled {
                    origin: "alerts.fire".into(),
                    payload: n.to_string().into_bytes(),
                    fence: Some(7),
                    reason: UnhandledReason::Demoted,
                },
                &emit,
            );
        }
        let logged = log.events();
        let dropped: Vec<_> = logged
            .iter()
            .filter(|e| e.level <= tracing::Level::WARN && e.message.contains("dropped"))
            .collect();
        assert_eq!(dropped.len(), 1, "one line for 500 drops: {dropped:#?}");
        assert_eq!(inbox.dead_letters.len(), DEAD_LETTERS, "the queue is full");
    }

    #[test]
    fn dead_letters_in_memory_stay_within_their_bytes_whatever_the_names() {
        // A producer publishes on channels of 256 KiB: 1,024 letters of
        // them would hold 256 MiB; the bytes' bound keeps 16 MiB, hands the
        // rest back (counted as dropped, logged) and keeps every name whole.
        let inbox = inbox(MeteredDeadLetterQueue::bounded_in_bytes(
            "alerts",
            memory_bytes(1024),
            Undelivered::weight,
        ));
        let emit: Emit = Arc::new(|_| {});
        let long = |n: usize| format!("alerts.{n:04}.{}", "c".repeat(256 * 1024));
        let kept = (0..1000)
            .filter(|&n| inbox.keep(limited(&long(n)), &emit))
            .count();
        let bytes = inbox.dead_letters.bytes();
        assert!(bytes <= MEMORY_BYTES, "{bytes}");
        assert!((60..=64).contains(&kept), "16 MiB of 256 KiB names: {kept}");
        assert_eq!(inbox.dead_letters.len(), kept);
        // A message of an ordinary name still finds room once a letter is
        // taken out, and the names kept are whole.
        let first = inbox.dead_letters.poll().unwrap();
        assert_eq!(first.element().from, long(0));
        assert!(inbox.keep(limited("alerts.fire"), &emit));
    }
}

//! The one delivery path of an elected endpoint: what every broadcast
//! source that elects its consumer (Redis Pub/Sub, a guarded MQTT
//! subscription, an elected NATS subscriber, an elected RabbitMQ fanout
//! consumer, the binlog reader) does with a message it has read.
//!
//! Guarantees, for every message an elected endpoint reads:
//! - **No effect under a lease that has ended.** The lease the message was
//!   read under ([`ElectedLease`]) is checked on this replica's monotonic
//!   clock, with no round trip, immediately before every side effect the
//!   endpoint makes: the handler call, each retry, the write of a dead
//!   letter to a destination the replicas share, a checkpoint, an
//!   acknowledgement. The handler gets the lease with the message and
//!   checks it again itself before an effect of its own that follows a
//!   wait (a limiter, a slow request). A lease is valid only under the
//!   fence the message was read under: a replica that lost the lease and
//!   won it back does not handle what it read under the old one.
//! - **Nothing read is dropped silently.** Each message ends handled,
//!   dead-lettered with its full content and origin, or handed to the
//!   endpoint's [`UnhandledSink`] with its content, origin and an
//!   [`UnhandledReason`], which also counts it in
//!   `guard_endpoint_dropped_total{key, reason}` and logs it (throttled).
//!   A source that keeps what it delivered (the binlog, which a new
//!   leader reads again from its checkpoint) leaves a message whose lease
//!   ended to that source instead, counted.
//!
//! What the sink receives was read by this replica and is not the new
//! leader's to handle: core NATS, Pub/Sub, a plain MQTT subscription and
//! a fanout queue keep nothing for the next leader. Recording it in a
//! store of this replica's own (the gateway's dead letters) is not an
//! effect under the lease; replaying it later goes through a handler
//! again.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use guard_std::Throttle;
use guard_std::run::LeaseState;

use crate::runtime::LeaseCheck;

/// The lease an elected endpoint read a message under, handed to the
/// handler with the message.
///
/// Valid while this replica still holds that very lease (the same
/// fence) and its renew deadline has not passed on this replica's
/// monotonic clock. The endpoint checks it before calling the handler;
/// a handler that waits before its side effect (a limiter, a slow
/// request) checks [`is_valid`](Self::is_valid) again immediately before
/// it, and passes [`fence`](Self::fence) to a resource that refuses
/// stale leaders.
///
/// It also counts the attempts at the effect of the message in hand (a
/// sink's sends: [`attempted`](Self::attempted)), shared by its clones:
/// an endpoint handles one message at a time under a lease, and a
/// message given up when the lease ends is dead-lettered with that count
/// even when its handler was cut short.
#[derive(Clone)]
pub struct ElectedLease {
    check: LeaseCheck,
    fence: u64,
    key: Arc<str>,
    attempts: Arc<AtomicU32>,
}

impl ElectedLease {
    pub(crate) fn new(check: LeaseCheck, fence: u64, key: &str) -> Self {
        ElectedLease {
            check,
            fence,
            key: key.into(),
            attempts: Arc::default(),
        }
    }

    /// Counts one attempt at the effect of the message in hand (a send to
    /// a sink), for its dead letter should the lease end.
    pub fn attempted(&self) {
        self.attempts.fetch_add(1, Ordering::Relaxed);
    }

    /// The attempts counted for the message in hand.
    pub fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// A new message is in hand: its count starts at 0.
    pub(crate) fn next_message(&self) {
        self.attempts.store(0, Ordering::Relaxed);
    }

    /// The fence the message was read under.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether an effect may be made now: this replica still holds the
    /// lease the message was read under and its renew deadline has not
    /// passed. Check immediately before the effect, with no wait between.
    pub fn is_valid(&self) -> bool {
        matches!(self.state(), LeaseState::Valid(_))
    }

    /// The lease's state, with another lease than this one (a later
    /// promotion) counted as not held.
    pub(crate) fn state(&self) -> LeaseState {
        match self.check.state() {
            LeaseState::Valid(fence) if fence != self.fence => LeaseState::NotHeld,
            state => state,
        }
    }
}

impl fmt::Debug for ElectedLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElectedLease")
            .field("key", &self.key)
            .field("fence", &self.fence)
            .field("state", &self.state())
            .finish()
    }
}

/// Two leases are equal when they are the same key's same fence.
impl PartialEq for ElectedLease {
    fn eq(&self, other: &Self) -> bool {
        self.fence == other.fence && self.key == other.key
    }
}

impl Eq for ElectedLease {}

/// Why an elected endpoint did not handle a message it read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnhandledReason {
    /// Its turn came after the lease's renew deadline had passed on this
    /// replica's clock (a pause), before the runner demoted.
    PastDeadline,
    /// Leadership had ended when its turn came (queued at a demotion or
    /// the stop, read while unsubscribing, read under an earlier lease).
    Demoted,
    /// The lease ended while it was being handled: between two calls of
    /// its handler, during the handler's own wait (the handler found it
    /// gone), or before its dead letter could be written under the lease.
    LeaseLost {
        /// Attempts made: the handler's calls, or the attempts its effect
        /// counted ([`ElectedLease::attempted`]: a sink's sends) when more.
        attempts: u32,
        /// The last call's error.
        error: String,
    },
    /// The handler queue was full (its `WhenFull` policy chose this one).
    QueueFull,
    /// The handler's retries were spent and no shared dead-letter
    /// destination took it (none configured, or its write failed).
    GaveUp {
        /// Handler calls made.
        attempts: u32,
        /// The last call's error, and the destination's if it failed.
        error: String,
    },
}

impl UnhandledReason {
    /// Every reason's label, in the order the variants are declared.
    pub const LABELS: [&'static str; 5] = [
        "past_deadline",
        "demoted",
        "lease_lost",
        "queue_full",
        "gave_up",
    ];

    /// Its label in `guard_endpoint_dropped_total{reason}`.
    pub fn name(&self) -> &'static str {
        match self {
            UnhandledReason::PastDeadline => "past_deadline",
            UnhandledReason::Demoted => "demoted",
            UnhandledReason::LeaseLost { .. } => "lease_lost",
            UnhandledReason::QueueFull => "queue_full",
            UnhandledReason::GaveUp { .. } => "gave_up",
        }
    }

    /// Handler calls made for the message.
    pub fn attempts(&self) -> u32 {
        match self {
            UnhandledReason::LeaseLost { attempts, .. }
            | UnhandledReason::GaveUp { attempts, .. } => *attempts,
            _ => 0,
        }
    }
}

impl fmt::Display for UnhandledReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnhandledReason::PastDeadline => f.write_str("the lease was past its renew deadline"),
            UnhandledReason::Demoted => f.write_str("leadership had ended"),
            UnhandledReason::LeaseLost { attempts, error } => write!(
                f,
                "the lease ended while it was handled ({attempts} attempt(s), last error: {error})"
            ),
            UnhandledReason::QueueFull => f.write_str("the handler queue was full"),
            UnhandledReason::GaveUp { attempts, error } => write!(
                f,
                "given up after {attempts} attempt(s) with no dead-letter destination: {error}"
            ),
        }
    }
}

/// A message an elected endpoint read and did not handle: its content,
/// where it came from, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unhandled {
    /// Where it came from: the channel, topic, subject or routing key.
    pub origin: String,
    /// Its payload, whole.
    pub payload: Vec<u8>,
    /// The fence of the lease it was read under, if it was read under one.
    pub fence: Option<u64>,
    /// Why it was not handled.
    pub reason: UnhandledReason,
}

/// The function an [`UnhandledSink`] hands messages to.
pub type UnhandledFn = Arc<dyn Fn(Unhandled) + Send + Sync>;

/// Where an elected endpoint hands what it read and did not handle.
///
/// Every message handed here is counted in
/// `guard_endpoint_dropped_total{key, reason}` and logged (the first of a
/// burst, then one line per interval with the count held back), then
/// given to the function set with the endpoint's `with_unhandled`, if
/// any: the gateway keeps them in its dead letters.
#[derive(Clone)]
pub struct UnhandledSink {
    key: Arc<str>,
    what: Arc<str>,
    to: Option<UnhandledFn>,
    throttle: Arc<Throttle>,
}

impl fmt::Debug for UnhandledSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnhandledSink")
            .field("key", &self.key)
            .field("to", &self.to.is_some())
            .finish()
    }
}

impl UnhandledSink {
    /// A sink for the endpoint `what` under lease `key`, handing to `to`.
    pub(crate) fn new(what: &str, key: &str, to: Option<UnhandledFn>) -> Self {
        UnhandledSink {
            key: key.into(),
            what: what.into(),
            to,
            throttle: Arc::new(Throttle::new()),
        }
    }

    /// Counts, logs and hands over `message`.
    pub(crate) fn hand(&self, message: Unhandled) {
        metrics::counter!(
            guard_std::metrics::ENDPOINT_DROPPED,
            "key" => self.key.to_string(),
            "reason" => message.reason.name()
        )
        .increment(1);
        if let Some(held) = self.throttle.admit() {
            let whereto = if self.to.is_some() {
                "handed to the endpoint's dead letters"
            } else {
                "the endpoint has no dead letters; lost"
            };
            tracing::warn!(
                "{}: a message from {} not handled: {}; {whereto} ({held} more not logged)",
                self.what,
                message.origin,
                message.reason
            );
        }
        if let Some(to) = &self.to {
            to(message);
        }
    }

    /// Publishes the counter of every reason at zero, for dashboards.
    pub(crate) fn register(&self) {
        for reason in UnhandledReason::LABELS {
            metrics::counter!(
                guard_std::metrics::ENDPOINT_DROPPED,
                "key" => self.key.to_string(),
                "reason" => reason
            )
            .increment(0);
        }
    }
}

/// How an [`InHand`] makes a message's origin, payload and fence.
pub(crate) type Parts<M> = fn(&M) -> (String, Vec<u8>, Option<u64>);

/// A message in the hands of the delivery path: if the serving is
/// dropped before it is settled (a demotion drops the subscription's
/// serving future, between two calls or during one), the message goes to
/// the unhandled sink with [`UnhandledReason::LeaseLost`], never lost
/// silently.
pub(crate) struct InHand<'a, M, C: Fn()> {
    sink: &'a UnhandledSink,
    message: &'a M,
    /// The lease it was read under: the attempts it counted.
    lease: Option<&'a ElectedLease>,
    /// Its origin, payload and fence, made only if it is handed over.
    parts: Parts<M>,
    /// Counts it in the endpoint's stats when it is handed over.
    count: C,
    settled: bool,
}

impl<'a, M, C: Fn()> InHand<'a, M, C> {
    pub(crate) fn new(
        sink: &'a UnhandledSink,
        message: &'a M,
        lease: Option<&'a ElectedLease>,
        parts: Parts<M>,
        count: C,
    ) -> Self {
        if let Some(lease) = lease {
            lease.next_message();
        }
        InHand {
            sink,
            message,
            lease,
            parts,
            count,
            settled: false,
        }
    }

    /// The message has ended where it should: handled, dead-lettered,
    /// or handed over by the caller.
    pub(crate) fn settle(mut self) {
        self.settled = true;
    }
}

impl<M, C: Fn()> Drop for InHand<'_, M, C> {
    fn drop(&mut self) {
        if !self.settled {
            (self.count)();
            let (origin, payload, fence) = (self.parts)(self.message);
            self.sink.hand(Unhandled {
                origin,
                payload,
                // The fence it was read under, whether the message knows it.
                fence: fence.or(self.lease.map(ElectedLease::fence)),
                reason: UnhandledReason::LeaseLost {
                    attempts: self.lease.map_or(0, ElectedLease::attempts),
                    error: "leadership ended while it was in the handler or between its retries"
                        .to_owned(),
                },
            });
        }
    }
}

/// The path's per-message step, for the sources whose handler returns a
/// result (retried): the elected NATS subscriber, RabbitMQ fanout
/// consumer and binlog reader, and an MQTT endpoint run with
/// `try_run`.
mod step {
    use std::fmt;
    use std::future::Future;

    use guard_core::retry::{Classifier, RetryPolicy};
    use guard_std::run::LeaseState;

    use super::{ElectedLease, UnhandledReason};
    use crate::deliver::{self, GaveUp};
    use crate::observe;

    /// How one message's delivery ended.
    #[derive(Debug, PartialEq, Eq)]
    pub(crate) enum Delivered {
        /// The handler took it.
        Handled,
        /// The handler gave it up and the lease, if any, is valid now: the
        /// caller writes its dead letter at once, with no wait between.
        GaveUp(GaveUp),
        /// Not handled, for this reason; not dead-lettered under the lease.
        Unhandled(UnhandledReason),
    }

    /// Delivers `message` to `handler` under `policy`: with a `lease`, the
    /// lease is checked before the first call, before each retry, and once
    /// more when the handler gave up (the dead letter that follows is a side
    /// effect too); a refusal of the lease is counted as refused late
    /// (`guard_active_refused_late_total{key}`) where it found the deadline
    /// past.
    pub(crate) async fn deliver<M, F, Fut, E>(
        policy: RetryPolicy,
        classifier: Classifier<E>,
        label: &str,
        lease: Option<&ElectedLease>,
        message: &M,
        handler: F,
    ) -> Delivered
    where
        M: Clone,
        F: FnMut(M) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        if let Some(lease) = lease {
            lease.next_message();
            match lease.state() {
                LeaseState::Valid(_) => {}
                LeaseState::PastDeadline => {
                    guard_std::metrics::record_refused_late(lease.key());
                    return Delivered::Unhandled(UnhandledReason::PastDeadline);
                }
                LeaseState::NotHeld => return Delivered::Unhandled(UnhandledReason::Demoted),
            }
        }
        let may_call = || lease.is_none_or(ElectedLease::is_valid);
        let handling = deliver::handle_while(policy, classifier, label, message, may_call, handler);
        let fence = lease.map(ElectedLease::fence);
        match observe::handled(label, fence, handling, observe::handled_or_gave_up).await {
            Ok(()) => Delivered::Handled,
            Err(gave_up) if gave_up.interrupted || !may_call() => {
                Delivered::Unhandled(UnhandledReason::LeaseLost {
                    attempts: gave_up
                        .attempts
                        .max(lease.map_or(0, ElectedLease::attempts)),
                    error: gave_up.error,
                })
            }
            Err(gave_up) => Delivered::GaveUp(gave_up),
        }
    }
}

pub(crate) use step::{Delivered, deliver};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_have_the_labels_the_counter_is_registered_with() {
        let sink = UnhandledSink::new("test", "k", None);
        sink.register();
        let reasons = [
            UnhandledReason::PastDeadline,
            UnhandledReason::Demoted,
            UnhandledReason::LeaseLost {
                attempts: 1,
                error: String::new(),
            },
            UnhandledReason::QueueFull,
            UnhandledReason::GaveUp {
                attempts: 1,
                error: String::new(),
            },
        ];
        let names: Vec<_> = reasons.iter().map(UnhandledReason::name).collect();
        assert_eq!(names, UnhandledReason::LABELS);
    }

    #[test]
    fn a_sink_hands_every_message_to_its_function() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let to = seen.clone();
        let sink = UnhandledSink::new(
            "test",
            "k",
            Some(Arc::new(move |m: Unhandled| to.lock().unwrap().push(m))),
        );
        for n in 0..3_u8 {
            sink.hand(Unhandled {
                origin: "orders".into(),
                payload: vec![n],
                fence: Some(7),
                reason: UnhandledReason::Demoted,
            });
        }
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3, "none held back by the log throttle");
        assert_eq!(seen[2].payload, [2]);
    }

    #[test]
    fn a_message_cut_short_is_handed_over_with_the_attempts_it_made_and_its_fence() {
        use guard_std::{GuardConfig, LocalLocker, SharedLocker};
        let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
        let runner =
            crate::runtime::ActiveRunner::new(&config, &config.scope("test").unwrap()).unwrap();
        let lease = ElectedLease::new(runner.lease_check(), 7, "k");
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let to = seen.clone();
        let sink = UnhandledSink::new(
            "test",
            "k",
            Some(Arc::new(move |m: Unhandled| to.lock().unwrap().push(m))),
        );
        let parts: Parts<()> = |_| ("orders".into(), vec![1], None);
        lease.attempted(); // the message before, settled
        let in_hand = InHand::new(&sink, &(), Some(&lease), parts, || {});
        // The handler's sink sends eight times, then the lease ends and
        // the serving is dropped with the message in hand.
        let clone = lease.clone();
        for _ in 0..8 {
            clone.attempted();
        }
        drop(in_hand);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].fence, Some(7), "the fence it was read under");
        assert!(
            matches!(
                seen[0].reason,
                UnhandledReason::LeaseLost { attempts: 8, .. }
            ),
            "{:?}",
            seen[0].reason
        );
        assert!(seen[0].reason.to_string().contains("8 attempt(s)"));
    }

    #[test]
    fn without_a_lease_a_failing_handler_is_given_up_for_its_dead_letter() {
        use guard_core::retry::{Classifier, RetryPolicy};
        let policy = RetryPolicy::fixed_delay(1, std::time::Duration::from_millis(1));
        let delivered = futures_lite::future::block_on(deliver(
            policy,
            Classifier::retry_all(),
            "test",
            None,
            &(),
            |()| async { Err("down") },
        ));
        match delivered {
            Delivered::GaveUp(gave_up) => assert_eq!(gave_up.attempts, 2),
            other => panic!("{other:?}"),
        }
    }
}

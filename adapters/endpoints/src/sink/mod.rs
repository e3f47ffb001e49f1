//! Sinks: where a message a source received goes next (an HTTP endpoint,
//! a broker, a stream), and the rule every sink follows.
//!
//! A sink takes one [`Outgoing`] message: its payload, a stable id (the
//! same for every attempt, so a receiver can drop a repeat), the fence it
//! was read under if elected, and its origin. It answers with one of
//! three outcomes:
//!
//! - `Ok(())`: the receiver has it (an HTTP 2xx, a PUBACK, an `XADD` id);
//! - [`SinkError::Transient`]: not this time, perhaps with the wait the
//!   receiver asked for (`Retry-After`); sending again later may succeed;
//! - [`SinkError::Permanent`]: never (a request the receiver refuses for
//!   what it is): dead-letter it now, with the reason;
//! - [`SinkError::StaleFence`]: a fenced sink refused a write under a
//!   fence lower than one it has accepted: the sender is a stale leader.
//!
//! [`deliver`] sends a message through a sink with guard-core's
//! [`RetryPolicy`]: transient failures are retried after the policy's
//! delay or the receiver's, whichever is longer; the others end it at
//! once.

#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "nats")]
pub mod jetstream;
pub mod mqtt;
pub mod queued;
pub mod redis_stream;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use guard_core::retry::{Backoff, RandomSource, RetryPolicy};
use guard_std::BoxFuture;
use guard_std::metrics::SINK_SEND_SECONDS;
use guard_std::observe::timed;
use tracing::field::Empty;

use crate::delivery::ElectedLease;

/// The lease a message was read under, as [`deliver`] checks it before
/// each attempt: [`ElectedLease`] is one; a test can make its own.
pub trait LeaseGate: Sync {
    /// The lease's fence.
    fn fence(&self) -> u64;
    /// Whether an effect may be made under it now.
    fn is_valid(&self) -> bool;
    /// One attempt at the effect was made (a send), for the count a dead
    /// letter of the message shows should the lease end; nothing unless
    /// the lease counts them.
    fn attempted(&self) {}
}

impl LeaseGate for ElectedLease {
    fn fence(&self) -> u64 {
        ElectedLease::fence(self)
    }
    fn is_valid(&self) -> bool {
        ElectedLease::is_valid(self)
    }
    fn attempted(&self) {
        ElectedLease::attempted(self);
    }
}
use guard_std::run::{CallerRuntime, Runtime as _};

/// One message on its way out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outgoing<'a> {
    /// A stable id: the same on every attempt and after a restart (a
    /// stream entry's id with its stream, a queue's message id). Sent as
    /// the idempotency key where the sink has one.
    pub id: &'a str,
    /// Where it came from (a channel, topic, subject or stream).
    pub origin: &'a str,
    /// The fence of the lease it was read under, if elected.
    pub fence: Option<u64>,
    /// The payload.
    pub payload: &'a [u8],
}

/// Why a sink did not take a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SinkError {
    /// Not this time: the receiver is down, busy or slow. Sending the
    /// same message again later may succeed.
    Transient {
        /// What happened.
        reason: String,
        /// How long the receiver asked to wait (`Retry-After`).
        retry_after: Option<Duration>,
    },
    /// Never: the receiver refuses the message for what it is (an HTTP
    /// 4xx other than 408 and 429). Dead-letter it.
    Permanent {
        /// What happened, with what the receiver said.
        reason: String,
    },
    /// A fenced sink refused a write under a fence lower than one it has
    /// accepted: the sender is no longer the leader it was.
    StaleFence {
        /// The fence the message carried.
        fence: u64,
        /// The highest fence the sink has accepted.
        highest: u64,
    },
    /// Nothing was sent: the sink has no room now and waited a while for
    /// some (a full queue holding its sender back). [`deliver`] asks
    /// again at once, the lease checked first, and counts it as no
    /// attempt, so holding back lasts as long as it must; race a delivery
    /// to such a sink with a stop.
    HeldBack {
        /// Why.
        reason: String,
    },
    /// Made by [`deliver`], never by a sink: the lease the message was
    /// read under ended before an attempt, so nothing more was sent
    /// under it.
    LeaseEnded {
        /// The fence of that lease.
        fence: u64,
    },
}

impl SinkError {
    /// Whether sending again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SinkError::Transient { .. })
    }

    /// A short name for counters and dead letters: `transient`,
    /// `permanent`, `stale_fence`, `lease_ended`.
    pub fn kind(&self) -> &'static str {
        match self {
            SinkError::Transient { .. } => "transient",
            SinkError::Permanent { .. } => "permanent",
            SinkError::StaleFence { .. } => "stale_fence",
            SinkError::HeldBack { .. } => "held_back",
            SinkError::LeaseEnded { .. } => "lease_ended",
        }
    }
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkError::Transient {
                reason,
                retry_after: None,
            } => write!(f, "not delivered, may be retried: {reason}"),
            SinkError::Transient {
                reason,
                retry_after: Some(wait),
            } => write!(
                f,
                "not delivered, may be retried after {wait:?} as asked: {reason}"
            ),
            SinkError::Permanent { reason } => write!(f, "refused for good: {reason}"),
            SinkError::HeldBack { reason } => write!(f, "held back, nothing sent: {reason}"),
            SinkError::StaleFence { fence, highest } => write!(
                f,
                "refused: fence {fence} is below the {highest} the sink has accepted (a stale leader)"
            ),
            SinkError::LeaseEnded { fence } => write!(
                f,
                "not sent: the lease it was read under (fence {fence}) ended before the attempt"
            ),
        }
    }
}

impl std::error::Error for SinkError {}

/// Somewhere messages go.
pub trait MessageSink: Send + Sync {
    /// Sends `message` once (a sink may reconnect within the call, never
    /// send it twice on its own).
    fn send<'a>(&'a self, message: &'a Outgoing<'a>) -> BoxFuture<'a, Result<(), SinkError>>;
}

/// A sink with a name: each send is a span `send` at debug (`sink`, the
/// message's `id` and `fence`, `outcome`: `ok` or the error's
/// [`kind`](SinkError::kind)) and is timed in
/// `guard_sink_send_seconds{sink, outcome}` ([`guard_std::observe`]).
///
/// ```
/// use std::sync::Arc;
/// use guard_endpoints::sink::{MessageSink, NamedSink, Outgoing, SinkError};
/// use guard_std::BoxFuture;
///
/// struct Accepts;
/// impl MessageSink for Accepts {
///     fn send<'a>(&'a self, _: &'a Outgoing<'a>) -> BoxFuture<'a, Result<(), SinkError>> {
///         Box::pin(async { Ok(()) })
///     }
/// }
///
/// let sink = NamedSink::new("archive", Arc::new(Accepts));
/// let message = Outgoing { id: "m-1", origin: "sensors", fence: None, payload: b"21.5" };
/// assert_eq!(futures_lite::future::block_on(sink.send(&message)), Ok(()));
/// ```
pub struct NamedSink {
    name: String,
    inner: Arc<dyn MessageSink>,
}

impl NamedSink {
    /// Names `inner`.
    pub fn new(name: impl Into<String>, inner: Arc<dyn MessageSink>) -> Self {
        NamedSink {
            name: name.into(),
            inner,
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for NamedSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedSink")
            .field("name", &self.name)
            .finish()
    }
}

impl MessageSink for NamedSink {
    fn send<'a>(&'a self, message: &'a Outgoing<'a>) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let span = tracing::debug_span!(
                "send",
                sink = %self.name,
                id = message.id,
                fence = message.fence,
                outcome = Empty
            );
            let (sent, seconds) = timed(&span, self.inner.send(message)).await;
            let outcome = match &sent {
                Ok(()) => "ok",
                Err(e) => e.kind(),
            };
            span.record("outcome", outcome);
            metrics::histogram!(SINK_SEND_SECONDS, "sink" => self.name.clone(), "outcome" => outcome)
                .record(seconds);
            sent
        })
    }
}

/// How [`deliver`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Calls of [`MessageSink::send`] made.
    pub attempts: u32,
    /// `Ok` once the sink took it; the last error otherwise.
    pub outcome: Result<(), SinkError>,
}

/// Sends `message` through `sink`, retrying transient failures as
/// `policy` says, each after the policy's delay or the wait the receiver
/// asked for, whichever is longer. A permanent refusal or a stale fence
/// ends it at once, as does a transient failure once the policy's calls
/// are spent.
///
/// With the `lease` an elected source read the message under, every
/// attempt is made only while that lease is valid, checked immediately
/// before it (a retry can wait past the lease's end): once it has ended
/// the delivery stops with [`SinkError::LeaseEnded`], nothing more sent.
/// A sink that answers [`SinkError::HeldBack`] is asked again at once,
/// the lease checked first, and that is not counted as an attempt.
///
/// `random` gives the jitter's random bits ([`WithoutRandom`] for a
/// policy without jitter).
///
/// [`WithoutRandom`]: guard_core::retry::WithoutRandom
pub async fn deliver(
    sink: &dyn MessageSink,
    message: &Outgoing<'_>,
    policy: &RetryPolicy,
    random: &mut impl RandomSource,
    lease: Option<&dyn LeaseGate>,
) -> Delivery {
    let mut backoff = Backoff::new(*policy);
    let mut attempts = 0u32;
    loop {
        if let Some(lease) = lease.filter(|lease| !lease.is_valid()) {
            let outcome = Err(SinkError::LeaseEnded {
                fence: lease.fence(),
            });
            return Delivery { attempts, outcome };
        }
        let outcome = sink.send(message).await;
        if matches!(outcome, Err(SinkError::HeldBack { .. })) {
            // No attempt: nothing was sent, and the sink has waited.
            continue;
        }
        attempts = attempts.saturating_add(1);
        if let Some(lease) = lease {
            lease.attempted();
        }
        let retry_after = match &outcome {
            Err(SinkError::Transient { retry_after, .. }) => *retry_after,
            _ => return Delivery { attempts, outcome },
        };
        let Some(delay) = backoff.next_delay(random) else {
            return Delivery { attempts, outcome };
        };
        CallerRuntime
            .sleep(delay.max(retry_after.unwrap_or_default()))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// Busy once, then takes everything.
    struct BusyOnce(AtomicU32);

    impl MessageSink for BusyOnce {
        fn send<'a>(&'a self, _: &'a Outgoing<'a>) -> BoxFuture<'a, Result<(), SinkError>> {
            let first = self.0.fetch_add(1, Ordering::SeqCst) == 0;
            Box::pin(async move {
                if first {
                    Err(SinkError::Transient {
                        reason: "busy".to_owned(),
                        retry_after: None,
                    })
                } else {
                    Ok(())
                }
            })
        }
    }

    /// A lease that counts attempts, valid throughout.
    #[derive(Default)]
    struct Counting(AtomicU32);

    impl LeaseGate for Counting {
        fn fence(&self) -> u64 {
            7
        }
        fn is_valid(&self) -> bool {
            true
        }
        fn attempted(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn each_attempt_is_counted_on_the_lease_as_it_is_made() {
        let lease = Counting::default();
        let message = Outgoing {
            id: "orders:1-0",
            origin: "orders",
            fence: Some(7),
            payload: b"{}",
        };
        let policy = RetryPolicy::fixed_delay(2, Duration::from_millis(1));
        let delivery = futures_lite::future::block_on(deliver(
            &BusyOnce(AtomicU32::new(0)),
            &message,
            &policy,
            &mut guard_core::retry::WithoutRandom,
            Some(&lease),
        ));
        assert_eq!(delivery.attempts, 2);
        assert_eq!(lease.0.load(Ordering::SeqCst), 2);
    }

    /// Each send of a named sink is a span with the sink's name, the
    /// message's id and fence, and the send's outcome.
    #[test]
    fn each_send_of_a_named_sink_is_a_span_with_its_outcome() {
        let sink = NamedSink::new("uplink", Arc::new(BusyOnce(AtomicU32::new(0))));
        let message = Outgoing {
            id: "orders:1-0",
            origin: "orders",
            fence: Some(7),
            payload: b"{}",
        };
        let policy = RetryPolicy::fixed_delay(2, Duration::from_millis(1));
        let log = guard_testkit::SpanLog::new();
        let delivery = tracing::subscriber::with_default(log.subscriber(), || {
            futures_lite::future::block_on(deliver(
                &sink,
                &message,
                &policy,
                &mut guard_core::retry::WithoutRandom,
                None,
            ))
        });
        assert_eq!((delivery.attempts, delivery.outcome), (2, Ok(())));
        let sent = log.closed("send");
        let outcomes: Vec<_> = sent.iter().map(|s| s.field("outcome")).collect();
        assert_eq!(outcomes, [Some("transient"), Some("ok")]);
        for span in &sent {
            assert_eq!(span.field("sink"), Some("uplink"));
            assert_eq!(span.field("id"), Some("orders:1-0"));
            assert_eq!(span.field("fence"), Some("7"));
        }
    }
}

//! An endpoint's way out: a message that passed the inbox goes to the
//! endpoint's sink (`to`), if it has one, before it counts as handled.
//!
//! - Each message carries an id the sink sends as its idempotency key:
//!   `<endpoint>:<where it is kept>` where the source keeps the message
//!   and may hand it over again (a stream entry's id, a JetStream
//!   sequence, a PostgreSQL row, a binlog position), so a redelivery
//!   after a crash carries the key of the first delivery;
//!   `<endpoint>:<this process's start>:<n>` otherwise (Pub/Sub, MQTT,
//!   core NATS, RabbitMQ), the same on every attempt of one delivery.
//! - Each attempt is made only while the lease the message was read
//!   under is valid ([`deliver`]).
//! - What the sink does not take is never dropped here: a source that
//!   retries gets it back as a refusal (transient: retried; permanent or
//!   a stale fence: dead-lettered at once by the source); a broadcast
//!   message goes to the endpoint's dead letters with the sink's answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use guard_core::retry::{RetryPolicy, WithoutRandom};
use guard_endpoints::delivery::ElectedLease;
use guard_endpoints::redis::StreamMessage;
use guard_endpoints::sink::{LeaseGate, MessageSink, Outgoing, SinkError, deliver};

use guard_smol::Control;

use super::{Emit, Inbox, Refused};

/// An endpoint's sink, with its retry policy.
pub(super) struct Forward {
    /// The sink's name, in reasons.
    pub sink_name: String,
    pub sink: Arc<dyn MessageSink>,
    pub retry: RetryPolicy,
    /// This process's start, in ids of messages the source keeps nowhere.
    started: u64,
    /// Messages numbered for such ids.
    sequence: AtomicU64,
    /// The replica's stop: a delivery still retrying (or waiting for room
    /// in a full queue) ends at once, the message not forwarded.
    stop: Control,
}

impl Forward {
    pub(super) fn new(
        sink_name: &str,
        sink: Arc<dyn MessageSink>,
        retry: RetryPolicy,
        stop: Control,
    ) -> Self {
        Forward {
            sink_name: sink_name.to_owned(),
            sink,
            retry,
            stop,
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            sequence: AtomicU64::new(0),
        }
    }
}

/// What the sink did not take, after the calls made.
#[derive(Debug)]
pub(super) struct NotForwarded {
    pub sink: String,
    pub attempts: u32,
    pub error: SinkError,
}

impl std::fmt::Display for NotForwarded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sink {} after {} attempt(s): {}",
            self.sink, self.attempts, self.error
        )
    }
}

impl From<NotForwarded> for Refused {
    /// A transient failure is retried by the source; a permanent refusal
    /// or a stale fence can never pass; a lease that ended is the lease's.
    fn from(not: NotForwarded) -> Refused {
        match &not.error {
            SinkError::Transient { .. } | SinkError::HeldBack { .. } => {
                Refused::SinkFailed(not.to_string())
            }
            SinkError::Permanent { .. } | SinkError::StaleFence { .. } => {
                Refused::Invalid(not.to_string())
            }
            SinkError::LeaseEnded { .. } => Refused::LeaseLost,
        }
    }
}

/// The payload a stream entry sends: its `payload` field when it has
/// one, else its fields as one JSON object of strings.
pub(super) fn entry_payload(message: &StreamMessage) -> Vec<u8> {
    if let Some(payload) = message.field("payload") {
        return payload.to_vec();
    }
    let fields: serde_json::Map<String, serde_json::Value> = message
        .fields
        .iter()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned().into()))
        .collect();
    serde_json::Value::Object(fields).to_string().into_bytes()
}

impl Inbox {
    /// Sends a message that passed on to the endpoint's sink, if it has
    /// one (`Ok` at once if not). `kept` is where the source keeps it, for
    /// a stable id (`None`: numbered in this process).
    pub(super) async fn forward(
        &self,
        kept: Option<&str>,
        from: &str,
        payload: &[u8],
        lease: Option<&ElectedLease>,
    ) -> Result<(), NotForwarded> {
        let Some(forward) = &self.forward else {
            return Ok(());
        };
        let id = match kept {
            Some(kept) => format!("{}:{kept}", self.name),
            None => format!(
                "{}:{}:{}",
                self.name,
                forward.started,
                forward.sequence.fetch_add(1, Ordering::Relaxed)
            ),
        };
        let message = Outgoing {
            id: &id,
            origin: from,
            fence: lease.map(ElectedLease::fence),
            payload,
        };
        let delivering = async {
            Some(
                deliver(
                    &*forward.sink,
                    &message,
                    &forward.retry,
                    &mut WithoutRandom,
                    lease.map(|l| l as &dyn LeaseGate),
                )
                .await,
            )
        };
        let stopped = async {
            forward.stop.stopped().await;
            None
        };
        let Some(delivery) = futures_lite::future::or(delivering, stopped).await else {
            return Err(NotForwarded {
                sink: forward.sink_name.clone(),
                attempts: 0,
                error: SinkError::Transient {
                    reason: "the replica stopped before the sink took it".to_owned(),
                    retry_after: None,
                },
            });
        };
        delivery.outcome.map_err(|error| NotForwarded {
            sink: forward.sink_name.clone(),
            attempts: delivery.attempts,
            error,
        })
    }

    /// [`forward`](Self::forward) for a broadcast message, which no
    /// source keeps: what the sink does not take goes to the endpoint's
    /// dead letters (a full queue counts it dropped, loudly); true when
    /// the sink took it.
    pub(super) async fn forward_or_keep(
        &self,
        from: &str,
        payload: &[u8],
        lease: Option<&ElectedLease>,
        emit: &Emit,
    ) -> bool {
        let Err(not) = self.forward(None, from, payload, lease).await else {
            return true;
        };
        match &not.error {
            SinkError::LeaseEnded { .. } => {
                self.lease_lost(from, payload, lease, not.attempts, not.to_string(), emit);
            }
            _ => {
                let letter = super::Letter {
                    from,
                    payload,
                    why: not.to_string(),
                    attempts: not.attempts,
                    fence: lease.map(ElectedLease::fence),
                };
                if !self.keep(letter, emit) {
                    self.dropped(from, &format!("{not}; the dead-letter queue is full"));
                }
            }
        }
        false
    }
}

//! A sink that publishes each message to a JetStream subject and waits
//! for the stream's acknowledgement, with `Nats-Msg-Id` set to the
//! message's id: the server stores a message once within the stream's
//! duplicate window (two minutes by default), so a retry after a lost
//! acknowledgement, or a redelivery, is not stored twice.
//!
//! The origin and the fence travel as headers (`Guard-Origin`,
//! `Guard-Fence`). A JetStream stream has no notion of fences: this sink
//! never refuses a stale leader by itself (its messages carry the fence
//! for a consumer that does).
//!
//! The client connects at the first message and reconnects by itself;
//! a publish that gets no acknowledgement within the timeout, a server
//! that cannot be reached and "no stream listens on the subject" are
//! transient (a stream may be created); a message over the server's
//! maximum payload is permanent.

use std::time::Duration;

use async_lock::Mutex;
use futures_lite::future;
use guard_std::BoxFuture;
use guard_std::run::{CallerRuntime, Runtime as _};

use super::{MessageSink, Outgoing, SinkError};
use crate::link::Link;
use crate::nats::connection::{connect, on_tokio};
use crate::nats::{NatsError, NatsOptions, checked_subject};
use crate::{InvalidInput, Parameter};

/// How long a publish waits for the stream's acknowledgement unless set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The header carrying where a message came from.
pub const ORIGIN_HEADER: &str = "Guard-Origin";
/// The header carrying the fence a message was read under.
pub const FENCE_HEADER: &str = "Guard-Fence";

/// Publishes each message to one JetStream subject, acknowledged.
///
/// ```no_run
/// # smol::block_on(async {
/// use guard_endpoints::nats::NatsOptions;
/// use guard_endpoints::sink::jetstream::JetStreamSink;
/// use guard_endpoints::sink::{MessageSink, Outgoing};
///
/// let sink = JetStreamSink::new(NatsOptions::new("nats://127.0.0.1:4222")?, "uplink.alerts")?;
/// let message = Outgoing { id: "alerts:1", origin: "alerts.fire", fence: Some(7), payload: b"{}" };
/// sink.send(&message).await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct JetStreamSink {
    options: NatsOptions,
    subject: String,
    timeout: Duration,
    context: Mutex<Option<async_nats::jetstream::Context>>,
    link: Link,
}

impl std::fmt::Debug for JetStreamSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamSink")
            .field("options", &self.options)
            .field("subject", &self.subject)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl JetStreamSink {
    /// A sink publishing to `subject` (no wildcards) on the server of
    /// `options`.
    pub fn new(options: NatsOptions, subject: &str) -> Result<Self, NatsError> {
        let subject = checked_subject(Parameter::Subject, subject, false)?;
        Ok(JetStreamSink {
            link: Link::new(&format!("sink {subject}")),
            options,
            subject,
            timeout: DEFAULT_TIMEOUT,
            context: Mutex::new(None),
        })
    }

    /// Each publish, connecting included, ends within `timeout` (at
    /// least a millisecond).
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Self, InvalidInput> {
        if timeout < Duration::from_millis(1) {
            return Err(InvalidInput::new(
                Parameter::RequestTimeout,
                format!("{timeout:?}"),
                "at least 1 ms",
            ));
        }
        self.timeout = timeout;
        Ok(self)
    }

    /// The subject messages are published to.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    async fn publish(&self, message: &Outgoing<'_>) -> Result<(), SinkError> {
        let transient = |reason: String| SinkError::Transient {
            reason,
            retry_after: None,
        };
        let context = {
            let mut kept = self.context.lock().await;
            match &*kept {
                Some(context) => context.clone(),
                None => {
                    let client = connect(&self.options, &self.link)
                        .await
                        .map_err(|e| transient(e.to_string()))?;
                    let context = on_tokio(async { async_nats::jetstream::new(client) }).await;
                    *kept = Some(context.clone());
                    context
                }
            }
        };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, message.id);
        headers.insert(ORIGIN_HEADER, message.origin);
        if let Some(fence) = message.fence {
            headers.insert(FENCE_HEADER, fence.to_string().as_str());
        }
        let payload = message.payload.to_vec();
        let subject = self.subject.clone();
        let published = on_tokio(async move {
            let ack = context
                .publish_with_headers(subject, headers, payload.into())
                .await?;
            ack.await.map(drop)
        });
        let timed_out = async {
            CallerRuntime.sleep(self.timeout).await;
            Err(transient(format!(
                "no acknowledgement from {} within {:?}",
                self.options.server(),
                self.timeout
            )))
        };
        future::or(
            async {
                published.await.map_err(|e| {
                    let reason = format!("publish to {}: {e}", self.subject);
                    if reason.contains("maximum payload") {
                        SinkError::Permanent { reason }
                    } else {
                        transient(reason)
                    }
                })
            },
            timed_out,
        )
        .await
    }
}

impl MessageSink for JetStreamSink {
    fn send<'a>(&'a self, message: &'a Outgoing<'a>) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(self.publish(message))
    }
}

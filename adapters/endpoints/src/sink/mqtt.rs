//! A sink that publishes each message to an MQTT broker (a bridge to a
//! cloud broker): MQTT 5, QoS 1, done at the broker's PUBACK.
//!
//! - The message's id travels as the user property `Idempotency-Key`,
//!   its origin as `Guard-Origin` and its fence, if any, as
//!   `Guard-Fence` (MQTT 5 user properties: a subscriber reads them; MQTT
//!   3.1.1 has nowhere to put them).
//! - A PUBACK with a success code (0, or 16: no matching subscribers) is
//!   done; 151 (quota exceeded) and a PUBACK that does not come within
//!   the timeout are transient; any other reason code is permanent, with
//!   the code in the reason.
//! - One connection, one publish at a time: it connects at the first
//!   message, and again after a failure (a reused connection the broker
//!   has closed is replaced once within the same send). A publish whose
//!   PUBACK was lost may reach the broker twice, under the same
//!   `Idempotency-Key`.
//! - The broker is not fenced: a subscriber that must refuse a stale
//!   leader's message compares `Guard-Fence` with the highest it has
//!   seen.

use std::time::Duration;

use async_compat::Compat;
use futures_lite::future;
use guard_std::BoxFuture;
use guard_std::run::{CallerRuntime, Runtime as _};
use rumqttc::Outgoing as Sent;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions as Options};

use super::{MessageSink, Outgoing, SinkError};
use crate::mqtt::MqttOptions;

/// How long a publish waits for its PUBACK unless set: 10 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Requests queued between event-loop polls (one publish at a time).
const REQUEST_CAPACITY: usize = 4;

/// Publishes each message to `topic`; see the [module](self).
pub struct MqttSink {
    options: MqttOptions,
    topic: String,
    timeout: Duration,
    connection: async_lock::Mutex<Option<(AsyncClient, EventLoop)>>,
}

impl MqttSink {
    /// Publishes to `topic` of the broker `options` names (its client id
    /// must be this replica's own).
    pub fn new(options: MqttOptions, topic: &str) -> Result<Self, crate::mqtt::MqttError> {
        if topic.is_empty() || topic.contains(['+', '#', '\0']) {
            return Err(crate::mqtt::MqttError::invalid(
                crate::Parameter::PublishTopic,
                topic,
                "a topic to publish to: not empty, no wildcard (+ or #), no NUL",
            ));
        }
        Ok(MqttSink {
            options,
            topic: topic.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            connection: async_lock::Mutex::new(None),
        })
    }

    /// Waits at most `timeout` (at least 1 ms) for a PUBACK.
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Self, crate::mqtt::MqttError> {
        if timeout.is_zero() {
            return Err(crate::mqtt::MqttError::invalid(
                crate::Parameter::RequestTimeout,
                "0",
                "at least 1 ms",
            ));
        }
        self.timeout = timeout;
        Ok(self)
    }

    /// Connects (CONNACK received) within the options' connect timeout.
    async fn connect(&self) -> Result<(AsyncClient, EventLoop), SinkError> {
        let o = &self.options;
        let mut connect = Options::new(o.client_id(), o.host(), o.port());
        connect.set_keep_alive(o.keep_alive()).set_clean_start(true);
        #[cfg(feature = "tls")]
        if let Some(tls) = o.tls() {
            let config = tls.client_config().map_err(|e| SinkError::Permanent {
                reason: format!("TLS to the broker: {e}"),
            })?;
            connect.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(config),
            ));
        }
        let (client, mut events) = AsyncClient::new(connect, REQUEST_CAPACITY);
        let broker = format!("{}:{}", o.host(), o.port());
        let connected = Compat::new(async {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => return Ok(()),
                    Ok(_) => {}
                    Err(e) => {
                        return Err(SinkError::Transient {
                            reason: format!("MQTT broker {broker}: {e}"),
                            retry_after: None,
                        });
                    }
                }
            }
        });
        let timeout = o.connect_timeout();
        future::or(connected, async {
            CallerRuntime.sleep(timeout).await;
            Err(SinkError::Transient {
                reason: format!("MQTT broker {broker}: no CONNACK within {timeout:?}"),
                retry_after: None,
            })
        })
        .await?;
        Ok((client, events))
    }

    /// Publishes `message` on `connection` and waits for its PUBACK.
    async fn publish(
        &self,
        (client, events): &mut (AsyncClient, EventLoop),
        message: &Outgoing<'_>,
    ) -> Result<(), SinkError> {
        let mut user_properties = vec![
            ("Idempotency-Key".to_owned(), message.id.to_owned()),
            ("Guard-Origin".to_owned(), message.origin.to_owned()),
        ];
        if let Some(fence) = message.fence {
            user_properties.push(("Guard-Fence".to_owned(), fence.to_string()));
        }
        let properties = PublishProperties {
            user_properties,
            ..PublishProperties::default()
        };
        let lost = |what: String| SinkError::Transient {
            reason: format!("MQTT publish to {}: {what}", self.topic),
            retry_after: None,
        };
        let acked = Compat::new(async {
            client
                .publish_with_properties(
                    self.topic.as_str(),
                    QoS::AtLeastOnce,
                    false,
                    message.payload.to_vec(),
                    properties,
                )
                .await
                .map_err(|e| lost(e.to_string()))?;
            let mut ours = None;
            loop {
                match events.poll().await {
                    Ok(Event::Outgoing(Sent::Publish(pkid))) => ours = Some(pkid),
                    Ok(Event::Incoming(Packet::PubAck(ack))) if Some(ack.pkid) == ours => {
                        return Ok(ack.reason);
                    }
                    Ok(_) => {}
                    Err(e) => return Err(lost(e.to_string())),
                }
            }
        });
        let timeout = self.timeout;
        let reason = future::or(acked, async {
            CallerRuntime.sleep(timeout).await;
            Err(lost(format!("no PUBACK within {timeout:?}")))
        })
        .await?;
        match reason {
            PubAckReason::Success | PubAckReason::NoMatchingSubscribers => Ok(()),
            PubAckReason::QuotaExceeded => Err(SinkError::Transient {
                reason: format!(
                    "the broker refused a publish to {}: quota exceeded",
                    self.topic
                ),
                retry_after: None,
            }),
            other => Err(SinkError::Permanent {
                reason: format!("the broker refused a publish to {}: {other:?}", self.topic),
            }),
        }
    }
}

impl MessageSink for MqttSink {
    fn send<'a>(&'a self, message: &'a Outgoing<'a>) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let mut connection = self.connection.lock().await;
            let reused = connection.is_some();
            let mut open = match connection.take() {
                Some(open) => open,
                None => self.connect().await?,
            };
            let mut outcome = self.publish(&mut open, message).await;
            if reused && matches!(outcome, Err(SinkError::Transient { .. })) {
                // The broker may have closed an idle connection: once
                // more on a new one.
                open = self.connect().await?;
                outcome = self.publish(&mut open, message).await;
            }
            if !matches!(outcome, Err(SinkError::Transient { .. })) {
                *connection = Some(open);
            }
            outcome
        })
    }
}

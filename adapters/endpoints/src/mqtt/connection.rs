//! One MQTT connection: connect, subscribe (confirmed by the SUBACK),
//! hand each message to the handler and acknowledge it after.

use guard_std::run::CallerRuntime;
use guard_std::run::Runtime as _;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

use crate::delivery::{ElectedLease, InHand, Unhandled, UnhandledReason, UnhandledSink};
use crate::link::Link;
use crate::observe;
use async_channel::Sender;
use async_compat::Compat;
use futures_lite::future;
use guard_std::run::LeaseState;
use rumqttc::{
    AsyncClient, ClientError, Event, EventLoop, Incoming, Publish, QoS, SubscribeReasonCode,
};

use super::{MqttError, MqttMessage, MqttOptions};

/// Requests queued between event-loop polls.
const REQUEST_CAPACITY: usize = 64;

/// A connected (CONNACK received) connection, not yet subscribed.
pub(crate) struct Connection {
    client: AsyncClient,
    events: EventLoop,
}

/// How a served connection ended.
pub(crate) struct Ended {
    /// Why.
    pub(crate) error: MqttError,
    /// Whether the broker had confirmed the subscription.
    pub(crate) confirmed: bool,
}

impl Connection {
    /// Connects within the options' connect timeout.
    pub(crate) async fn open(options: &MqttOptions) -> Result<Self, MqttError> {
        let mut connect =
            rumqttc::MqttOptions::new(&options.client_id, &options.host, options.port);
        connect
            .set_keep_alive(options.keep_alive)
            .set_clean_session(true)
            // Acknowledged after the handler returns, not on receipt.
            .set_manual_acks(true);
        #[cfg(feature = "tls")]
        if let Some(tls) = &options.tls {
            connect.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(tls.client_config()?),
            ));
        }
        let (client, mut events) = AsyncClient::new(connect, REQUEST_CAPACITY);
        let where_to = format!("{}:{}", options.host, options.port);
        let connected = Compat::new(async {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Incoming::ConnAck(_))) => return Ok(()),
                    Ok(_) => {}
                    Err(e) => {
                        return Err(MqttError::Connect {
                            broker: where_to.clone(),
                            source: Arc::new(e),
                        });
                    }
                }
            }
        });
        future::or(connected, async {
            CallerRuntime.sleep(options.connect_timeout).await;
            Err(MqttError::Timeout(options.connect_timeout))
        })
        .await?;
        Ok(Connection { client, events })
    }

    /// Subscribes to `filter` at QoS 1 and serves until the connection
    /// ends. With a `lease` (an elected subscriber: the lease the
    /// connection was opened under, and where what it does not handle
    /// goes), each message is handled only if the lease is valid
    /// immediately before, and carries it; a message refused past the
    /// renew deadline is not acknowledged (the connection is dropped on
    /// demotion) and is handed to the unhandled sink. `subscribed` hears
    /// the broker's answer to the SUBSCRIBE.
    pub(crate) async fn serve<H, F>(
        self,
        filter: &str,
        lease: Option<(&ElectedLease, &UnhandledSink)>,
        link: &Link,
        handler: &mut H,
        subscribed: Sender<Result<(), MqttError>>,
    ) -> Ended
    where
        H: FnMut(MqttMessage) -> F,
        F: Future<Output = ()>,
    {
        let Connection { client, events } = self;
        // A demotion drops this serving: what the event loop has received
        // then is handed over, never dropped with it.
        let mut served = Served { events, lease };
        let mut confirmed = false;
        let mut refused = 0_u64;
        let error = Compat::new(async {
            if let Err(e) = client.subscribe(filter, QoS::AtLeastOnce).await {
                return MqttError::Subscribe {
                    filter: filter.to_owned(),
                    source: Arc::new(e),
                };
            }
            // Acknowledgements wait here while rumqttc's request channel is
            // full: the event loop drains it only inside `poll`, and hands
            // out the events buffered from one read before it does, so
            // waiting for room would stop the loop (and the broker's
            // window of unacknowledged messages with it). At most the
            // broker's in-flight window waits here.
            let mut unacked: VecDeque<Publish> = VecDeque::new();
            loop {
                while let Some(publish) = unacked.front() {
                    match client.try_ack(publish) {
                        Ok(()) => {
                            unacked.pop_front();
                        }
                        // Full (the event loop, which we own, cannot have
                        // gone): the next poll makes room.
                        Err(ClientError::TryRequest(_)) => break,
                        Err(e) => return MqttError::Acknowledge(Arc::new(e)),
                    }
                }
                match served.events.poll().await {
                    Ok(Event::Incoming(Incoming::SubAck(suback))) => {
                        if suback
                            .return_codes
                            .iter()
                            .all(|c| matches!(c, SubscribeReasonCode::Success(_)))
                        {
                            confirmed = true;
                            link.up();
                            subscribed.try_send(Ok(())).ok();
                        } else {
                            let refused = MqttError::SubscriptionRefused {
                                filter: filter.to_owned(),
                                return_codes: format!("{:?}", suback.return_codes),
                            };
                            subscribed.try_send(Err(refused.clone())).ok();
                            return refused;
                        }
                    }
                    Ok(Event::Incoming(Incoming::Publish(publish))) => {
                        // Checked where the side effect happens: nothing
                        // past the deadline, nothing once leadership ended.
                        let refusal = lease.and_then(|(lease, _)| match lease.state() {
                            LeaseState::Valid(_) => None,
                            LeaseState::PastDeadline => {
                                guard_std::metrics::record_refused_late(lease.key());
                                Some(UnhandledReason::PastDeadline)
                            }
                            LeaseState::NotHeld => Some(UnhandledReason::Demoted),
                        });
                        if let (Some(reason), Some((lease, unhandled))) = (refusal, lease) {
                            refused += 1;
                            if refused == 1 {
                                tracing::warn!(
                                    "MQTT {filter}: lease {} no longer valid ({reason}); refusing messages until demoted",
                                    lease.key()
                                );
                            }
                            unhandled.hand(Unhandled {
                                origin: publish.topic.clone(),
                                payload: publish.payload.to_vec(),
                                fence: Some(lease.fence()),
                                reason,
                            });
                            continue;
                        }
                        // A demotion drops this connection's serving,
                        // maybe during the call: what is in hand then is
                        // handed over, counted.
                        let in_hand = lease.map(|(lease, unhandled)| {
                            InHand::new(
                                unhandled,
                                &publish,
                                Some(lease),
                                |p: &Publish| (p.topic.clone(), p.payload.to_vec(), None),
                                || {},
                            )
                        });
                        let fence = lease.map(|(lease, _)| lease.fence());
                        let handling = handler(MqttMessage {
                            topic: publish.topic.clone(),
                            payload: publish.payload.to_vec(),
                            fence,
                            lease: lease.map(|(lease, _)| lease.clone()),
                        });
                        observe::handled(filter, fence, handling, |()| "handled").await;
                        in_hand.into_iter().for_each(InHand::settle);
                        // Sent by the event loop; queued before the next
                        // poll (in order, after any still waiting).
                        unacked.push_back(publish);
                    }
                    Ok(_) => {}
                    Err(e) => return MqttError::Closed(Some(Arc::new(e))),
                }
            }
        })
        .await;
        Ended { error, confirmed }
    }
}

/// Events drained from a dropped serving at most, so that a broker that
/// keeps sending cannot hold the drop.
const DRAIN_LIMIT: usize = 100_000;

/// The event loop of a connection being served. Dropped with a lease (a
/// demotion drops an elected serving), it hands the messages it has
/// received and not served to the unhandled sink: this replica read them
/// and no other will.
struct Served<'a> {
    events: EventLoop,
    lease: Option<(&'a ElectedLease, &'a UnhandledSink)>,
}

impl Drop for Served<'_> {
    fn drop(&mut self) {
        let Some((lease, unhandled)) = self.lease else {
            return;
        };
        // Never waits: only what has arrived is taken.
        for _ in 0..DRAIN_LIMIT {
            let next = future::block_on(Compat::new(future::poll_once(self.events.poll())));
            match next {
                Some(Ok(Event::Incoming(Incoming::Publish(publish)))) => {
                    unhandled.hand(Unhandled {
                        origin: publish.topic.clone(),
                        payload: publish.payload.to_vec(),
                        fence: Some(lease.fence()),
                        reason: UnhandledReason::Demoted,
                    });
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error;
    use std::net::TcpListener;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_refused_connection_keeps_rumqttc_s_error_as_its_source() {
        // A port that was just free: nothing listens on it.
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let options = MqttOptions::new("127.0.0.1", port, "refused")
            .expect("options")
            .with_connect_timeout(Duration::from_secs(5));
        let Err(err) = future::block_on(Connection::open(&options)) else {
            panic!("connected to a port nobody listens on");
        };
        assert!(
            matches!(&err, MqttError::Connect { broker, .. } if *broker == format!("127.0.0.1:{port}")),
            "{err}"
        );
        let source = err.source().expect("rumqttc's error");
        assert!(
            source.downcast_ref::<rumqttc::ConnectionError>().is_some(),
            "{source:?}"
        );
        let copy = err.clone();
        assert_eq!(copy.to_string(), err.to_string());
    }

    /// TLS is really used: a TLS listener admits a client that trusts its
    /// CA, and refuses a plain client and one that trusts another CA.
    #[cfg(feature = "tls")]
    #[test]
    fn a_tls_listener_admits_only_a_client_that_trusts_its_ca() {
        use guard_testkit::{Mosquitto, TestCerts};

        use crate::mqtt::MqttTls;

        let certs = TestCerts::generate().expect("certificates");
        let broker = Mosquitto::start_tls(&certs).expect("mosquitto with TLS");
        let options = |id: &str| {
            MqttOptions::new("127.0.0.1", broker.port(), id)
                .expect("options")
                .with_connect_timeout(Duration::from_secs(2))
        };
        let trusting = MqttTls::new().with_root_ca(certs.ca_pem()).expect("CA");
        future::block_on(Connection::open(&options("trusting").with_tls(trusting)))
            .map(|_| ())
            .expect("a client that trusts the CA connects");

        let plain = future::block_on(Connection::open(&options("plain")));
        assert!(
            plain.is_err(),
            "a plain client is refused by a TLS listener"
        );

        let other = TestCerts::generate().expect("certificates");
        let wrong = MqttTls::new().with_root_ca(other.ca_pem()).expect("CA");
        let Err(err) = future::block_on(Connection::open(&options("wrong").with_tls(wrong))) else {
            panic!("connected to a broker signed by an unknown CA");
        };
        assert!(
            matches!(err, MqttError::Connect { .. }),
            "refused by the TLS handshake: {err}"
        );
    }
}

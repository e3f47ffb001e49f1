//! Readings published to an MQTT broker at QoS 1, kept in a flash outbox
//! until the broker acknowledges them, and a leader-only topic.
//!
//! - Every period ([`Mqtt::new`]), the replica makes a reading with an id of
//!   its own (`<name>/<boot>/<seq>`: the boot's seed tells runs apart) and
//!   stores it in the outbox (guard-embassy's `FlashQueue`). A full outbox
//!   refuses it, and the refusal is reported ([`Event::OutboxFull`]):
//!   nothing is dropped unseen.
//! - One sender takes the oldest stored reading, publishes it at QoS 1 on
//!   `guard/readings/<name>`, and removes it only once the broker's PUBACK
//!   for it arrives. Sends are limited by guard-core's token bucket
//!   ([`Mqtt::new`]); a failed connection, publish or PUBACK wait
//!   drops the connection and connects again after guard-core's backoff,
//!   and the reading is published again: at least once, so the receiver
//!   deduplicates by the id. A reading the broker refuses for good (a
//!   PUBACK with an error code) is reported with its id
//!   ([`Event::Refused`]) and removed, so it does not hold up the rest.
//! - While this replica leads, each production also publishes
//!   `<name> fence=<fence>` on `guard/leader`, sent only if the election
//!   still holds that fence just before the send (never from the outbox,
//!   so a demoted replica's announcement is not sent later). A demotion
//!   between that check and the broker's PUBACK can still let one through
//!   after it: the fence in it tells a reader which lease it was.

use core::cell::Cell;
use core::fmt;
use core::fmt::Write as _;
use core::num::NonZero;
use core::time::Duration;

use embassy_futures::select::{Either, select};
use embassy_sync::blocking_mutex::raw::NoopRawMutex;
use embassy_sync::mutex::Mutex;
use embassy_sync::signal::Signal;
use embassy_time::{Timer, with_timeout};
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use guard_core::limit::{Decision, Limiter, LimiterError, Rate, TokenBucket};
use guard_core::retry::{Backoff, RetryPolicy, WithoutRandom};
use guard_embassy::flash::{FlashError, FlashQueue};
use guard_embassy::time::{duration_to_embassy, now};
use rust_mqtt::buffer::BumpBuffer;
use rust_mqtt::client::Client;
use rust_mqtt::client::event::Event as MqttEvent;
use rust_mqtt::client::options::{ConnectOptions, PublicationOptions, TopicReference};
use rust_mqtt::config::KeepAlive;
use rust_mqtt::types::{MqttString, TopicName};

use crate::Event;
use crate::link::Link;

/// The longest reading: a name of [`crate::MAX_NAME`] bytes, a boot and a
/// sequence number.
pub const RECORD: usize = 80;

/// The outbox: readings of at most [`RECORD`] bytes on flash.
pub type Outbox<F> = FlashQueue<F, RECORD>;

/// How long a connect or a PUBACK may take before the connection is
/// dropped and made again.
const ANSWER_TIMEOUT: embassy_time::Duration = embassy_time::Duration::from_secs(2);
/// A ping when nothing else was sent for this long (the keep-alive is
/// three times as long).
const IDLE_PING: embassy_time::Duration = embassy_time::Duration::from_secs(5);

/// The MQTT side of a replica's settings, checked when made.
#[derive(Clone, Copy, Debug)]
pub struct Mqtt {
    produce: Duration,
    /// Admits at most `per_second` publications a second.
    bucket: TokenBucket,
}

/// MQTT settings that cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MqttSettingsError {
    /// A reading every 0 ms.
    ZeroProduce,
    /// The rate cannot be a token bucket.
    Rate(LimiterError),
}

impl fmt::Display for MqttSettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MqttSettingsError::ZeroProduce => {
                f.write_str("readings need a period of at least 1 ms")
            }
            MqttSettingsError::Rate(e) => write!(f, "the publication rate: {e}"),
        }
    }
}

impl core::error::Error for MqttSettingsError {}

impl Mqtt {
    /// A reading every `produce`, at most `per_second` publications a
    /// second (a burst of as many).
    pub fn new(produce: Duration, per_second: u32) -> Result<Self, MqttSettingsError> {
        if produce.is_zero() {
            return Err(MqttSettingsError::ZeroProduce);
        }
        let bucket = TokenBucket::new(per_second, Rate::per_second(per_second))
            .map_err(MqttSettingsError::Rate)?;
        Ok(Mqtt { produce, bucket })
    }
}

/// What the producer and the sender share.
pub struct Shared<'a, F: MultiwriteNorFlash> {
    outbox: Mutex<NoopRawMutex, &'a mut Outbox<F>>,
    /// The fence while this replica leads (the election sets it).
    leading: &'a Cell<Option<u64>>,
    /// The fence the producer asks the sender to announce.
    announce: Signal<NoopRawMutex, u64>,
    /// A reading was stored.
    wake: Signal<NoopRawMutex, ()>,
}

impl<'a, F: MultiwriteNorFlash> Shared<'a, F> {
    /// The outbox and the election's fence, shared.
    pub fn new(outbox: &'a mut Outbox<F>, leading: &'a Cell<Option<u64>>) -> Self {
        Shared {
            outbox: Mutex::new(outbox),
            leading,
            announce: Signal::new(),
            wake: Signal::new(),
        }
    }
}

/// Makes a reading every `mqtt.produce` and stores it; while `leading`,
/// asks the sender to announce the fence too. Never returns.
pub async fn produce<F: MultiwriteNorFlash>(
    name: &str,
    boot: u64,
    mqtt: &Mqtt,
    shared: &Shared<'_, F>,
    report: &impl Fn(Event<'_>),
) -> ! {
    let period = duration_to_embassy(mqtt.produce);
    let mut seq = 0u64;
    loop {
        Timer::after(period).await;
        seq += 1;
        let mut reading: heapless::String<RECORD> = heapless::String::new();
        // At most 32 bytes of name (`run` refuses longer), 16 of boot and
        // 20 of sequence number: it fits.
        let _ = write!(reading, "{name}/{boot:x}/{seq}");
        match shared.outbox.lock().await.push(reading.as_bytes()).await {
            Ok(()) => {}
            Err(FlashError::Full) => report(Event::OutboxFull { name, seq }),
            Err(error) => report(Event::OutboxFailed {
                name,
                seq,
                error: &error,
            }),
        }
        if let Some(fence) = shared.leading.get() {
            shared.announce.signal(fence);
        }
        shared.wake.signal(());
    }
}

/// Publishes the outbox's readings and the leader's announcements over
/// `link`, as `client_id`, forever.
pub async fn send<F: MultiwriteNorFlash>(
    name: &str,
    client_id: &str,
    mqtt: &Mqtt,
    link: &mut Link,
    shared: &Shared<'_, F>,
    report: &impl Fn(Event<'_>),
) -> ! {
    let mut limiter = Limiter::new(mqtt.bucket);
    let policy = RetryPolicy::new()
        .with_max_attempts(u32::MAX - 1)
        .with_initial_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(2));
    let mut backoff = Backoff::new(policy);
    loop {
        let failure = connected(name, client_id, link, shared, &mut limiter, report).await;
        report(Event::MqttDown { name, why: failure });
        link.close();
        let wait = backoff.next_delay(&mut WithoutRandom).unwrap_or_else(|| {
            backoff = Backoff::new(policy);
            policy.max_delay()
        });
        Timer::after(duration_to_embassy(wait)).await;
        if failure != Failure::Connect {
            // It was up: the next failure starts the waits afresh.
            backoff = Backoff::new(policy);
        }
    }
}

/// Why a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Connecting (TCP or CONNACK) failed or timed out.
    Connect,
    /// A publish could not be sent.
    Publish,
    /// No PUBACK came in time, or the connection failed while waiting.
    Acknowledge,
    /// A ping failed.
    Ping,
}

/// One connection: connects, then publishes until something fails.
async fn connected<F: MultiwriteNorFlash>(
    name: &str,
    client_id: &str,
    link: &mut Link,
    shared: &Shared<'_, F>,
    limiter: &mut Limiter<TokenBucket>,
    report: &impl Fn(Event<'_>),
) -> Failure {
    // A new buffer for each connection: what the client allocates from it
    // lives no longer than the connection.
    let mut memory = [0u8; 512];
    let mut buffer = BumpBuffer::new(&mut memory);
    let mut client: Client<'_, '_, &mut Link, BumpBuffer<'_>, 0, 1, 1, 0, 4, 0, 0> =
        Client::new(&mut buffer);
    let options = ConnectOptions::new()
        .clean_start()
        .keep_alive(KeepAlive::Seconds(
            NonZero::new(15).unwrap_or(NonZero::<u16>::MIN),
        ));
    let Ok(id) = MqttString::try_from(client_id) else {
        return Failure::Connect;
    };
    match with_timeout(ANSWER_TIMEOUT, client.connect(link, &options, Some(id))).await {
        Ok(Ok(_)) => report(Event::MqttUp { name }),
        _ => return Failure::Connect,
    }
    let mut topic: heapless::String<48> = heapless::String::new();
    let _ = write!(topic, "guard/readings/{name}");
    let (Some(readings), Some(leader)) = (
        MqttString::try_from(topic.as_str())
            .ok()
            .and_then(TopicName::new),
        MqttString::try_from("guard/leader")
            .ok()
            .and_then(TopicName::new),
    ) else {
        return Failure::Publish;
    };
    loop {
        // An announcement first, if this replica still leads; else the
        // oldest reading; else wait for one, pinging when idle.
        let fence = shared
            .announce
            .try_take()
            .filter(|f| shared.leading.get() == Some(*f));
        let mut payload: heapless::Vec<u8, RECORD> = heapless::Vec::new();
        let topic = if let Some(fence) = fence {
            let mut text: heapless::String<RECORD> = heapless::String::new();
            let _ = write!(text, "{name} fence={fence}");
            let _ = payload.extend_from_slice(text.as_bytes());
            &leader
        } else {
            // Copied out, so the producer is not locked out while this
            // waits (for a reading, a ping, or the broker).
            let oldest = match shared.outbox.lock().await.peek().await {
                Ok(Some(reading)) => Ok(payload.extend_from_slice(reading).is_ok()),
                Ok(None) => Ok(false),
                Err(error) => Err(error),
            };
            match oldest {
                Ok(true) => &readings,
                Ok(false) => {
                    if let Either::Second(()) =
                        select(shared.wake.wait(), Timer::after(IDLE_PING)).await
                        && with_timeout(ANSWER_TIMEOUT, client.ping()).await.is_err()
                    {
                        return Failure::Ping;
                    }
                    continue;
                }
                Err(error) => {
                    report(Event::OutboxFailed {
                        name,
                        seq: 0,
                        error: &error,
                    });
                    Timer::after(IDLE_PING).await;
                    continue;
                }
            }
        };
        // The rate: wait until the bucket admits one more.
        while let Decision::Denied { retry_after } = limiter.check(now()) {
            Timer::after(duration_to_embassy(retry_after)).await;
        }
        // The election may have moved on while this waited: an
        // announcement goes only with the fence still held.
        if fence.is_some() && shared.leading.get() != fence {
            continue;
        }
        let options =
            PublicationOptions::new(TopicReference::Name(topic.as_borrowed())).at_least_once();
        let pid = match client.publish(&options, payload.as_slice().into()).await {
            Ok(Some(pid)) => pid,
            _ => return Failure::Publish,
        };
        let acknowledged = with_timeout(ANSWER_TIMEOUT, async {
            loop {
                match client.poll().await {
                    Ok(MqttEvent::PublishAcknowledged(ack)) if ack.packet_identifier == pid => {
                        return Ok(true);
                    }
                    Ok(MqttEvent::PublishRejected(rej)) if rej.packet_identifier == pid => {
                        return Ok(false);
                    }
                    Ok(_) => {}
                    Err(_) => return Err(Failure::Acknowledge),
                }
            }
        })
        .await;
        match acknowledged {
            Ok(Ok(true)) => {}
            // The broker refused it for good (a PUBACK with an error code,
            // e.g. an ACL on the topic): sending it again would stop the
            // outbox behind it, so it is reported, with its id, and
            // removed.
            Ok(Ok(false)) => {
                report(Event::Refused {
                    name,
                    message: core::str::from_utf8(&payload).unwrap_or("(not UTF-8)"),
                });
                if fence.is_none()
                    && let Err(error) = shared.outbox.lock().await.pop().await
                {
                    report(Event::OutboxFailed {
                        name,
                        seq: 0,
                        error: &error,
                    });
                }
                continue;
            }
            Ok(Err(failure)) => return failure,
            Err(_) => return Failure::Acknowledge,
        }
        if fence.is_some() {
            report(Event::Announced {
                name,
                fence: fence.unwrap_or_default(),
            });
        } else if let Err(error) = shared.outbox.lock().await.pop().await {
            // Published but still stored: it goes again (at least once).
            report(Event::OutboxFailed {
                name,
                seq: 0,
                error: &error,
            });
        }
    }
}

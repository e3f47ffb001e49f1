//! The gateway replica as it runs on an MCU: embassy-net and guard-embassy,
//! no allocator, no OS. Two hosts run it:
//!
//! - the `guard-tap-replica` binary (feature `host`, the default):
//!   embassy-executor's `platform-std` over a Linux TAP device;
//! - the firmware image `net-replica` of `boards/mps2-an386`: a Cortex-M4F
//!   under QEMU with the board's LAN9118 Ethernet controller.
//!
//! Through guard-embassy's `RespLocker` on a TCP connection to Redis,
//! [`run`]
//! - elects one leader among the replicas (`ActiveRunner`); while leading
//!   it writes to a protected resource (a Redis script that refuses a
//!   fence lower than one it accepted, [`resource`]) every
//!   [`Replica::act`];
//! - runs a heartbeat once per slot across the replicas (`run_slots`);
//! - with an MQTT broker, publishes its readings at QoS 1 through a flash
//!   outbox, and while leading announces its fence ([`publish`]).
//!
//! Every event is reported as an [`Event`], whose `Display` is the line
//! the end-to-end test (`tests/netns.rs`) reads, the same from both hosts.

#![no_std]

pub mod clock;
pub mod link;
pub mod publish;
pub mod ram_flash;
pub mod resource;

use core::cell::Cell;
use core::fmt;
use core::time::Duration;

use core::fmt::Write as _;

use embassy_futures::join::{join, join4};
use embassy_net::{IpEndpoint, Stack};
use embassy_sync::blocking_mutex::raw::NoopRawMutex;
use embassy_sync::signal::Signal;
use embassy_time::Timer;
use embedded_storage_async::nor_flash::MultiwriteNorFlash;
use guard_core::guard::{ActiveConfig, ActiveConfigError, DemoteReason, OnceGuard};
use guard_core::lock::{DEFAULT_PREFIX, KeyError, Scope, Ttl, active_key};
use guard_core::slot::{Every, UnixMillis};
use guard_embassy::{
    ActiveControl, ActiveRunner, Credentials, RespError, RespLocker, ServerMessage, run_slots,
};

use crate::link::{Link, LinkBuffers, LinkError};
use crate::resource::Resource;

/// The size of each TCP buffer of the replica's two links (locker and
/// resource): a RESP request or reply of the guard's scripts fits.
pub const LINK_BUFFER: usize = 1024;

/// One replica's settings.
#[derive(Clone, Debug)]
pub struct Replica<'a> {
    /// This replica's name, written to the resource with each fence.
    pub name: &'a str,
    /// Redis.
    pub redis: IpEndpoint,
    /// The leader's lease.
    pub ttl: Ttl,
    /// Renewal and standby poll interval (clamped to ttl / 3).
    pub interval: Duration,
    /// The heartbeat's period (epoch-aligned slots).
    pub every: Every,
    /// How often the leader writes to the resource.
    pub act: Duration,
    /// Seeds the locker's token ids: must differ between replicas and runs.
    pub seed: u64,
    /// Sent as `AUTH` first on each of its connections to Redis (a
    /// `requirepass` password, or an ACL user), when set.
    pub auth: Option<Credentials>,
    /// The MQTT broker and what to publish to it, if any.
    pub mqtt: Option<(IpEndpoint, publish::Mqtt)>,
}

/// What a replica did, as one line of text (`Display`).
#[derive(Debug)]
pub enum Event<'a> {
    /// The network is configured.
    Up {
        /// The replica's name.
        name: &'a str,
    },
    /// This replica became the leader with `fence`.
    Promoted {
        /// The replica's name.
        name: &'a str,
        /// The lease's fence.
        fence: u64,
    },
    /// This replica stopped leading.
    Demoted {
        /// The replica's name.
        name: &'a str,
        /// Why.
        reason: DemoteReason,
    },
    /// The leader wrote to the resource.
    Wrote {
        /// The replica's name.
        name: &'a str,
        /// The fence it wrote with.
        fence: u64,
        /// Whether the resource accepted it (false: refused as stale).
        accepted: bool,
    },
    /// A write could not reach the resource (it is tried again).
    WriteFailed {
        /// The replica's name.
        name: &'a str,
        /// What failed.
        error: RespError<LinkError>,
    },
    /// The MQTT connection is up.
    MqttUp {
        /// The replica's name.
        name: &'a str,
    },
    /// The MQTT connection ended (it is made again after a backoff).
    MqttDown {
        /// The replica's name.
        name: &'a str,
        /// Why.
        why: publish::Failure,
    },
    /// The broker took this leader's announcement.
    Announced {
        /// The replica's name.
        name: &'a str,
        /// The fence announced.
        fence: u64,
    },
    /// The broker refused a publication for good (a PUBACK with an error
    /// code); a reading is removed from the outbox.
    Refused {
        /// The replica's name.
        name: &'a str,
        /// The payload: a reading's id, or an announcement.
        message: &'a str,
    },
    /// The outbox was full: reading `seq` was not stored.
    OutboxFull {
        /// The replica's name.
        name: &'a str,
        /// The reading's number.
        seq: u64,
    },
    /// The outbox's flash failed (0: not while storing a reading).
    OutboxFailed {
        /// The replica's name.
        name: &'a str,
        /// The reading's number.
        seq: u64,
        /// What the flash queue said.
        error: &'a dyn fmt::Debug,
    },
    /// This replica ran a heartbeat slot.
    Executed {
        /// The replica's name.
        name: &'a str,
        /// The slot's start, Unix milliseconds.
        slot: u64,
        /// The slot lock's fence, when the locker gave one.
        fence: Option<u64>,
    },
}

impl fmt::Display for Event<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Up { name } => write!(f, "up name={name}"),
            Event::Promoted { name, fence } => write!(f, "promoted name={name} fence={fence}"),
            Event::Demoted { name, reason } => write!(f, "demoted name={name} reason={reason:?}"),
            Event::Wrote {
                name,
                fence,
                accepted,
            } => write!(f, "wrote name={name} fence={fence} accepted={accepted}"),
            Event::WriteFailed { name, error } => {
                write!(f, "write-failed name={name} error={error}")
            }
            Event::MqttUp { name } => write!(f, "mqtt-up name={name}"),
            Event::MqttDown { name, why } => write!(f, "mqtt-down name={name} why={why:?}"),
            Event::Announced { name, fence } => write!(f, "announced name={name} fence={fence}"),
            Event::Refused { name, message } => {
                write!(f, "refused name={name} message={message}")
            }
            Event::OutboxFull { name, seq } => write!(f, "outbox-full name={name} seq={seq}"),
            Event::OutboxFailed { name, seq, error } => {
                write!(f, "outbox-failed name={name} seq={seq} error={error:?}")
            }
            Event::Executed { name, slot, fence } => {
                write!(f, "executed name={name} slot={slot} fence=")?;
                match fence {
                    Some(fence) => write!(f, "{fence}"),
                    None => f.write_str("-"),
                }
            }
        }
    }
}

/// The longest replica name: it goes into keys, topics, readings and the
/// MQTT client id.
pub const MAX_NAME: usize = 32;

/// Why a replica cannot run (its settings, or credentials Redis refuses;
/// the network never ends it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaError {
    /// The name is empty or longer than [`MAX_NAME`] bytes.
    Name,
    /// A key the replica builds is invalid.
    Key(KeyError),
    /// The lease settings are invalid.
    Lease(ActiveConfigError),
    /// Redis refused the credentials, with its reason: nothing else was
    /// sent.
    AuthRefused(ServerMessage),
}

impl fmt::Display for ReplicaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplicaError::Name => write!(f, "a replica's name is 1 to {MAX_NAME} bytes"),
            ReplicaError::Key(e) => write!(f, "key: {e}"),
            ReplicaError::Lease(e) => write!(f, "lease: {e}"),
            ReplicaError::AuthRefused(m) => write!(f, "redis refused the credentials (AUTH): {m}"),
        }
    }
}

impl core::error::Error for ReplicaError {}

impl From<KeyError> for ReplicaError {
    fn from(e: KeyError) -> Self {
        ReplicaError::Key(e)
    }
}

/// Runs the replica on a configured `stack` until its settings fail:
/// leader election, the leader's fenced writes and the heartbeat slots,
/// each event given to `report`. `wall` is the wall clock the slots are
/// aligned to; `buffers` are the locker's and the resource's links'.
pub async fn run<F: MultiwriteNorFlash>(
    stack: Stack<'static>,
    replica: &Replica<'_>,
    buffers: [&'static mut LinkBuffers<LINK_BUFFER>; 3],
    outbox: &mut publish::Outbox<F>,
    wall: impl Fn() -> UnixMillis,
    report: impl Fn(Event<'_>),
) -> Result<(), ReplicaError> {
    let name = replica.name;
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(ReplicaError::Name);
    }
    let settings = ActiveConfig::new()
        .with_ttl(replica.ttl)
        .with_interval(replica.interval);
    let scope = Scope::new("consumer")?.segment("name", "gateway")?;
    let lease_key = active_key(DEFAULT_PREFIX, &scope)?;
    let runner = ActiveRunner::new(&lease_key, settings).map_err(ReplicaError::Lease)?;
    let slot_scope = Scope::new("schedule")?.segment("router", "heartbeat")?;

    let [locker_buffers, resource_buffers, mqtt_buffers] = buffers;
    // A request that failed half-way closes the link, which reconnects on
    // the next request.
    let mut locker: RespLocker<NoopRawMutex, Link, LINK_BUFFER> = RespLocker::new(
        Link::new(stack, replica.redis, locker_buffers),
        replica.seed,
    )
    .with_reset(Link::close);
    if let Some(auth) = &replica.auth {
        locker = locker.with_credentials(auth.clone());
    }
    // Refused credentials end the replica at start, by name, rather than
    // as a standby that never wins; an unreachable Redis does not (the
    // runner keeps asking).
    if let Err(RespError::AuthRefused(reason)) = locker.authenticate().await {
        return Err(ReplicaError::AuthRefused(reason));
    }
    let mut resource = Resource::new(
        Link::new(stack, replica.redis, resource_buffers).with_auth(replica.auth.clone()),
    );
    let leading: Cell<Option<u64>> = Cell::new(None);
    let control: ActiveControl<NoopRawMutex> = ActiveControl::new();
    let never: Signal<NoopRawMutex, ()> = Signal::new();

    let elect = runner.run(
        &locker,
        &control,
        |fence| {
            leading.set(Some(fence));
            report(Event::Promoted { name, fence });
            async { Ok::<(), ()>(()) }
        },
        |reason| {
            leading.set(None);
            report(Event::Demoted { name, reason });
            async {}
        },
    );
    let act = async {
        let period = guard_embassy::time::duration_to_embassy(replica.act);
        loop {
            Timer::after(period).await;
            let Some(fence) = leading.get() else { continue };
            match resource.write(fence, name).await {
                Ok(accepted) => report(Event::Wrote {
                    name,
                    fence,
                    accepted,
                }),
                Err(error) => report(Event::WriteFailed { name, error }),
            }
        }
    };
    let guard = OnceGuard::new(Some(&locker), slot_scope).with_ttl(replica.ttl);
    let slots = run_slots(&guard, replica.every, wall, &never, |run| {
        report(Event::Executed {
            name,
            slot: run.slot.as_millis(),
            fence: run.fence,
        });
        async {}
    });
    let shared = publish::Shared::new(outbox, &leading);
    let publishing = async {
        let Some((broker, mqtt)) = &replica.mqtt else {
            return core::future::pending().await;
        };
        let mut link = Link::new(stack, *broker, mqtt_buffers);
        let mut client_id: heapless::String<48> = heapless::String::new();
        let _ = write!(client_id, "guard-{name}");
        let boot = replica.seed;
        let producing = publish::produce(name, boot, mqtt, &shared, &report);
        let sending = publish::send(name, &client_id, mqtt, &mut link, &shared, &report);
        join(producing, sending).await;
    };
    let (_, (), slots, ()) = join4(elect, act, slots, publishing).await;
    slots.map(drop).map_err(ReplicaError::Key)
}

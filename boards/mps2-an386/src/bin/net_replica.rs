//! `net-replica`: the gateway replica (guard-tap-replica's library) as
//! firmware on a Cortex-M4F under QEMU (`mps2-an386`), with embassy-net
//! on the board's LAN9118 Ethernet controller and a static address.
//!
//! It competes with the server replicas for the same lease through
//! `RespLocker` on Redis, writes to the protected resource with its
//! fence while leading, and runs the heartbeat once per slot with them.
//! Its wall clock is Redis's `TIME` at start plus the board's
//! free-running timer since (the board has no calendar clock).
//!
//! Run with the settings on the semihosting command line, e.g.
//!
//! ```text
//! qemu-system-arm -cpu cortex-m4 -machine mps2-an386 -nographic \
//!   -semihosting-config enable=on,target=native \
//!   -nic tap,ifname=tap3,script=no,downscript=no,mac=02:00:00:00:00:04 \
//!   -kernel net-replica -append "--name fw --ip 10.77.0.20/24 --redis 10.77.0.1:6379"
//! ```
//!
//! (`--redis-user NAME --redis-password PASS`, or the password alone for
//! `requirepass`, sends `AUTH` first on each connection to Redis;
//! refused credentials exit 1 with Redis's reason. `--mqtt a.b.c.d:port`
//! publishes readings at QoS 1 through an outbox on PSRAM that a reset
//! leaves as it was, and the leader's fence; see guard-tap-replica's
//! `publish`.)
//!
//! Every event is one line through semihosting, the same lines as the
//! host binary's; a bad command line or a missing controller exits 1.

#![no_std]
#![no_main]

use core::time::Duration;

use cortex_m_semihosting::hprintln;
#[cfg(feature = "defmt")]
use defmt_semihosting as _;
use embassy_executor::Spawner;
use embassy_net::IpEndpoint;
use embassy_time::Timer;
use guard_core::lock::Ttl;
use guard_core::slot::Every;
use guard_embassy::{Credentials, RespError};
use guard_firmware_mps2::args::MAX_CMDLINE;
use guard_firmware_mps2::network;
use guard_firmware_mps2::psram_flash::{self, PAGE, PsramFlash};
use guard_tap_replica::clock::Wall;
use guard_tap_replica::link::{Link, LinkBuffers};
use guard_tap_replica::publish::{Mqtt, Outbox};
use guard_tap_replica::{Event, LINK_BUFFER, Replica};
use panic_semihosting as _;
use static_cell::StaticCell;

guard_firmware_mps2::ethernet_interrupt!();

static CMDLINE: StaticCell<[u8; MAX_CMDLINE]> = StaticCell::new();
static LINKS: StaticCell<[LinkBuffers<LINK_BUFFER>; 3]> = StaticCell::new();
static OUTBOX: StaticCell<Outbox<PsramFlash>> = StaticCell::new();
/// The outbox: 8 KiB of the board's PSRAM as NOR flash, which a reset
/// leaves as it was.
const OUTBOX_LEN: usize = 8 * PAGE;
/// Marks an outbox erased on a first start ("outb").
const OUTBOX_MAGIC: u32 = 0x6f75_7462;
static CLOCK_LINK: StaticCell<LinkBuffers<256>> = StaticCell::new();

fn fail(what: &str, error: &dyn core::fmt::Display) -> ! {
    network::fail("net-replica", what, error)
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let args = network::boot("net-replica", CMDLINE.init([0; MAX_CMDLINE]));
    let ttl = Ttl::from_millis(args.ttl_ms).unwrap_or_else(|e| fail("--ttl-ms", &e));
    let every =
        Every::new(Duration::from_millis(args.every_ms)).unwrap_or_else(|e| fail("--every-ms", &e));

    if args.tls_ca.is_some() {
        fail(
            "--tls-ca",
            &"net-replica reaches Redis without TLS (tls-locker speaks TLS)",
        );
    }

    // SAFETY: this image owns the board's one LAN9118, and DefaultHandler
    // is in place.
    let (stack, seed, _) = unsafe { network::start(spawner, &args) }
        .await
        .unwrap_or_else(|e| fail("Ethernet", &e));
    hprintln!(
        "{} ip={}/{}",
        Event::Up { name: args.name },
        args.ip,
        args.prefix
    );

    let auth = args.redis_password.map(|password| {
        Credentials::new(args.redis_user, password)
            .unwrap_or_else(|e| fail("--redis-user/--redis-password", &e))
    });
    let redis = IpEndpoint::from(args.redis);
    let mut clock_link =
        Link::new(stack, redis, CLOCK_LINK.init(LinkBuffers::new())).with_auth(auth.clone());
    // Redis may not be up yet: ask again, backing off to 5 s.
    let mut wait_ms = 250;
    let wall = loop {
        match Wall::from_server(&mut clock_link).await {
            Ok(wall) => break wall,
            // Refused credentials are not worth asking again with.
            Err(e @ RespError::AuthRefused(_)) => fail("Redis", &e),
            Err(e) => {
                hprintln!(
                    "clock name={}: Redis TIME from {}: {e}; again in {wait_ms} ms",
                    args.name,
                    args.redis
                );
                Timer::after_millis(wait_ms).await;
                wait_ms = (wait_ms * 2).min(5_000);
            }
        }
    };
    clock_link.close();

    let replica = Replica {
        name: args.name,
        redis,
        ttl,
        interval: Duration::from_millis(args.interval_ms),
        every,
        act: Duration::from_millis(args.act_ms),
        seed,
        auth,
        mqtt: args.mqtt.map(|broker| {
            let mqtt = Mqtt::new(Duration::from_millis(args.produce_ms), args.mqtt_per_second)
                .unwrap_or_else(|e| fail("--produce-ms/--mqtt-per-second", &e));
            (IpEndpoint::from(broker), mqtt)
        }),
    };
    // SAFETY: the first 8 KiB of PSRAM are the outbox's alone.
    let flash = unsafe { PsramFlash::new(0, OUTBOX_LEN) };
    let outbox = OUTBOX
        .init(Outbox::new(flash, 0..OUTBOX_LEN as u32).unwrap_or_else(|e| fail("the outbox", &e)));
    // A first start erases the outbox; a start after a reset keeps it.
    // SAFETY: the word past the outbox is this marker's alone.
    if !unsafe { psram_flash::marked(OUTBOX_LEN, OUTBOX_MAGIC) } {
        if let Err(e) = outbox.erase().await {
            fail("the outbox", &e);
        }
        // SAFETY: as above.
        unsafe { psram_flash::mark(OUTBOX_LEN, OUTBOX_MAGIC) };
    }
    let [locker, resource, mqtt] =
        LINKS.init([LinkBuffers::new(), LinkBuffers::new(), LinkBuffers::new()]);
    let ran = guard_tap_replica::run(
        stack,
        &replica,
        [locker, resource, mqtt],
        outbox,
        || wall.now(),
        |event| hprintln!("{event}"),
    )
    .await;
    if let Err(e) = ran {
        fail("replica", &e);
    }
}

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

use core::hash::{BuildHasher, Hasher};
use core::time::Duration;

use cortex_m::interrupt::InterruptNumber;
use cortex_m::peripheral::NVIC;
use cortex_m_rt::exception;
use cortex_m_semihosting::{debug, hprintln, nr, syscall1};
#[cfg(feature = "defmt")]
use defmt_semihosting as _;
use embassy_executor::Spawner;
use embassy_net::{IpEndpoint, Ipv4Cidr, StackResources, StaticConfigV4};
use embassy_time::Timer;
use guard_core::lock::Ttl;
use guard_core::slot::Every;
use guard_embassy::{Credentials, RespError};
use guard_firmware_mps2::args::{Args, MAX_CMDLINE, cmdline};
use guard_firmware_mps2::lan9118::{Lan9118, MPS2_BASE, MPS2_IRQ};
use guard_firmware_mps2::psram_flash::{self, PAGE, PsramFlash};
use guard_firmware_mps2::time_driver;
use guard_tap_replica::clock::Wall;
use guard_tap_replica::link::{Link, LinkBuffers};
use guard_tap_replica::publish::{Mqtt, Outbox};
use guard_tap_replica::{Event, LINK_BUFFER, Replica};
use panic_semihosting as _;
use static_cell::StaticCell;

/// The controller's interrupt line, for the NVIC.
#[derive(Clone, Copy)]
struct EthernetIrq;

// SAFETY: 13 is the LAN9118's line on this board, a valid external
// interrupt number of the Cortex-M4's NVIC.
unsafe impl InterruptNumber for EthernetIrq {
    fn number(self) -> u16 {
        MPS2_IRQ
    }
}

/// No device crate names this board's interrupts: every external
/// interrupt lands here, and only the controller's is enabled.
#[exception]
unsafe fn DefaultHandler(irqn: i16) {
    if irqn == MPS2_IRQ as i16 {
        Lan9118::on_interrupt();
    } else {
        panic!("unexpected interrupt {irqn}");
    }
}

static CMDLINE: StaticCell<[u8; MAX_CMDLINE]> = StaticCell::new();
static RESOURCES: StaticCell<StackResources<4>> = StaticCell::new();
static LINKS: StaticCell<[LinkBuffers<LINK_BUFFER>; 3]> = StaticCell::new();
static OUTBOX: StaticCell<Outbox<PsramFlash>> = StaticCell::new();
/// The outbox: 8 KiB of the board's PSRAM as NOR flash, which a reset
/// leaves as it was.
const OUTBOX_LEN: usize = 8 * PAGE;
/// Marks an outbox erased on a first start ("outb").
const OUTBOX_MAGIC: u32 = 0x6f75_7462;
static CLOCK_LINK: StaticCell<LinkBuffers<256>> = StaticCell::new();

fn fail(what: &str, error: &dyn core::fmt::Display) -> ! {
    hprintln!("net-replica: {what}: {error}");
    debug::exit(debug::EXIT_FAILURE);
    // Semihosting exit does not return under QEMU; on a probe it might.
    loop {
        cortex_m::asm::wfi();
    }
}

/// Seeds token ids and TCP sequence numbers: the board has no random
/// source, so the MAC (unique on the link), the name and the host's time
/// at boot (seconds and centiseconds, through semihosting) are mixed.
fn seed(mac: [u8; 6], name: &str) -> u64 {
    // SAFETY: SYS_TIME and SYS_CLOCK take no argument block.
    let (time, clock) = unsafe { (syscall1(nr::TIME, 0), syscall1(nr::CLOCK, 0)) };
    let mut hasher = foldhash::fast::FixedState::with_seed(0x6775_6172_6400_0000).build_hasher();
    hasher.write(&mac);
    hasher.write(name.as_bytes());
    hasher.write_usize(time);
    hasher.write_usize(clock);
    hasher.finish()
}

#[embassy_executor::task]
async fn net(mut runner: embassy_net::Runner<'static, Lan9118>) -> ! {
    runner.run().await
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let Some(peripherals) = cortex_m::Peripherals::take() else {
        panic!("core peripherals taken twice");
    };
    time_driver::init(peripherals.SYST);

    let line = cmdline(CMDLINE.init([0; MAX_CMDLINE])).unwrap_or_else(|e| fail("command line", &e));
    let args = Args::parse(line).unwrap_or_else(|e| fail("command line", &e));
    let ttl = Ttl::from_millis(args.ttl_ms).unwrap_or_else(|e| fail("--ttl-ms", &e));
    let every =
        Every::new(Duration::from_millis(args.every_ms)).unwrap_or_else(|e| fail("--every-ms", &e));

    // SAFETY: the board's one LAN9118, driven only from here.
    let device = unsafe { Lan9118::new(MPS2_BASE) }.unwrap_or_else(|e| fail("Ethernet", &e));
    let mac = device.mac();
    // SAFETY: the handler (DefaultHandler) is in place; unmasking cannot
    // break a critical section, none is open here.
    unsafe { NVIC::unmask(EthernetIrq) };

    let config = embassy_net::Config::ipv4_static(StaticConfigV4 {
        address: Ipv4Cidr::new(args.ip, args.prefix),
        gateway: None,
        dns_servers: heapless::Vec::new(),
    });
    let seed = seed(mac, args.name);
    let (stack, net_runner) =
        embassy_net::new(device, config, RESOURCES.init(StackResources::new()), seed);
    spawner.spawn(net(net_runner).unwrap_or_else(|_| panic!("network task spawned twice")));
    stack.wait_config_up().await;
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

//! `guard-tap-replica`: the gateway replica of this crate's library on a
//! host: embassy-executor (`platform-std`) runs an embassy-net stack over a
//! TAP device with a static address, and [`guard_tap_replica::run`] on it.
//!
//! Each event is one line on stdout (`up`, `promoted`, `demoted`,
//! `wrote`, `executed`; a failed write on stderr). The end-to-end test in
//! `tests/netns.rs` runs three of them, and the firmware, in a network
//! namespace and kills the leader.

use std::hash::{BuildHasher, RandomState};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;
use embassy_executor::Spawner;
use embassy_net::{IpAddress, IpEndpoint, Ipv4Address, Ipv4Cidr, StackResources, StaticConfigV4};
use embassy_net_tuntap::TunTapDevice;
use guard_core::lock::Ttl;
use guard_core::slot::{Every, UnixMillis};
use guard_embassy::Credentials;
use guard_tap_replica::link::LinkBuffers;
use guard_tap_replica::publish::{Mqtt, Outbox};
use guard_tap_replica::ram_flash::{PAGE, RamFlash};
use guard_tap_replica::{Event, LINK_BUFFER, Replica};

/// A replica of the gateway on a TAP device; see the crate documentation.
#[derive(Parser, Debug)]
#[command(name = "guard-tap-replica", version, about)]
struct Args {
    /// The TAP device (created beforehand, e.g. `ip tuntap add tap0 mode tap`).
    #[arg(long)]
    tap: String,
    /// This replica's MAC address, unique on the link (`02:00:00:00:00:01`).
    #[arg(long)]
    mac: String,
    /// This replica's IPv4 address with prefix length (`10.77.0.10/24`).
    #[arg(long)]
    ip: String,
    /// Redis as `address:port` (IPv4).
    #[arg(long)]
    redis: String,
    /// This replica's name, written to the resource with each fence.
    #[arg(long)]
    name: String,
    /// The leader's lease.
    #[arg(long, default_value_t = 2_000)]
    ttl_ms: u64,
    /// Renewal and standby poll interval (clamped to ttl / 3).
    #[arg(long, default_value_t = 250)]
    interval_ms: u64,
    /// The heartbeat's period (epoch-aligned slots).
    #[arg(long, default_value_t = 1_000)]
    every_ms: u64,
    /// How often the leader writes to the resource.
    #[arg(long, default_value_t = 100)]
    act_ms: u64,
    /// The Redis ACL user to authenticate as (needs `--redis-password`).
    #[arg(long, requires = "redis_password")]
    redis_user: Option<String>,
    /// The password sent as `AUTH` first on each connection to Redis (the
    /// default user's `requirepass`, or `--redis-user`'s).
    #[arg(long)]
    redis_password: Option<String>,
    /// An MQTT broker as `address:port` (IPv4): readings go there at QoS 1
    /// through an outbox, and the leader announces its fence.
    #[arg(long)]
    mqtt: Option<String>,
    /// How often a reading is made (with `--mqtt`).
    #[arg(long, default_value_t = 200)]
    produce_ms: u64,
    /// The most MQTT publications a second (with `--mqtt`).
    #[arg(long, default_value_t = 20)]
    mqtt_per_second: u32,
}

fn parse_mac(text: &str) -> Result<[u8; 6], String> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = parts
            .next()
            .and_then(|p| u8::from_str_radix(p, 16).ok())
            .ok_or_else(|| {
                format!("--mac {text:?}: expected six hex bytes like 02:00:00:00:00:01")
            })?;
    }
    if parts.next().is_some() {
        return Err(format!("--mac {text:?}: more than six bytes"));
    }
    Ok(mac)
}

fn parse_cidr(text: &str) -> Result<Ipv4Cidr, String> {
    let bad = || format!("--ip {text:?}: expected an IPv4 address with prefix, like 10.77.0.10/24");
    let (address, prefix) = text.split_once('/').ok_or_else(bad)?;
    let address: std::net::Ipv4Addr = address.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32).ok_or_else(bad)?;
    Ok(Ipv4Cidr::new(address, prefix))
}

fn parse_endpoint(option: &str, text: &str) -> Result<IpEndpoint, String> {
    let address: std::net::SocketAddrV4 = text.parse().map_err(|_| {
        format!("{option} {text:?}: expected an IPv4 address and port, like 10.77.0.1:6379")
    })?;
    let ip: Ipv4Address = *address.ip();
    Ok(IpEndpoint::new(IpAddress::Ipv4(ip), address.port()))
}

fn wall() -> UnixMillis {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    UnixMillis::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

#[embassy_executor::task]
async fn net(mut runner: embassy_net::Runner<'static, TunTapDevice>) -> ! {
    runner.run().await
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let args = Args::parse();
    if let Err(e) = run(spawner, args).await {
        eprintln!("guard-tap-replica: {e}");
        std::process::exit(2);
    }
}

async fn run(spawner: Spawner, args: Args) -> Result<(), String> {
    let mac = parse_mac(&args.mac)?;
    let address = parse_cidr(&args.ip)?;
    let redis = parse_endpoint("--redis", &args.redis)?;
    let mqtt = match &args.mqtt {
        Some(broker) => Some((
            parse_endpoint("--mqtt", broker)?,
            Mqtt::new(
                std::time::Duration::from_millis(args.produce_ms),
                args.mqtt_per_second,
            )
            .map_err(|e| format!("--produce-ms/--mqtt-per-second: {e}"))?,
        )),
        None => None,
    };
    let ttl = Ttl::from_millis(args.ttl_ms).map_err(|e| format!("--ttl-ms: {e}"))?;
    let every = Every::new(std::time::Duration::from_millis(args.every_ms))
        .map_err(|e| format!("--every-ms: {e}"))?;
    let auth = args
        .redis_password
        .as_deref()
        .map(|password| Credentials::new(args.redis_user.as_deref(), password))
        .transpose()
        .map_err(|e| format!("--redis-user/--redis-password: {e}"))?;

    let mut device =
        TunTapDevice::new(&args.tap).map_err(|e| format!("TAP device {}: {e}", args.tap))?;
    device.set_hardware_address(mac);
    let config = embassy_net::Config::ipv4_static(StaticConfigV4 {
        address,
        gateway: None,
        dns_servers: heapless::Vec::new(),
    });
    // Token ids and TCP sequence numbers must differ between replicas and
    // runs: seeded from the OS's randomness.
    let seed = RandomState::new().hash_one((&args.name, std::process::id()));
    let resources = Box::leak(Box::new(StackResources::<4>::new()));
    let (stack, net_runner) = embassy_net::new(device, config, resources, seed);
    spawner.spawn(net(net_runner).map_err(|e| format!("network task: {e:?}"))?);
    stack.wait_config_up().await;
    println!("{} ip={address}", Event::Up { name: &args.name });

    let replica = Replica {
        name: &args.name,
        redis,
        ttl,
        interval: std::time::Duration::from_millis(args.interval_ms),
        every,
        act: std::time::Duration::from_millis(args.act_ms),
        seed,
        auth,
        mqtt,
    };
    let buffers = [(); 3].map(|()| Box::leak(Box::new(LinkBuffers::<LINK_BUFFER>::new())));
    // The outbox lasts as long as the process (the firmware's survives a
    // reset: it is on the board's flash).
    let flash = RamFlash::new(Box::leak(vec![0u8; 4 * PAGE].into_boxed_slice()));
    let mut outbox =
        Outbox::new(flash, 0..(4 * PAGE) as u32).map_err(|e| format!("the outbox: {e}"))?;
    guard_tap_replica::run(
        stack,
        &replica,
        buffers,
        &mut outbox,
        wall,
        |event| match event {
            Event::WriteFailed { .. } => eprintln!("{event}"),
            event => println!("{event}"),
        },
    )
    .await
    .map_err(|e| e.to_string())
}

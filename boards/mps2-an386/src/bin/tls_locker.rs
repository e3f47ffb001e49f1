//! `tls-locker`: guard-embassy's `RespLocker` over TLS 1.3 from the
//! firmware, on a Cortex-M4F under QEMU (`mps2-an386`) with the board's
//! LAN9118: guard-embassy's `tls` (embedded-tls, no allocator) with
//! records of at most 1 KiB (the maximum fragment length extension, which
//! Redis honours), so each way needs a buffer of one small record.
//!
//! It connects to Redis's TLS port, checks the server's certificate
//! against the CA in the host file `--tls-ca` (DER, read through
//! semihosting) for the name `localhost`, sends `AUTH` first inside the
//! encrypted connection, then takes and releases the lock `tls:<name>`
//! once every `--every-ms` for [`ROUNDS`] rounds, each one line with its
//! fence and the handshakes so far. A connection Redis drops is made
//! again, with a new handshake, by the request after the one that found it
//! gone. It exits 0 after the last round; a certificate the CA did not
//! sign, refused credentials or a round that fails [`ATTEMPTS`] times exit
//! 1 with the reason.
//!
//! ```text
//! qemu-system-arm -cpu cortex-m4 -machine mps2-an386 -nographic \
//!   -semihosting-config enable=on,target=native \
//!   -nic tap,ifname=tap3,script=no,downscript=no,mac=02:00:00:00:00:04 \
//!   -kernel tls-locker -append "--name fw --ip 10.77.0.20/24 \
//!   --redis 10.77.0.1:6380 --tls-ca ca.der --redis-user fw --redis-password pw"
//! ```
//!
//! Limits: the board has no random source, so the TLS client's randomness
//! is ChaCha20 seeded from the MAC, the name and the host's time at boot,
//! through SHA-256 apart from the seed of TCP and the lock tokens (a board
//! with a TRNG seeds from it); it has no calendar clock, so the
//! certificate's validity period is not checked.

#![no_std]
#![no_main]

use cortex_m_semihosting::{debug, hprintln};
#[cfg(feature = "defmt")]
use defmt_semihosting as _;
use embassy_executor::Spawner;
use embassy_net::IpEndpoint;
use embassy_sync::blocking_mutex::raw::NoopRawMutex;
use embassy_time::{Duration, Timer, with_timeout};
use embedded_tls::{MaxFragmentLength, TlsError};
use guard_core::lock::{Locker, Ttl, UnlockError};
use guard_embassy::tls::{TlsChannel, TlsLink, TlsSession, is_refusal, record_len, with_session};
use guard_embassy::{Credentials, RespError, RespLocker};
use guard_firmware_mps2::args::MAX_CMDLINE;
use guard_firmware_mps2::{host_file, network};
use guard_tap_replica::link::{Link, LinkBuffers};
use panic_semihosting as _;
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;
use static_cell::StaticCell;

guard_firmware_mps2::ethernet_interrupt!();

/// Rounds of lock and release.
pub const ROUNDS: u32 = 20;
/// Requests each step may take: the first after a dropped connection
/// fails, the next makes a new one.
pub const ATTEMPTS: u32 = 3;
/// How long one request may take before it is abandoned.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// A record of 1 KiB of data.
const RECORD: usize = record_len(1024);
/// The largest CA certificate taken.
const MAX_CA: usize = 2048;

static CMDLINE: StaticCell<[u8; MAX_CMDLINE]> = StaticCell::new();
static CA: StaticCell<[u8; MAX_CA]> = StaticCell::new();
static TCP: StaticCell<LinkBuffers<RECORD>> = StaticCell::new();
static RECORDS: StaticCell<([u8; RECORD], [u8; RECORD])> = StaticCell::new();

fn fail(what: &str, error: &dyn core::fmt::Display) -> ! {
    network::fail("tls-locker", what, error)
}

/// Why a request failed: Redis's error, or no answer in time.
enum Failure {
    Redis(RespError<TlsError>),
    TimedOut,
}

impl core::fmt::Display for Failure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Failure::Redis(e) => write!(f, "{e}"),
            Failure::TimedOut => write!(f, "no answer within {} s", REQUEST_TIMEOUT.as_secs()),
        }
    }
}

/// `request`, abandoned after [`REQUEST_TIMEOUT`] (the locker then starts
/// a new session with its next request).
async fn asked<T>(
    request: impl core::future::Future<Output = Result<T, RespError<TlsError>>>,
) -> Result<T, Failure> {
    match with_timeout(REQUEST_TIMEOUT, request).await {
        Ok(answer) => answer.map_err(Failure::Redis),
        Err(_) => Err(Failure::TimedOut),
    }
}

/// Reports attempt `attempt` of `what` failing; ends the image on a
/// refusal that asking again cannot change (credentials, the server's
/// certificate) or on the last attempt.
fn failed(name: &str, round: u32, what: &str, attempt: u32, e: &Failure) {
    match e {
        Failure::Redis(e @ RespError::AuthRefused(_)) => fail("AUTH", e),
        Failure::Redis(RespError::Io(tls)) if is_refusal(tls) => fail("TLS", tls),
        e if attempt >= ATTEMPTS => fail(what, e),
        e => hprintln!("failed name={name} round={round} {what}: {e}"),
    }
}

#[embassy_executor::main]
async fn main(spawner: Spawner) {
    let args = network::boot("tls-locker", CMDLINE.init([0; MAX_CMDLINE]));
    let Some(ca_path) = args.tls_ca else {
        fail(
            "--tls-ca",
            &"is required: the CA the server's certificate is checked against",
        );
    };
    let ca =
        host_file::read(ca_path, CA.init([0; MAX_CA])).unwrap_or_else(|e| fail("--tls-ca", &e));
    let ttl = Ttl::from_millis(args.ttl_ms).unwrap_or_else(|e| fail("--ttl-ms", &e));
    let name = args.name;
    let mut key: heapless::String<40> = heapless::String::new();
    if core::fmt::Write::write_fmt(&mut key, format_args!("tls:{name}")).is_err() {
        fail("--name", &"too long for the key");
    }

    // SAFETY: this image owns the board's one LAN9118, and DefaultHandler
    // is in place.
    let (stack, seed, mac) = unsafe { network::start(spawner, &args) }
        .await
        .unwrap_or_else(|e| fail("Ethernet", &e));
    hprintln!("up name={name} ip={}/{}", args.ip, args.prefix);

    let channel: TlsChannel<NoopRawMutex> = TlsChannel::new();
    let tcp = Link::new(
        stack,
        IpEndpoint::from(args.redis),
        TCP.init(LinkBuffers::new()),
    );
    let (read, write) = RECORDS.init(([0; RECORD], [0; RECORD]));
    let mut session = TlsSession::new(
        tcp,
        Link::close,
        (read, write),
        "localhost",
        ca,
        // Its own seed: `seed` makes TCP sequence numbers and lock
        // tokens, which anyone on the path or with Redis sees.
        ChaCha20Rng::from_seed(network::tls_seed(mac, name)),
    )
    .unwrap_or_else(|e| fail("--tls-ca", &e));
    let mut locker =
        RespLocker::<NoopRawMutex, _>::new(TlsLink::new(&channel), seed).with_reset(TlsLink::close);
    if let Some(password) = args.redis_password {
        let credentials = Credentials::new(args.redis_user, password)
            .unwrap_or_else(|e| fail("--redis-user/--redis-password", &e));
        locker = locker.with_credentials(credentials);
    }
    let authenticating = args.redis_password.is_some();
    let rounds = async {
        // With credentials, the first request: the first handshake too.
        if authenticating {
            for attempt in 1..=ATTEMPTS {
                match asked(locker.authenticate()).await {
                    Ok(()) => break,
                    Err(e) => failed(name, 0, "AUTH", attempt, &e),
                }
            }
            hprintln!(
                "authenticated name={name} handshakes={}",
                channel.handshakes()
            );
        }
        for round in 1..=ROUNDS {
            let mut attempt = 0;
            let held = loop {
                attempt += 1;
                match asked(locker.try_lock(&key, ttl)).await {
                    Ok(Some(held)) => break held,
                    // After a failed attempt, the lock may be this image's
                    // own, granted by a request whose reply was lost: its
                    // lease ends within the TTL.
                    Ok(None) if attempt > 1 && attempt < ATTEMPTS => {
                        hprintln!(
                            "held name={name} round={round}: waiting out a lease whose grant was lost"
                        );
                        Timer::after_millis(args.ttl_ms).await;
                    }
                    Ok(None) => fail("lock", &"held by another"),
                    Err(e) => failed(name, round, "lock", attempt, &e),
                }
            };
            for attempt in 1..=ATTEMPTS {
                let released = asked(async {
                    match locker.unlock(&key, &held).await {
                        Ok(()) => Ok(true),
                        Err(UnlockError::Backend(e)) => Err(e),
                        // Not held (the only other answer).
                        Err(_) => Ok(false),
                    }
                });
                match released.await {
                    Ok(true) => break,
                    // Released by an earlier attempt whose reply was lost.
                    Ok(false) if attempt > 1 => break,
                    Ok(false) => fail("unlock", &"the lease ended before its release"),
                    Err(e) => failed(name, round, "unlock", attempt, &e),
                }
            }
            hprintln!(
                "locked name={name} round={round} fence={} handshakes={}",
                held.fence(),
                channel.handshakes()
            );
            Timer::after_millis(args.every_ms).await;
        }
    };
    with_session(
        &mut session,
        &channel,
        Some(MaxFragmentLength::Bits10),
        rounds,
    )
    .await;
    hprintln!("done name={name} rounds={ROUNDS}");
    debug::exit(debug::EXIT_SUCCESS);
}

//! `RespLocker` over TLS 1.3 from embedded-tls, the `no_std` client an MCU
//! would run, against a `redis-server` with `--tls-port`: the server's
//! certificate is checked against the CA (ECDSA P-256, the name
//! `localhost`), `AUTH` goes first inside the encrypted connection, and
//! two lockers on connections of their own exclude each other with
//! increasing fences. A server whose certificate another CA signed is
//! refused in the handshake, before anything is sent. With the maximum
//! fragment length extension (RFC 6066), which Redis's OpenSSL honours,
//! the records and so the buffers an MCU gives each connection shrink
//! from 16 KiB to 1 or 4 KiB.

use embassy_sync::blocking_mutex::raw::NoopRawMutex;
use embedded_io_adapters::futures_03::FromFutures;
use embedded_io_async::{Read as _, ReadExactError, Write as _};
use embedded_tls::pki::CertVerifier;
use embedded_tls::{
    Aes128GcmSha256, Certificate, CryptoProvider, CryptoRngCore, MaxFragmentLength, NoClock,
    TlsConfig, TlsConnection, TlsContext, TlsError, TlsVerifier,
};
use guard_core::lock::{Locker, Ttl};
use guard_embassy::RespLocker;
use guard_testkit::{RedisServer, TestCerts};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

/// TLS's largest record (16 KiB of data and its overhead): what a server
/// that does not negotiate smaller records may send.
const RECORD: usize = 16_640;

type Tls<'b> = TlsConnection<'b, FromFutures<async_net::TcpStream>, Aes128GcmSha256>;

/// Checks the server's certificate against `ca`, with a seeded ChaCha20 as
/// the randomness (an MCU seeds it from its RNG).
struct Verified<'a> {
    rng: ChaCha20Rng,
    verifier: CertVerifier<'a, Aes128GcmSha256, NoClock, 2048>,
}

impl CryptoProvider for Verified<'_> {
    type CipherSuite = Aes128GcmSha256;
    type Signature = &'static [u8];

    fn rng(&mut self) -> impl CryptoRngCore {
        &mut self.rng
    }

    fn verifier(&mut self) -> Result<&mut impl TlsVerifier<Aes128GcmSha256>, TlsError> {
        Ok(&mut self.verifier)
    }
}

/// A TLS connection to `server`, its certificate checked against `ca`.
async fn open<'b>(
    server: &RedisServer,
    ca: &[u8],
    seed: u64,
    read: &'b mut [u8],
    write: &'b mut [u8],
) -> Result<Tls<'b>, TlsError> {
    open_with(server, ca, seed, None, read, write).await
}

/// [`open`], asking for records of at most `fragment` bytes of data.
async fn open_with<'b>(
    server: &RedisServer,
    ca: &[u8],
    seed: u64,
    fragment: Option<MaxFragmentLength>,
    read: &'b mut [u8],
    write: &'b mut [u8],
) -> Result<Tls<'b>, TlsError> {
    let tcp = async_net::TcpStream::connect(("127.0.0.1", server.port()))
        .await
        .expect("connect");
    let mut tls = TlsConnection::new(FromFutures::new(tcp), read, write);
    let mut config = TlsConfig::new().with_server_name("localhost");
    if let Some(fragment) = fragment {
        config = config.with_max_fragment_length(fragment);
    }
    let provider = Verified {
        rng: ChaCha20Rng::seed_from_u64(seed),
        verifier: CertVerifier::new(Certificate::X509(ca)),
    };
    tls.open(TlsContext::new(&config, provider)).await?;
    Ok(tls)
}

fn ttl() -> Ttl {
    Ttl::from_secs(10).unwrap()
}

#[test]
fn lockers_over_tls_check_the_certificate_authenticate_and_exclude_each_other() {
    let certs = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls(&certs).expect("redis");
    let reply = server
        .command("CONFIG SET requirepass s3cret")
        .expect("requirepass");
    assert!(reply.starts_with("+OK"), "{reply}");
    let ca = certs.ca_der().expect("CA");
    smol::block_on(async {
        let (mut r1, mut w1) = (vec![0u8; RECORD], vec![0u8; RECORD]);
        let (mut r2, mut w2) = (vec![0u8; RECORD], vec![0u8; RECORD]);
        let first = open(&server, &ca, 1, &mut r1, &mut w1).await.expect("TLS");
        let second = open(&server, &ca, 2, &mut r2, &mut w2).await.expect("TLS");
        let a = RespLocker::<NoopRawMutex, _>::new(first, 11)
            .with_auth(None, "s3cret")
            .unwrap();
        let b = RespLocker::<NoopRawMutex, _>::new(second, 12)
            .with_auth(None, "s3cret")
            .unwrap();
        a.authenticate().await.expect("AUTH over TLS");
        let held = a
            .try_lock("tls", ttl())
            .await
            .expect("a reply")
            .expect("granted");
        assert!(
            b.try_lock("tls", ttl()).await.expect("a reply").is_none(),
            "held by the other locker"
        );
        a.unlock("tls", &held).await.expect("released");
        let next = b
            .try_lock("tls", ttl())
            .await
            .expect("a reply")
            .expect("granted once released");
        assert!(next.fence() > held.fence());
    });
}

#[test]
fn a_certificate_another_ca_signed_is_refused_in_the_handshake() {
    let certs = TestCerts::generate().expect("certificates");
    let stranger = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls(&certs).expect("redis");
    let wrong_ca = stranger.ca_der().expect("CA");
    smol::block_on(async {
        let (mut r, mut w) = (vec![0u8; RECORD], vec![0u8; RECORD]);
        let refused = open(&server, &wrong_ca, 3, &mut r, &mut w).await;
        assert!(
            matches!(
                refused,
                Err(TlsError::InvalidCertificate | TlsError::InvalidSignature)
            ),
            "{:?}",
            refused.err()
        );
    });
}

/// A record of at most `data` bytes of data in TLS 1.3: its 5-byte
/// header, the content type and the AEAD tag (16 bytes) beside the data.
const fn record(data: usize) -> usize {
    5 + data + 1 + 16
}

/// Sends `GET big` on `tls` and reads its reply of `len` bytes whole.
async fn get_big(tls: &mut Tls<'_>, len: usize) -> Result<Vec<u8>, TlsError> {
    tls.write_all(b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n").await?;
    tls.flush().await?;
    let mut reply = vec![0u8; len];
    tls.read_exact(&mut reply).await.map_err(|e| match e {
        ReadExactError::Other(e) => e,
        ReadExactError::UnexpectedEof => TlsError::ConnectionClosed,
    })?;
    Ok(reply)
}

#[test]
fn with_1_and_4_kib_records_a_locker_runs_on_buffers_an_mcu_can_spare() {
    let certs = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls(&certs).expect("redis");
    let ca = certs.ca_der().expect("CA");
    // A reply of 10,000 bytes: a server that ignored the extension would
    // send it in records larger than the buffers.
    let value = "v".repeat(10_000);
    let reply = server.command(&format!("SET big {value}")).expect("SET");
    assert!(reply.starts_with("+OK"), "{reply}");
    let expected = format!("${}\r\n{value}\r\n", value.len()).into_bytes();
    for (fragment, data) in [
        (MaxFragmentLength::Bits10, 1024),
        (MaxFragmentLength::Bits12, 4096),
    ] {
        smol::block_on(async {
            // Read and write buffers of one record each.
            let (mut r, mut w) = (vec![0u8; record(data)], vec![0u8; record(data)]);
            let mut tls = open_with(&server, &ca, 4, Some(fragment), &mut r, &mut w)
                .await
                .unwrap_or_else(|e| panic!("TLS with {fragment:?}: {e:?}"));
            match get_big(&mut tls, expected.len()).await {
                Ok(big) => assert!(big == expected, "{fragment:?}: another reply"),
                Err(e) => panic!("{fragment:?}: {e:?}"),
            }
            let locker = RespLocker::<NoopRawMutex, _>::new(tls, 13);
            let held = locker
                .try_lock("small", ttl())
                .await
                .expect("a reply")
                .expect("granted");
            locker.unlock("small", &held).await.expect("released");
        });
    }
    // Without the extension, the same reply does not fit 1 KiB buffers:
    // the extension is what makes them enough.
    smol::block_on(async {
        let (mut r, mut w) = (vec![0u8; record(1024)], vec![0u8; record(1024)]);
        let mut tls = open_with(&server, &ca, 5, None, &mut r, &mut w)
            .await
            .expect("the handshake fits");
        let big = get_big(&mut tls, expected.len()).await;
        assert!(big.is_err(), "a 10,000-byte reply in 1 KiB records unasked");
    });
}

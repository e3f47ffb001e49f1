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
use embedded_tls::{
    Aes128GcmSha256, MaxFragmentLength, TlsConfig, TlsConnection, TlsContext, TlsError,
};
use guard_core::lock::{Locker, Ttl};
use guard_embassy::RespLocker;
use guard_embassy::tls::{CaVerified, TlsChannel, TlsLink, TlsSession, record_len, with_session};
use guard_testkit::{RedisServer, TestCerts};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::SeedableRng;

/// TLS's largest record (16 KiB of data and its overhead): what a server
/// that does not negotiate smaller records may send.
const RECORD: usize = 16_640;

type Tls<'b> = TlsConnection<'b, FromFutures<async_net::TcpStream>, Aes128GcmSha256>;

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
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let provider = CaVerified::new(ca, &mut rng);
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
            let (mut r, mut w) = (vec![0u8; record_len(data)], vec![0u8; record_len(data)]);
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
        let (mut r, mut w) = (vec![0u8; record_len(1024)], vec![0u8; record_len(1024)]);
        let mut tls = open_with(&server, &ca, 5, None, &mut r, &mut w)
            .await
            .expect("the handshake fits");
        let big = get_big(&mut tls, expected.len()).await;
        assert!(big.is_err(), "a 10,000-byte reply in 1 KiB records unasked");
    });
}

/// A TCP connection to one address that connects on its next use after a
/// failure or [`Reconnecting::close`], as an MCU's socket wrapper does.
struct Reconnecting {
    port: u16,
    stream: Option<FromFutures<async_net::TcpStream>>,
}

impl Reconnecting {
    fn close(&mut self) {
        self.stream = None;
    }

    async fn stream(&mut self) -> Result<&mut FromFutures<async_net::TcpStream>, std::io::Error> {
        if self.stream.is_none() {
            let tcp = async_net::TcpStream::connect(("127.0.0.1", self.port)).await?;
            self.stream = Some(FromFutures::new(tcp));
        }
        Ok(self.stream.as_mut().expect("connected"))
    }
}

impl embedded_io_async::ErrorType for Reconnecting {
    type Error = std::io::Error;
}

impl embedded_io_async::Read for Reconnecting {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, std::io::Error> {
        let read = self.stream().await?.read(buf).await;
        if !matches!(read, Ok(n) if n > 0 || buf.is_empty()) {
            self.close();
        }
        read
    }
}

impl embedded_io_async::Write for Reconnecting {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, std::io::Error> {
        let written = self.stream().await?.write(buf).await;
        if written.is_err() {
            self.close();
        }
        written
    }

    async fn flush(&mut self) -> Result<(), std::io::Error> {
        let flushed = self.stream().await?.flush().await;
        if flushed.is_err() {
            self.close();
        }
        flushed
    }
}

/// TLS sessions with `server` over [`Reconnecting`], its certificate
/// checked against `ca`, records in `buffers`.
fn session<'b>(
    port: u16,
    ca: &'b [u8],
    seed: u64,
    buffers: (&'b mut [u8], &'b mut [u8]),
) -> TlsSession<'b, Reconnecting, ChaCha20Rng> {
    let tcp = Reconnecting { port, stream: None };
    TlsSession::new(
        tcp,
        Reconnecting::close,
        buffers,
        "localhost",
        ca,
        ChaCha20Rng::seed_from_u64(seed),
    )
    .expect("a DER certificate")
}

#[test]
fn a_session_reconnects_with_a_new_handshake_after_redis_drops_every_client() {
    let certs = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls(&certs).expect("redis");
    // An ACL user for the locker; the harness stays the default user.
    let reply = server
        .command("ACL SETUSER mcu on >s3cret ~* &* +@all")
        .expect("ACL");
    assert!(reply.starts_with("+OK"), "{reply}");
    let ca = certs.ca_der().expect("CA");
    let (mut r, mut w) = (vec![0u8; record_len(1024)], vec![0u8; record_len(1024)]);
    let mut session = session(server.port(), &ca, 6, (&mut r, &mut w));
    let channel: TlsChannel<NoopRawMutex> = TlsChannel::new();
    let locker = RespLocker::<NoopRawMutex, _>::new(TlsLink::new(&channel), 14)
        .with_reset(TlsLink::close)
        .with_auth(Some("mcu"), "s3cret")
        .unwrap();
    let fragment = Some(MaxFragmentLength::Bits10);
    smol::block_on(with_session(&mut session, &channel, fragment, async {
        let first = locker
            .try_lock("again", ttl())
            .await
            .expect("a reply")
            .expect("granted");
        locker.unlock("again", &first).await.expect("released");
        assert_eq!(channel.handshakes(), 1);
        let killed = server
            .command("CLIENT KILL TYPE normal")
            .expect("CLIENT KILL");
        assert!(killed.starts_with(':'), "{killed}");
        // The request that finds the connection gone fails; the next one
        // starts a new session, authenticates in it and is granted.
        let gone = locker.try_lock("again", ttl()).await;
        assert!(gone.is_err(), "{gone:?}");
        let second = locker
            .try_lock("again", ttl())
            .await
            .expect("a reply on a new session")
            .expect("granted");
        assert_eq!(channel.handshakes(), 2, "one new handshake");
        assert!(second.fence() > first.fence());
    }));
}

#[test]
fn an_abandoned_read_never_answers_a_later_one_nor_spoils_what_is_written_next() {
    let certs = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls(&certs).expect("redis");
    let ca = certs.ca_der().expect("CA");
    let (mut r, mut w) = (vec![0u8; record_len(1024)], vec![0u8; record_len(1024)]);
    let mut session = session(server.port(), &ca, 7, (&mut r, &mut w));
    let channel: TlsChannel<NoopRawMutex> = TlsChannel::new();
    let mut link = TlsLink::new(&channel);
    smol::block_on(with_session(&mut session, &channel, None, async {
        // A reply that comes only after a second; its read is abandoned.
        link.write_all(b"*3\r\n$5\r\nBLPOP\r\n$5\r\nempty\r\n$1\r\n1\r\n")
            .await
            .expect("written");
        link.flush().await.expect("flushed");
        let mut buf = [0u8; 64];
        let abandoned = within(100, link.read(&mut buf)).await;
        assert!(abandoned.is_none(), "BLPOP answered at once: {abandoned:?}");
        // While the session still waits for that reply, the next request
        // is written; the abandoned read takes the late reply, this one
        // gets its own.
        link.write_all(b"*1\r\n$4\r\nPING\r\n")
            .await
            .expect("written");
        link.flush().await.expect("flushed");
        let n = link.read(&mut buf).await.expect("a reply");
        assert_eq!(
            &buf[..n],
            b"+PONG\r\n",
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }));
}

/// A TCP proxy to `port` that lets each connection through only after
/// `delay`: a server slow to start its handshake.
fn slow_proxy(port: u16, delay: std::time::Duration) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let local = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                    return;
                };
                let (mut c, mut s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || drop(std::io::copy(&mut c, &mut s)));
                let (mut c, mut s) = (client, server);
                drop(std::io::copy(&mut s, &mut c));
            });
        }
    });
    local
}

/// `fut`, or `None` once `ms` milliseconds passed.
async fn within<T>(ms: u64, fut: impl std::future::Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(fut.await) }, async {
        async_io::Timer::after(std::time::Duration::from_millis(ms)).await;
        None
    })
    .await
}

#[test]
fn a_close_ends_a_read_that_waits_on_a_silent_server() {
    let certs = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls(&certs).expect("redis");
    let ca = certs.ca_der().expect("CA");
    let (mut r, mut w) = (vec![0u8; record_len(1024)], vec![0u8; record_len(1024)]);
    let mut session = session(server.port(), &ca, 8, (&mut r, &mut w));
    let channel: TlsChannel<NoopRawMutex> = TlsChannel::new();
    let mut link = TlsLink::new(&channel);
    smol::block_on(with_session(&mut session, &channel, None, async {
        // Blocks for ever: the server stays silent on this connection.
        link.write_all(b"*3\r\n$5\r\nBLPOP\r\n$5\r\nempty\r\n$1\r\n0\r\n")
            .await
            .expect("written");
        link.flush().await.expect("flushed");
        let mut buf = [0u8; 64];
        assert!(within(100, link.read(&mut buf)).await.is_none());
        link.close();
        let pong = within(5_000, async {
            link.write_all(b"*1\r\n$4\r\nPING\r\n").await?;
            link.flush().await?;
            link.read(&mut buf).await
        })
        .await
        .expect("a new connection, not the one stuck in BLPOP");
        let n = pong.expect("a reply");
        assert_eq!(&buf[..n], b"+PONG\r\n");
        assert_eq!(channel.handshakes(), 2);
    }));
}

#[test]
fn a_write_abandoned_during_the_handshake_is_never_sent() {
    let certs = TestCerts::generate().expect("certificates");
    let server = RedisServer::start_tls(&certs).expect("redis");
    let ca = certs.ca_der().expect("CA");
    let slow = slow_proxy(server.port(), std::time::Duration::from_millis(300));
    let (mut r, mut w) = (vec![0u8; record_len(1024)], vec![0u8; record_len(1024)]);
    let mut session = session(slow, &ca, 9, (&mut r, &mut w));
    let channel: TlsChannel<NoopRawMutex> = TlsChannel::new();
    let mut link = TlsLink::new(&channel);
    smol::block_on(with_session(&mut session, &channel, None, async {
        // The first write asks for the connection and is abandoned while
        // the handshake waits for the server.
        assert!(
            within(50, link.write(b"*1\r\n$4\r\nPING\r\n"))
                .await
                .is_none()
        );
        // The next request, once connected, is the only one sent.
        let echo = b"*2\r\n$4\r\nECHO\r\n$1\r\nx\r\n";
        link.write_all(echo).await.expect("written");
        link.write_all(b"*1\r\n$4\r\nPING\r\n")
            .await
            .expect("written");
        link.flush().await.expect("flushed");
        let mut replies = Vec::new();
        let mut buf = [0u8; 64];
        while replies.len() < b"$1\r\nx\r\n+PONG\r\n".len() {
            let n = within(5_000, link.read(&mut buf))
                .await
                .expect("replies")
                .expect("a reply");
            replies.extend_from_slice(&buf[..n]);
        }
        assert_eq!(
            String::from_utf8_lossy(&replies),
            "$1\r\nx\r\n+PONG\r\n",
            "the ECHO and the PING, nothing before them"
        );
        assert_eq!(channel.handshakes(), 1);
    }));
}

//! `RespLocker` against a Redis that asks for a password: the default
//! user's (`requirepass`) and an ACL user's credentials are sent as `AUTH`
//! first on every connection (again after a replaced one); a wrong
//! password, credentials a server without a password is sent, and a
//! server that asks for one but is given none each fail with the server's
//! reason, and nothing else is sent; an ACL user without the scripting
//! commands gets the server's refusal by name; a connection reset after
//! an abandoned request, and one that reconnected on its own (answered
//! NOAUTH), authenticate again.

use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};

use embassy_sync::blocking_mutex::raw::NoopRawMutex;
use embedded_io_adapters::futures_03::FromFutures;
use guard_core::lock::{Locker, Ttl};
use guard_embassy::{InvalidCredentials, RespError, RespLocker};
use guard_testkit::RedisServer;

type Conn = FromFutures<async_net::TcpStream>;

/// A server whose default user's password is `s3cret`, with the ACL users
/// `gateway` (password `pw`, every command on guard's keys) and `reader`
/// (password `pw`, no scripts).
fn guarded_server() -> RedisServer {
    let server = RedisServer::start().expect("redis-server");
    for command in [
        "ACL SETUSER gateway on >pw ~* +@all",
        "ACL SETUSER reader on >pw ~* +@all -@scripting",
        // Last: after it, only AUTH'd clients are served.
        "CONFIG SET requirepass s3cret",
    ] {
        let reply = server.command(command).expect(command);
        assert!(reply.starts_with("+OK"), "{command}: {reply}");
    }
    server
}

async fn connect(server: &RedisServer) -> Conn {
    let stream = async_net::TcpStream::connect(("127.0.0.1", server.port()))
        .await
        .expect("connect");
    FromFutures::new(stream)
}

fn ttl() -> Ttl {
    Ttl::from_secs(10).unwrap()
}

#[test]
fn the_default_users_password_and_an_acl_user_are_sent_first_on_every_connection() {
    let server = guarded_server();
    smol::block_on(async {
        let default = RespLocker::<NoopRawMutex, _>::new(connect(&server).await, 1)
            .with_auth(None, "s3cret")
            .unwrap();
        default
            .authenticate()
            .await
            .expect("the default user's password");
        let token = default
            .try_lock("auth:a", ttl())
            .await
            .unwrap()
            .expect("free");
        default.unlock("auth:a", &token).await.unwrap();

        let gateway = RespLocker::<NoopRawMutex, _>::new(connect(&server).await, 2)
            .with_auth(Some("gateway"), "pw")
            .unwrap();
        // No authenticate(): the first request sends AUTH first.
        let token = gateway
            .try_lock("auth:b", ttl())
            .await
            .unwrap()
            .expect("free");
        // A replaced connection authenticates again before its first request.
        gateway.replace_connection(connect(&server).await).await;
        gateway
            .unlock("auth:b", &token)
            .await
            .expect("released on the new connection");
        assert!(
            format!("{gateway:?}").contains("gateway") && !format!("{gateway:?}").contains("pw\"")
        );
    });
}

#[test]
fn refused_credentials_fail_with_the_servers_reason_and_nothing_else_is_sent() {
    let server = guarded_server();
    smol::block_on(async {
        let wrong = RespLocker::<NoopRawMutex, _>::new(connect(&server).await, 3)
            .with_auth(Some("gateway"), "not-it")
            .unwrap();
        match wrong.authenticate().await {
            Err(RespError::AuthRefused(reason)) => {
                assert!(reason.contains("WRONGPASS"), "{reason}")
            }
            other => panic!("refused, not {other:?}"),
        }
        // Every later request is refused the same way, none sent without it.
        let error = wrong.try_lock("auth:c", ttl()).await.unwrap_err();
        assert!(matches!(error, RespError::AuthRefused(_)), "{error:?}");
        assert!(error.to_string().contains("credentials"), "{error}");

        let none = RespLocker::<NoopRawMutex, _>::new(connect(&server).await, 4);
        match none.try_lock("auth:d", ttl()).await {
            Err(RespError::Server(reason)) => assert!(reason.contains("NOAUTH"), "{reason}"),
            other => panic!("the server asks for a password: {other:?}"),
        }

        let reader = RespLocker::<NoopRawMutex, _>::new(connect(&server).await, 5)
            .with_auth(Some("reader"), "pw")
            .unwrap();
        match reader.try_lock("auth:e", ttl()).await {
            Err(RespError::Server(reason)) => assert!(reason.contains("NOPERM"), "{reason}"),
            other => panic!("a user without scripts is refused: {other:?}"),
        }
    });
    let open = RedisServer::start().expect("redis-server");
    smol::block_on(async {
        let sent = RespLocker::<NoopRawMutex, _>::new(connect(&open).await, 6)
            .with_auth(None, "s3cret")
            .unwrap();
        match sent.authenticate().await {
            Err(RespError::AuthRefused(reason)) => assert!(!reason.is_empty()),
            other => panic!("a server without a password refuses one: {other:?}"),
        }
    });
}

#[test]
fn credentials_that_cannot_be_sent_are_refused_when_given() {
    let too_long = "p".repeat(guard_embassy::MAX_PASSWORD + 1);
    let locker = || {
        let nowhere = FromFutures::new(futures_lite::io::Cursor::new(Vec::new()));
        RespLocker::<NoopRawMutex, _>::new(nowhere, 7)
    };
    assert_eq!(
        locker().with_auth(None, "").unwrap_err(),
        InvalidCredentials::Password
    );
    assert_eq!(
        locker().with_auth(None, &too_long).unwrap_err(),
        InvalidCredentials::Password
    );
    assert_eq!(
        locker().with_auth(Some(""), "pw").unwrap_err(),
        InvalidCredentials::User
    );
}

/// The server the reconnecting connections below go to.
static PORT: AtomicU16 = AtomicU16::new(0);

/// A new connection to [`PORT`], made synchronously (as a reset hook
/// must).
fn fresh() -> Conn {
    let stream =
        std::net::TcpStream::connect(("127.0.0.1", PORT.load(Ordering::SeqCst))).expect("connect");
    FromFutures::new(async_net::TcpStream::try_from(stream).expect("async stream"))
}

/// The reset hook: closes the connection by opening another.
fn reconnect(conn: &mut Conn) {
    *conn = fresh();
}

/// Set to make [`Reconnecting`] open a new connection under the locker
/// before its next write, as a connection that reconnects on its own.
static SWAP_NEXT: AtomicBool = AtomicBool::new(false);

/// A connection that may reconnect on its own.
struct Reconnecting(Conn);

impl embedded_io_async::ErrorType for Reconnecting {
    type Error = <Conn as embedded_io_async::ErrorType>::Error;
}

impl embedded_io_async::Read for Reconnecting {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Self::Error> {
        self.0.read(buf).await
    }
}

impl embedded_io_async::Write for Reconnecting {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        if SWAP_NEXT.swap(false, Ordering::SeqCst) {
            self.0 = fresh();
        }
        self.0.write(buf).await
    }

    async fn flush(&mut self) -> Result<(), Self::Error> {
        self.0.flush().await
    }
}

#[test]
fn a_reset_connection_and_one_that_reconnected_on_its_own_authenticate_again() {
    let server = guarded_server();
    PORT.store(server.port(), Ordering::SeqCst);
    smol::block_on(async {
        // A request abandoned half-way: the next one resets the connection
        // (a new one), which sends AUTH before it.
        let reset = RespLocker::<NoopRawMutex, _>::new(fresh(), 8)
            .with_reset(reconnect)
            .with_auth(Some("gateway"), "pw")
            .unwrap();
        reset.authenticate().await.unwrap();
        // The server holds every reply for 400 ms: the request is given
        // up at 100 ms, half-way.
        let paused = server
            .command("AUTH s3cret\r\nCLIENT PAUSE 400 ALL")
            .unwrap();
        assert!(paused.starts_with("+OK"), "{paused}");
        let abandoned = futures_lite::future::or(
            async { Some(reset.try_lock("auth:f", ttl()).await) },
            async {
                async_io::Timer::after(std::time::Duration::from_millis(100)).await;
                None
            },
        )
        .await;
        assert!(abandoned.is_none(), "cut off before its reply");
        async_io::Timer::after(std::time::Duration::from_millis(500)).await;
        let token = reset
            .try_lock("auth:g", ttl())
            .await
            .expect("authenticated again");
        assert!(token.is_some());

        // A connection that reconnected under the locker is answered
        // NOAUTH: the locker authenticates again and sends the request once
        // more.
        let own = RespLocker::<NoopRawMutex, _>::new(Reconnecting(fresh()), 9)
            .with_auth(Some("gateway"), "pw")
            .unwrap();
        own.authenticate().await.unwrap();
        SWAP_NEXT.store(true, Ordering::SeqCst);
        let token = own
            .try_lock("auth:h", ttl())
            .await
            .expect("after NOAUTH, AUTH again");
        assert!(token.is_some());
    });
}

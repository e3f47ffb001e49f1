//! `RespLocker` (the embedded locker, here over a host TCP socket) and
//! guard-redis's `RedisLocker` on one real redis-server: they exclude each
//! other, share fences, and refuse each other's tokens.

use std::net::TcpListener;
use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use embedded_io_adapters::futures_03::FromFutures;
use futures_lite::future;
use guard_core::lock::redis::InvalidRedisKey;
use guard_core::lock::{LeaseRenewer, Locker, Renewal, Ttl, UnlockError};
use guard_embassy::{RespError, RespLocker};
use guard_redis::{RedisConnection, RedisLocker, Topology};
use guard_testkit::RedisServer;

type Socket = FromFutures<async_net::TcpStream>;
type Embedded = RespLocker<CriticalSectionRawMutex, Socket>;

async fn socket(port: u16) -> Socket {
    FromFutures::new(
        async_net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect"),
    )
}

async fn lockers(server: &RedisServer, prefix: &str) -> (Embedded, RedisLocker) {
    let embedded = RespLocker::new(socket(server.port()).await, 0x5eed_0001)
        .with_prefix(prefix)
        .unwrap();
    let conn = RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_millis(500),
    )
    .await
    .unwrap();
    (
        embedded,
        RedisLocker::new(conn).with_prefix(prefix).unwrap(),
    )
}

/// Whether `request` was still waiting after 100 ms (then it is dropped
/// half-way, as a time-out would).
async fn abandoned<T>(request: impl std::future::Future<Output = T>) -> bool {
    future::or(
        async {
            request.await;
            false
        },
        async {
            async_io::Timer::after(Duration::from_millis(100)).await;
            true
        },
    )
    .await
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

#[test]
fn the_embedded_and_the_server_locker_exclude_each_other() {
    let server = RedisServer::start().expect("redis-server");
    smol::block_on(async {
        let (mcu, srv) = lockers(&server, "edge").await;
        let key = "guard:active:consumer:sensors";

        let held = mcu.try_lock(key, ttl(5_000)).await.unwrap().expect("free");
        assert!(srv.try_lock(key, ttl(5_000)).await.unwrap().is_none());
        // Tokens are not interchangeable.
        let other = srv
            .try_lock("guard:active:elsewhere", ttl(5_000))
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(
            srv.unlock(key, &other).await,
            Err(UnlockError::NotHeld)
        ));
        assert_eq!(
            srv.renew(key, &other, ttl(5_000)).await.unwrap(),
            Renewal::Lost
        );
        assert_eq!(
            mcu.renew(key, &held, ttl(5_000)).await.unwrap(),
            Renewal::Held
        );

        mcu.unlock(key, &held).await.unwrap();
        let taken = srv
            .try_lock(key, ttl(5_000))
            .await
            .unwrap()
            .expect("released");
        assert!(mcu.try_lock(key, ttl(5_000)).await.unwrap().is_none());
        assert!(matches!(
            mcu.unlock(key, &held).await,
            Err(UnlockError::NotHeld)
        ));
        assert!(
            taken.fence() > held.fence(),
            "one fence counter per key domain"
        );
    });
}

#[test]
fn fences_increase_across_both_lockers_and_slots_of_one_schedule() {
    let server = RedisServer::start().expect("redis-server");
    smol::block_on(async {
        let (mcu, srv) = lockers(&server, "").await;
        let mut last = 0;
        for slot in 0..20u64 {
            let key = format!("guard:once:heartbeat:{}", 1_700_000_000_000 + slot * 1_000);
            // One of them wins the slot, alternating who asks first.
            let (first, second) = if slot % 2 == 0 {
                (
                    mcu.try_lock(&key, ttl(60_000)).await.unwrap(),
                    srv.try_lock(&key, ttl(60_000)).await.unwrap(),
                )
            } else {
                (
                    srv.try_lock(&key, ttl(60_000)).await.unwrap(),
                    mcu.try_lock(&key, ttl(60_000)).await.unwrap(),
                )
            };
            let winner = first.expect("the first asker wins");
            assert!(second.is_none(), "slot {slot} granted twice");
            assert!(
                winner.fence() > last,
                "fence {} after {last}",
                winner.fence()
            );
            last = winner.fence();
        }
        // The same Redis keys: one lock per slot, one shared counter.
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let fence: u64 = redis::cmd("GET")
            .arg("fence:{guard:once:heartbeat}")
            .query(&mut conn)
            .unwrap();
        assert_eq!(fence, last);
    });
}

#[test]
fn a_lease_expires_for_the_other_side_to_take() {
    let server = RedisServer::start().expect("redis-server");
    smol::block_on(async {
        let (mcu, srv) = lockers(&server, "").await;
        let lease = srv.try_lock("k:lease", ttl(200)).await.unwrap().unwrap();
        assert!(mcu.try_lock("k:lease", ttl(200)).await.unwrap().is_none());
        async_io::Timer::after(Duration::from_millis(300)).await;
        let next = mcu
            .try_lock("k:lease", ttl(200))
            .await
            .unwrap()
            .expect("expired");
        assert!(next.fence() > lease.fence());
        assert_eq!(
            srv.renew("k:lease", &lease, ttl(200)).await.unwrap(),
            Renewal::Lost
        );
    });
}

#[test]
fn server_errors_and_abandoned_requests_are_reported() {
    let server = RedisServer::start().expect("redis-server");
    smol::block_on(async {
        let (mcu, _srv) = lockers(&server, "").await;
        // A lock key that holds a hash: the script's GET fails on the server.
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("HSET")
            .arg("{k}:wrong")
            .arg("f")
            .arg("v")
            .query::<()>(&mut conn)
            .unwrap();
        let token = mcu.try_lock("k:other", ttl(1_000)).await.unwrap().unwrap();
        match mcu.unlock("k:wrong", &token).await {
            Err(UnlockError::Backend(RespError::Server(message))) => {
                assert!(message.contains("WRONGTYPE"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // The connection is still in step after a server error.
        mcu.unlock("k:other", &token).await.unwrap();
        assert!(matches!(
            mcu.try_lock("", ttl(1_000)).await,
            Err(RespError::InvalidKey(InvalidRedisKey::Empty))
        ));

        // A server that never answers: the request is abandoned by a
        // time-out, and the locker refuses to go on out of step.
        let silent = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = silent.local_addr().unwrap().port();
        let mute = RespLocker::<CriticalSectionRawMutex, Socket>::new(socket(port).await, 7);
        assert!(
            abandoned(mute.try_lock("k:x", ttl(1_000))).await,
            "the silent server answered"
        );
        assert!(matches!(
            mute.try_lock("k:x", ttl(1_000)).await,
            Err(RespError::Desynchronized)
        ));
        mute.replace_connection(socket(server.port()).await).await;
        assert!(mute.try_lock("k:x", ttl(1_000)).await.unwrap().is_some());
        drop(silent);
    });
}

/// A connection that, when reset, moves on to a spare socket (as a link
/// that reconnects on next use would).
struct Swappable {
    current: Socket,
    spare: Option<Socket>,
}

impl Swappable {
    fn reset(&mut self) {
        if let Some(spare) = self.spare.take() {
            self.current = spare;
        }
    }
}

impl embedded_io_async::ErrorType for Swappable {
    type Error = std::io::Error;
}

impl embedded_io_async::Read for Swappable {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Self::Error> {
        self.current.read(buf).await
    }
}

impl embedded_io_async::Write for Swappable {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, Self::Error> {
        self.current.write(buf).await
    }

    async fn flush(&mut self) -> Result<(), Self::Error> {
        self.current.flush().await
    }
}

#[test]
fn with_a_reset_hook_the_next_request_resets_an_out_of_step_connection() {
    let server = RedisServer::start().expect("redis-server");
    smol::block_on(async {
        let silent = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let conn = Swappable {
            current: socket(silent.local_addr().unwrap().port()).await,
            spare: Some(socket(server.port()).await),
        };
        let locker = RespLocker::<CriticalSectionRawMutex, Swappable>::new(conn, 9)
            .with_reset(Swappable::reset);
        assert!(
            abandoned(locker.try_lock("k:y", ttl(1_000))).await,
            "the silent server answered"
        );
        // No Desynchronized: the hook moved the locker to a fresh connection.
        let token = locker
            .try_lock("k:y", ttl(1_000))
            .await
            .unwrap()
            .expect("free");
        locker.unlock("k:y", &token).await.unwrap();
        drop(silent);
    });
}

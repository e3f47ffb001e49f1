//! guard-embassy's lockers pass the Locker contract every backend runs,
//! each on one thread with its contenders joined as futures: `RamLocker`
//! on embassy-time (here its std driver), behind a `NoopRawMutex` (not
//! `Sync`: one executor) and a `CriticalSectionRawMutex`; `RespLocker`
//! over one TCP connection to a test redis-server, behind a
//! `NoopRawMutex`.

use std::time::Duration;

use embassy_sync::blocking_mutex::raw::{CriticalSectionRawMutex, NoopRawMutex};
use embedded_io_adapters::futures_03::FromFutures;
use futures_lite::future::block_on;
use guard_embassy::time::duration_to_embassy;
use guard_embassy::{RamLocker, RespLocker};
use guard_testkit::{RedisServer, contract};

/// Waits on embassy-time's clock, which both lockers' expiry follows (the
/// RAM table's directly, Redis's as real time).
fn sleep(d: Duration) -> embassy_time::Timer {
    embassy_time::Timer::after(duration_to_embassy(d))
}

/// Room for every key the suite holds at once, with its namespace.
type Table<M> = RamLocker<M, 16, 48>;

#[test]
fn ram_locker_in_one_executor_passes_the_locker_contract() {
    let locker = Table::<NoopRawMutex>::new();
    block_on(contract::run_all(&locker, "embassy:ram", 50, sleep));
}

#[test]
fn ram_locker_shared_between_executors_passes_the_locker_contract() {
    static LOCKER: Table<CriticalSectionRawMutex> = Table::new();
    block_on(contract::run_all(&LOCKER, "embassy:ram:static", 50, sleep));
}

#[test]
fn resp_locker_over_one_connection_passes_the_locker_contract() {
    let server = RedisServer::start().expect("redis-server");
    smol::block_on(async {
        let stream = async_net::TcpStream::connect(("127.0.0.1", server.port()))
            .await
            .expect("connect");
        let locker = RespLocker::<NoopRawMutex, _>::new(FromFutures::new(stream), 0x5eed_c0de);
        contract::run_all(&locker, "embassy:resp", 20, sleep).await;
    });
}

#[test]
fn resp_locker_grants_a_lost_key_to_nobody_before_its_holder_s_deadline() {
    let server = RedisServer::start().expect("redis-server");
    smol::block_on(async {
        let stream = async_net::TcpStream::connect(("127.0.0.1", server.port()))
            .await
            .expect("connect");
        let locker = RespLocker::<NoopRawMutex, _>::new(FromFutures::new(stream), 0x1057_c0de);
        let lose = |key: &str| {
            let keys = guard_core::lock::redis::RedisKeys::new("", key).unwrap();
            let deleted = server.command(&format!("DEL {}", keys.lock())).unwrap();
            assert!(deleted.starts_with(":1"), "{key}: {deleted}");
            std::future::ready(())
        };
        contract::a_lost_key_is_granted_to_nobody_before_its_deadline(
            &locker,
            "guard:active:sensors",
            lose,
            sleep,
        )
        .await;
        // The default buffer holds the longest request: a key of the
        // longest a guard key may be, under the longest prefix.
        let stream = async_net::TcpStream::connect(("127.0.0.1", server.port()))
            .await
            .expect("connect");
        let longest = RespLocker::<NoopRawMutex, _>::new(FromFutures::new(stream), 0x10c4)
            .with_prefix(&"p".repeat(guard_embassy::MAX_PREFIX - 1))
            .unwrap();
        let key = format!(
            "{}:{}",
            "d".repeat(200),
            "s".repeat(guard_core::lock::MAX_KEY_LEN - 201)
        );
        assert_eq!(key.len(), guard_core::lock::MAX_KEY_LEN);
        let ttl = guard_core::lock::Ttl::from_secs(5).unwrap();
        let token = guard_core::lock::Locker::try_lock(&longest, &key, ttl)
            .await
            .expect("the longest request fits the default buffer")
            .expect("granted");
        guard_core::lock::LeaseRenewer::renew(&longest, &key, &token, ttl)
            .await
            .unwrap();
        guard_core::lock::Locker::unlock(&longest, &key, &token)
            .await
            .unwrap();
    });
}

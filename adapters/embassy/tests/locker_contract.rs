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

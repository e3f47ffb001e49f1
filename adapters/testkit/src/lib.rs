//! guard-testkit: what guard's own tests share, as a development
//! dependency only (not published).
//!
//! - [`contract`]: the `Locker` contract suite every backend runs,
//!   [`claims`]: the `ClaimStore` contract suite, and [`semaphore`]: the
//!   `Semaphore` contract suite;
//! - [`sources`]: the elected-source contract suite every elected source
//!   runs against its real server;
//! - [`RedisServer`], [`RedisCluster`], [`RedisSentinel`]: real
//!   `redis-server` processes, and [`Mosquitto`]: a real broker, each on a
//!   free 127.0.0.1 port with its own temporary directory, stopped by PID
//!   when dropped (also when a test panics);
//! - [`nats::NatsServer`], [`mariadb::MariaDb`] (rows logged to its
//!   binlog), [`postgres`] (a database unique to the test, or a private
//!   server) and [`rabbitmq`] (a virtual host unique to the test, or a
//!   private node): the other sources' servers, the same way;
//! - [`etcd::EtcdCluster`]: an etcd cluster of N members, whose members
//!   a test kills, restarts, pauses and resumes;
//! - [`TestCerts`]: a CA and the server and client certificates it
//!   signed, made by the test, for the servers' TLS listeners
//!   (`RedisServer::start_tls`, `RedisCluster::start_tls`,
//!   `RedisSentinel::start_tls`, `Mosquitto::start_tls`);
//! - [`finish_order`]: concurrent waiters started in a known order, and
//!   the order their waits ended in (the tests of waiting limiters);
//! - [`free_port`], [`wait_until`], [`binary`]: helpers for any other
//!   server a test starts (a missing binary names its Debian package).
//!
//! ```no_run
//! let server = guard_testkit::RedisServer::start()?;
//! println!("redis at {}", server.url());
//! # Ok::<(), guard_testkit::HarnessError>(())
//! ```

pub mod claims;
pub mod contract;
pub mod etcd;
mod faulty;
pub mod http;
mod http_receiver;
pub mod mariadb;
mod mosquitto;
pub mod nats;
pub mod postgres;
mod process;
pub mod rabbitmq;
mod redis;
pub mod semaphore;
pub mod sinks;
pub mod sources;
mod spans;
mod tls;
mod waiters;

pub use faulty::{FaultyLocker, RenewFault};
pub use http_receiver::{Answer, HttpReceiver, Received};
pub use mosquitto::Mosquitto;
pub use process::{
    HarnessError, KillOnDrop, binary, find_binary, free_port, holds_within, thread_names,
    wait_until,
};
pub use redis::{RedisCluster, RedisSentinel, RedisServer, SENTINEL_SERVICE};
pub use spans::{ClosedSpan, LoggedEvent, SpanLog};
pub use tls::TestCerts;
pub use waiters::{Finished, finish_order};

/// What a contract suite's failure says: the message `run` panicked
/// with. Panics itself if `run` passed, saying `what` was expected to
/// fail. How each suite is shown to catch an implementation that breaks
/// one of its rules.
pub fn broken_rule(what: &str, run: impl FnOnce()) -> String {
    let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) else {
        panic!("the suite passed {what}");
    };
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

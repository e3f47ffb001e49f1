//! guard-redis: Redis backends for guard, on the `redis` crate (a seam:
//! storage and scripts, no runtime policy; the sources built on it live in
//! guard-endpoints).
//!
//! - [`RedisLocker`]: `Locker` + `LeaseRenewer` with fencing: one script
//!   takes the lock (`SET NX PX`) and increments a fence counter in the
//!   same hash slot; unlock is compare-and-delete, renew
//!   compare-and-`PEXPIRE`. It is also a `ClaimStore` (guard-core's
//!   `claim`: done at most once, retried until done), one script a call,
//!   the record beside the lock layout, and a `Semaphore` (guard-core's
//!   `semaphore`: at most N holders of a key), a hash of lease ends.
//! - [`RedisBreaker`]: a circuit breaker shared by replicas, deciding as
//!   guard-core's breaker over one snapshot key.
//! - [`RedisTokenBucket`], [`RedisLeakyBucket`], [`RedisSlidingWindow`]:
//!   one script per decision, deciding exactly as guard-core's limiters.
//! - [`RedisSetDeduplicator`], [`RedisWindowedDeduplicator`],
//!   [`RedisBloomDeduplicator`]: `check_and_mark` atomic across processes.
//! - [`StreamDlq`]: a persistent dead-letter queue per topic on Redis
//!   Streams, with listing, replay (idempotent), delete, purge, retention.
//! - [`RedisConnection`]: standalone, sentinel or cluster, every request
//!   bounded by a timeout the caller sets; with the `tls` feature,
//!   `rediss://` for each of them, and `RedisTls` for a private CA or a
//!   client certificate (off by default: no TLS stack unless asked for).
//! - [`RedisGuardError`]: what fails, typed: a refused key or parameter
//!   names its [`Parameter`], the value and the rule, and keeps the check
//!   that refused it (guard-core's) as its `source()`.
//!
//! ```no_run
//! # smol::block_on(async {
//! use std::time::Duration;
//! use guard_redis::{RedisConnection, RedisLocker, Topology};
//! use guard_std::{GuardConfig, SharedLocker};
//!
//! let conn = RedisConnection::connect(
//!     Topology::Standalone { url: "redis://127.0.0.1:6379/".into() },
//!     Duration::from_millis(500),
//! ).await?;
//! let config = GuardConfig::new().with_locker(SharedLocker::new(RedisLocker::new(conn)));
//! # Ok::<(), guard_redis::RedisGuardError>(())
//! # });
//! ```
// docs.rs (nightly, `--cfg docsrs`) marks each feature-gated item with
// the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod breaker;
mod connection;
mod dedup;
mod direct;
mod error;
mod limit;
mod locker;
mod sentinel;
mod stream_dlq;
#[cfg(feature = "tls")]
mod tls;

pub use breaker::{MAX_SWAPS, RedisBreaker};
pub use connection::{RedisConnection, STANDALONE_CONNECTIONS, Topology};
pub use dedup::{
    BACKSTOP_MARGIN, RedisBloomDeduplicator, RedisSetDeduplicator, RedisWindowedDeduplicator,
};
pub use direct::DIRECT_CONNECTIONS;
pub use error::{Parameter, RedisGuardError};
pub use limit::{
    BANDWIDTHS_PREFIX, CALLER_OFFSET_BOUND, CALLER_RATE_BOUND_PPM, Clock, FIXED_WINDOW_PREFIX,
    LEAKY_BUCKET_PREFIX, RedisBandwidths, RedisBatchedBucket, RedisBucket, RedisFixedWindow,
    RedisLeakyBucket, RedisSlidingWindow, RedisTokenBucket, SLIDING_WINDOW_PREFIX,
    TOKEN_BUCKET_PREFIX, Taken,
};
pub use locker::{RedisLocker, lock_keys};
pub use stream_dlq::{
    DEFAULT_REPLAY_LEASE, DEFAULT_REPLAY_MARKER_RETENTION, DEFAULT_STREAM_PREFIX, DeadLetter,
    DeadLetterEntry, ReplayOutcome, Retention, StreamDlq,
};
#[cfg(feature = "tls")]
pub use tls::RedisTls;

/// The `redis` crate guard-redis is built on: build the commands
/// [`RedisConnection::query`] takes from here (`guard_redis::redis::cmd`),
/// so they are always of the same version.
pub use redis;

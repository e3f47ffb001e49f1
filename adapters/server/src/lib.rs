//! guard-server: one dependency for a tokio service on guard.
//!
//! It names guard's crates for a server, each under its own name, with
//! the features a tokio application needs turned on (guard-redis's
//! connections run on the caller's tokio runtime, not on a second
//! reactor), and a [`prelude`] of what a service uses most:
//!
//! | feature | crate | what |
//! |---|---|---|
//! | (always) | [`guard_core`] | claims, once-guards, the lease state machine, limiters, retry |
//! | (always) | [`guard_std`] | `GuardConfig`, `SharedLocker`, `LocalLocker`, the in-memory limiters |
//! | (always) | [`guard_tokio`] | `ActiveRunner`, `Scheduler`, `LockWatchdog`, `WaitingLimiter` on tokio |
//! | `redis` (default) | `guard_redis` | `RedisLocker` (locker and claim store), limiters, deduplicators, stream DLQ; the `redis` crate itself as `guard_redis::redis` |
//! | `tower` (default) | `guard_tower` | `RateLimitLayer`: 429 with `Retry-After` and `RateLimit` fields |
//! | `postgres` | `guard_postgres` | `PgLocker`: a linearizable locker and claim store |
//! | `etcd` | `guard_etcd` | `EtcdLocker`: a linearizable locker and claim store (needs `protoc`) |
//!
//! ```toml
//! [dependencies]
//! guard-server = "0.1"                                   # Redis and the tower layer
//! guard-server = { version = "0.1", features = ["postgres"] }
//! ```
//!
//! ```
//! use guard_server::prelude::*;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // In one process; across replicas, a RedisLocker (or PgLocker, EtcdLocker).
//! let store = LocalLocker::new();
//! let claims = Claims::new(&store, Scope::new("webhooks")?);
//! let mut stored = [0u8; 64];
//! if let ClaimOutcome::Run(claim) = claims.begin("evt_1", &mut stored).await? {
//!     // the work, under claim.fence()
//!     claims.complete(&claim, b"done").await?;
//! }
//! # Ok(())
//! # }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use guard_core;
pub use guard_std;
pub use guard_tokio;

#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use guard_etcd;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use guard_postgres;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use guard_redis;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub use guard_tower;

/// What a service uses most, in one import.
pub mod prelude {
    pub use guard_core::breaker::{BreakerConfig, CircuitBreaker, CountWindow, TimeWindow};
    pub use guard_core::claim::{
        Claim, ClaimError, ClaimOutcome, ClaimStore, Claims, Settled, Start,
    };
    pub use guard_core::guard::{ActiveConfig, FailPolicy, OnceGuard, OnceOutcome};
    pub use guard_core::limit::batch::BatchSize;
    pub use guard_core::limit::{Bandwidths, FullPolicy, Rate, SlidingWindow, TokenBucket};
    pub use guard_core::lock::{LeaseRenewer, Locker, Scope, Token, Ttl};
    pub use guard_core::retry::{RetryAfter, RetryBudget, RetryPolicy};
    pub use guard_core::semaphore::{PermitLock, Permits, Semaphore};
    pub use guard_std::ratelimit::{MemoryLimiter, RateLimiter};
    pub use guard_std::{GuardConfig, LocalLocker, SharedLocker};
    pub use guard_tokio::{ActiveRunner, LockWatchdog, Scheduler, Tokio, control};

    #[cfg(feature = "etcd")]
    #[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
    pub use guard_etcd::{EtcdConfig, EtcdLocker};
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub use guard_postgres::PgLocker;
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub use guard_redis::{
        RedisBandwidths, RedisBatchedBucket, RedisBreaker, RedisConnection, RedisLocker,
        RedisSlidingWindow, RedisTokenBucket, Topology, redis,
    };
    #[cfg(feature = "tower")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
    pub use guard_tower::{
        BulkheadLayer, CircuitBreakerLayer, ClientIp, HeaderKey, RateLimitLayer,
    };
}

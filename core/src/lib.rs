//! guard-core: the `no_std`, allocation-free algorithms of guard.
//!
//! Everything here is a plain value with the time passed in: rate limiters
//! (token bucket, meter-style leaky bucket, sliding-window log, a bounded
//! keyed table and a lock-free shared token bucket), retry policies and
//! executors, failure handling, a bounded dead-letter queue,
//! deduplicators and the framing of an append-only log's records. Nothing reads a clock, allocates, or panics on any input;
//! runtimes (std, smol, embassy) supply time, IO and storage.
//!
//! ```
//! use core::time::Duration;
//! use guard_core::limit::{Limiter, Rate, TokenBucket};
//! use guard_core::time::Instant;
//!
//! // Bursts of 10, refilled at 5 per second.
//! let bucket = TokenBucket::new(10, Rate::per(5, Duration::from_secs(1)))?;
//! let mut limiter = Limiter::new(bucket);
//! let t0 = Instant::from_millis(1_000);
//! for _ in 0..10 {
//!     assert!(limiter.check(t0).is_allowed());
//! }
//! // The eleventh call is denied and says when the next token arrives.
//! let denied = limiter.check(t0);
//! assert_eq!(denied.retry_after(), Some(Duration::from_millis(200)));
//! assert!(limiter.check(t0 + Duration::from_millis(200)).is_allowed());
//! # Ok::<(), guard_core::limit::LimiterError>(())
//! ```
// docs.rs (nightly, `--cfg docsrs`) marks each feature-gated item with
// the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// `arbitrary` links std (its derive names it): a host-only feature.
#![cfg_attr(not(any(test, guard_loom, feature = "arbitrary")), no_std)]
// Panic freedom of the library code is checked by clippy (tests may panic).
#![cfg_attr(
    not(test),
    warn(
        clippy::arithmetic_side_effects,
        clippy::cast_possible_truncation,
        clippy::indexing_slicing,
        clippy::panic,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::float_arithmetic
    )
)]

pub mod breaker;
#[cfg(any(target_has_atomic = "ptr", feature = "critical-section"))]
pub mod bulkhead;
pub mod claim;
pub mod dedup;
pub mod dlq;
pub mod failure;
pub mod frame;
#[cfg(feature = "arbitrary")]
pub mod fuzz;
pub mod guard;
pub mod key;
pub mod limit;
pub mod lock;
pub mod retry;
pub mod semaphore;
pub mod slot;
pub mod sync;
mod table;
pub mod time;

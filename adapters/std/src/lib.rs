//! guard-std: what guard needs on an operating system.
//!
//! - [`LocalLocker`]: an in-process [`Locker`](guard_core::lock::Locker) and
//!   lease renewer with fencing, for one process or for tests;
//! - [`SharedLocker`] and [`GuardConfig`]: one locker injected everywhere
//!   (the original's `WithLocker` / `WithOwner`), renewal detected as a
//!   capability rather than assumed;
//! - [`CronSchedule`]: cron expressions with a seconds field, in UTC;
//! - [`Clock`]: monotonic and wall-clock time for guard-core;
//! - [`disk_queue`]: a queue on disk, bounded in bytes, that survives a
//!   crash and cuts a torn tail: store-and-forward in front of a sink;
//! - [`dead_letter_log`]: dead letters on disk, listed, removed and
//!   purged by another process while one appends;
//! - [`run`]: the runners (active guard, scheduler, waiting limiter) on
//!   any async runtime, named for theirs by guard-smol and guard-tokio.
//!
//! It supplies time and storage; the algorithms are guard-core's.
//!
//! ```
//! # futures_lite::future::block_on(async {
//! use guard_core::guard::OnceGuard;
//! use guard_core::lock::Scope;
//! use guard_std::LocalLocker;
//!
//! let locker = LocalLocker::new();
//! let scope = Scope::new("consumer")?.segment("owner", "tenant1")?;
//! let guard = OnceGuard::new(Some(&locker), scope);
//! assert!(guard.allow("msg-1").await?.is_allowed());
//! assert!(!guard.allow("msg-1").await?.is_allowed(), "a second delivery is skipped");
//! # Ok::<(), guard_core::lock::KeyError>(())
//! # }).unwrap();
//! ```
// docs.rs (nightly, `--cfg docsrs`) marks each feature-gated item with
// the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod clock;
mod cron_schedule;
pub mod dead_letter_log;
pub mod disk_queue;
mod last_fence;
mod local_locker;
pub mod metered;
pub mod metrics;
pub mod observe;
mod private_files;
pub mod ratelimit;
pub mod redact;
pub mod run;
mod shared;
mod sync;
mod throttle;
mod token_ids;

pub use clock::{Clock, EpochClock, ManualClock, QuantaClock, SystemClock};
pub use cron_schedule::{CronError, CronSchedule};
pub use last_fence::LastFence;
pub use local_locker::{DEFAULT_SWEEP_INTERVAL, LocalLocker};
#[doc(hidden)]
pub use shared::backend_error;
pub use shared::{BackendError, BoxFuture, DynLocker, GuardConfig, LockerError, SharedLocker};
pub use throttle::{THROTTLE_INTERVAL, Throttle};
pub use token_ids::TokenIds;

//! guard-sim: a deterministic simulator of many replicas running guard's
//! guards against one lock service, under clock skew and drift, message
//! loss and duplication, partitions, crashes, stop-the-world pauses,
//! lock-service failover with lost writes and lock-service restarts that
//! lose everything.
//!
//! Each replica runs guard-core's own [`ActiveGuard`](guard_core::guard::ActiveGuard)
//! (driven through its sans-IO interface), [`OnceGuard`](guard_core::guard::OnceGuard)
//! per schedule slot (its `allow` future polled against a simulated
//! locker), [`SlotTimer`](guard_core::slot::SlotTimer) on its own wall
//! clock and a sliding-window limiter on its own monotonic clock. Clocks
//! (the replicas' and the lock-service nodes') are disciplined as NTP
//! keeps real ones: bounded offsets, wall clocks stepped both ways at each
//! correction, monotonic clocks that only slew; free-drifting clocks are a
//! fault. The lock service derives fences from its own wall clock. Time is
//! virtual and event-driven: the world jumps to the next deadline. One
//! `u64` seed decides every random choice, so a seed replays a run exactly
//! (same event-log hash).
//!
//! ```
//! use core::time::Duration;
//! use guard_sim::{Scenario, World};
//!
//! let scenario = Scenario::LongPause;
//! let config = scenario.config(7, 3, Duration::from_secs(40));
//! let (report, _timeline) = World::new(config)?.run(|_| {});
//! assert!(scenario.check(&report).is_ok(), "{report}");
//! assert!(report.rejected_stale > 0); // the woken leader's write was fenced off
//! # Ok::<(), String>(())
//! ```
//!
//! Your own code can run in the world too: a [`handler::Handler`] on each
//! replica, its side effects checked at the resource for stale fences and
//! duplicates ([`World::with_handler`]).
//!
//! Invariants checked as it runs or at the end: at most one run per slot
//! (missed slots counted); a lock service that grants one live lease per
//! key; with fencing on, no stale side effect accepted and fences that
//! never repeat nor go backwards (through failovers and restarts); clocks
//! within their bound; after a leader crash a standby leads within ttl +
//! interval + a round trip; no limiter admits more than its limit per
//! window.

pub mod clock;
pub mod config;
pub mod handler;
pub mod locker;
pub mod report;
pub mod resource;
pub mod rng;
pub mod scenario;
pub mod server;
pub mod svg;
pub mod world;

pub use clock::{Clock, ClockSync};
pub use config::{Fault, FenceRule, LimiterConfig, SlotConfig, Target, WorldConfig};
pub use report::{Report, Timeline};
pub use scenario::Scenario;
pub use world::World;

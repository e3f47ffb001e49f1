//! At-most-once execution across replicas.
//!
//! - [`OnceGuard`]: one winner per delivery key (a message id, a planned
//!   schedule slot): the first replica to claim the key runs the action,
//!   the others skip, for as long as the key is retained.
//! - [`ActiveGuard`]: one active consumer per scope by lease, with
//!   automatic takeover; a sans-IO state machine that a runtime drives.
//!
//! Rule of thumb (from the original): if the source already delivers each
//! message to one replica (Kafka or Redis Streams consumer groups, MQTT
//! shared subscriptions, load-balanced requests), add no guard: it would
//! turn legitimate redeliveries into losses.

mod active;
mod lease;
mod once;
mod watchdog;

pub use active::{
    Acquired, Action, ActiveConfig, ActiveConfigError, ActiveGuard, ActiveTiming,
    DEFAULT_ACTIVE_TTL, DemoteReason, Done, Phase, Renewed,
};
pub use lease::{Lease, SharedLease};
pub use once::{DEFAULT_ONCE_TTL, FailPolicy, OnceEvent, OnceGuard, OnceObserver, OnceOutcome};
pub use watchdog::{HoldLost, Watchdog};

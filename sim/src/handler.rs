//! Your own code in the simulated world: a [`Handler`] runs on every
//! replica beside guard's guards, and its side effects go to the world's
//! protected resource, which checks each one.
//!
//! - Work done while leading ([`Handler::lead`], every `work_period` while
//!   the replica's `ActiveGuard` says it leads) carries the leader's fence:
//!   the resource refuses a fence below the newest it accepted (with
//!   `fencing` on) and counts the stale ones, exactly as for the built-in
//!   leader's writes.
//! - Work done for a slot ([`Handler::slot`], when the replica's
//!   `OnceGuard` allowed the slot) carries the slot claim's fence.
//!
//! Every [`Effect`] names what it does with an identity (an invoice
//! number, a slot, an order id); the resource counts an identity it
//! accepted twice as a duplicate ([`Report::user_duplicates`]), and lists
//! the first ones ([`Report::user_duplicate_ids`]). A handler's state
//! lives as long as its replica's process: a crashed replica restarts
//! with a new handler from the factory given to
//! [`World::with_handler`](crate::World::with_handler).
//!
//! ```
//! use core::time::Duration;
//! use guard_sim::handler::{Effect, Handler, LeaderWork, SlotWork};
//! use guard_sim::{Scenario, World};
//!
//! /// Charges the slot's invoice once per slot.
//! struct Billing;
//!
//! impl Handler for Billing {
//!     fn lead(&mut self, _work: &LeaderWork) -> Vec<Effect> {
//!         Vec::new()
//!     }
//!     fn slot(&mut self, work: &SlotWork) -> Vec<Effect> {
//!         vec![Effect(work.slot_ms)]
//!     }
//! }
//!
//! let config = Scenario::SkewBelow.config(3, 3, Duration::from_secs(60));
//! let (report, _) = World::new(config)?.with_handler(|_replica| Box::new(Billing)).run(|_| {});
//! assert!(report.user_effects > 0);
//! assert_eq!(report.user_duplicates, 0, "{:?}", report.user_duplicate_ids);
//! # Ok::<(), String>(())
//! ```
//!
//! [`Report::user_duplicates`]: crate::Report::user_duplicates
//! [`Report::user_duplicate_ids`]: crate::Report::user_duplicate_ids

use guard_core::slot::UnixMillis;
use guard_core::time::Instant;

/// A side effect of a handler, by its identity: the same number accepted
/// twice is a duplicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Effect(pub u64);

/// What a leader's handler call is told.
#[derive(Clone, Copy, Debug)]
pub struct LeaderWork {
    /// The replica (0-based).
    pub replica: usize,
    /// The lease's fence, sent with every effect of this call.
    pub fence: u64,
    /// The replica's monotonic clock.
    pub local: Instant,
    /// The replica's wall clock (skewed and stepped as the world's clocks
    /// are).
    pub wall: UnixMillis,
}

/// What a slot's handler call is told.
#[derive(Clone, Copy, Debug)]
pub struct SlotWork {
    /// The replica (0-based).
    pub replica: usize,
    /// The slot, Unix milliseconds (the same on every replica).
    pub slot_ms: u64,
    /// The slot claim's fence, when the lock service gave one.
    pub fence: Option<u64>,
}

/// User code run by each simulated replica. Both calls return the side
/// effects they make; each reaches the resource over the world's
/// latency.
pub trait Handler {
    /// Called every `work_period` while this replica leads.
    fn lead(&mut self, work: &LeaderWork) -> Vec<Effect>;

    /// Called when this replica's `OnceGuard` allowed a slot.
    fn slot(&mut self, work: &SlotWork) -> Vec<Effect>;
}

/// Makes a replica's handler: called at start and again after each
/// crash, with the replica's index.
pub type HandlerFactory = Box<dyn FnMut(usize) -> Box<dyn Handler>>;

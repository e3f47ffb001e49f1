//! Fuzzing your own code with guard's guards (feature `arbitrary`).
//!
//! - [`arbitrary::Arbitrary`] for guard's configuration values
//!   ([`ActiveConfig`](crate::guard::ActiveConfig),
//!   [`RetryPolicy`](crate::retry::RetryPolicy), [`Rate`](crate::limit::Rate),
//!   [`Ttl`](crate::lock::Ttl), [`Every`](crate::slot::Every), ...) and for
//!   the state machines' inputs ([`Done`](crate::guard::Done),
//!   [`Token`](crate::lock::Token), [`Instant`](crate::time::Instant), ...),
//!   so a fuzz target can take them as input.
//! - [`LeaderHarness`]: your [`LeaderHandler`] driven by a real
//!   [`ActiveGuard`](crate::guard::ActiveGuard) against a simulated lock
//!   service (a lease with expiry and fences, a rival replica, failures,
//!   a failover that forgets the lease) along fuzzer-chosen
//!   [`LeaderStep`]s, with guard's promises checked after every step.
//! - [`SlotHarness`]: your [`SlotHandler`] run by two replicas with skewed
//!   clocks through [`OnceGuard`](crate::guard::OnceGuard) on a simulated
//!   locker, along fuzzer-chosen [`SlotStep`]s: each slot at most once.
//!
//! A harness returns a [`Violation`] when guard broke a promise to your
//! handler; your own checks (inside the handler) panic as usual, so the
//! fuzzer reports both. A target, as in `fuzz/fuzz_targets/user_handler.rs`:
//!
//! ```
//! use guard_core::fuzz::{LeaderHandler, LeaderHarness, LeaderStep, Work};
//! use guard_core::guard::{ActiveConfig, DemoteReason};
//!
//! /// The user's code: a counter only the leader may advance.
//! #[derive(Default)]
//! struct Counter {
//!     leading: Option<u64>,
//!     applied: u32,
//! }
//!
//! impl LeaderHandler for Counter {
//!     fn promoted(&mut self, fence: u64) {
//!         self.leading = Some(fence);
//!     }
//!     fn demoted(&mut self, _reason: DemoteReason) {
//!         self.leading = None;
//!     }
//!     fn work(&mut self, work: Work) -> bool {
//!         assert!(self.leading.is_some_and(|f| work.fence >= f), "work while not leading");
//!         self.applied += 1;
//!         true
//!     }
//! }
//!
//! // In a fuzz target: `fuzz_target!(|steps: Vec<LeaderStep>| { ... })`.
//! let steps = [LeaderStep::Wait(1), LeaderStep::Answer, LeaderStep::Work, LeaderStep::Wait(255)];
//! let mut counter = Counter::default();
//! let report = LeaderHarness::new(ActiveConfig::new(), true)
//!     .expect("the default timing is valid")
//!     .run(&steps, &mut counter)
//!     .expect("guard kept its promises");
//! assert_eq!((report.promotions, counter.applied), (1, 1));
//! ```

/// The `arbitrary` crate guard implements it with (the same version a fuzz
/// target must use).
pub use arbitrary;

mod arbitrary_impls;
mod leader;
mod slots;

pub use leader::{LeaderHandler, LeaderHarness, LeaderReport, LeaderStep, Work};
pub use slots::{SlotHandler, SlotHarness, SlotReport, SlotSetup, SlotStep};

use core::fmt;

use arbitrary::{Arbitrary, Unstructured};

/// Every element `u` still holds, to its end: a run's steps. (A plain
/// `Vec` stops at the first "no more" byte, two elements on average,
/// which makes long runs rare.)
pub fn steps<'a, T: Arbitrary<'a>>(u: &mut Unstructured<'a>) -> Vec<T> {
    let mut steps = Vec::new();
    while !u.is_empty() {
        match T::arbitrary(u) {
            Ok(step) => steps.push(step),
            Err(_) => break,
        }
    }
    steps
}

/// A promise guard broke to the handler, found by a harness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Work was handed over while the lock service held the lease for
    /// someone else (or for no one) and had not lost it in a failover.
    WorkWithoutLease {
        /// The step at which it happened.
        step: usize,
        /// The fence the work carried.
        fence: u64,
    },
    /// Work was handed over outside a `Promote` .. `Demote` interval.
    WorkWhileNotPromoted {
        /// The step.
        step: usize,
    },
    /// A promotion's fence was not above every earlier one.
    FenceNotIncreasing {
        /// The step.
        step: usize,
        /// The earlier fence.
        before: u64,
        /// The new one.
        after: u64,
    },
    /// A `Promote` while promoted, or a `Demote` while not.
    Unpaired {
        /// The step.
        step: usize,
    },
    /// A slot ran twice with replica clocks closer than the slot key's
    /// retention.
    SlotTwice {
        /// The step.
        step: usize,
        /// The slot, Unix milliseconds.
        slot_ms: u64,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::WorkWithoutLease { step, fence } => write!(
                f,
                "step {step}: work with fence {fence} while the lock service held no lease for it"
            ),
            Violation::WorkWhileNotPromoted { step } => {
                write!(f, "step {step}: work handed over while not promoted")
            }
            Violation::FenceNotIncreasing {
                step,
                before,
                after,
            } => write!(
                f,
                "step {step}: promoted with fence {after}, not above the earlier {before}"
            ),
            Violation::Unpaired { step } => {
                write!(
                    f,
                    "step {step}: a promote while promoted or a demote while not"
                )
            }
            Violation::SlotTwice { step, slot_ms } => {
                write!(f, "step {step}: slot {slot_ms} ran twice")
            }
        }
    }
}

impl core::error::Error for Violation {}

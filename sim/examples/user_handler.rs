//! Your own handler in guard-sim's world: two billing handlers, run on
//! three replicas through leader crashes, with the resource checking every
//! charge for duplicates and stale fences.
//!
//! - `MemoryBilling` charges invoices while leading, numbering them from a
//!   counter in its own memory: a new leader starts again from its own
//!   count, so invoices are charged twice after a takeover (the checker
//!   lists them).
//! - `SlotBilling` charges one invoice per slot, the slot allowed once by
//!   guard's `OnceGuard`: no duplicate.
//!
//! `cargo run -p guard-sim --example user_handler [SEED]`

use core::time::Duration;

use guard_sim::handler::{Effect, Handler, LeaderWork, SlotWork};
use guard_sim::{Scenario, World};

/// Charges the next invoice of its own count on every leader tick.
struct MemoryBilling {
    next_invoice: u64,
}

impl Handler for MemoryBilling {
    fn lead(&mut self, _work: &LeaderWork) -> Vec<Effect> {
        self.next_invoice += 1;
        vec![Effect(self.next_invoice)]
    }

    fn slot(&mut self, _work: &SlotWork) -> Vec<Effect> {
        Vec::new()
    }
}

/// Charges the invoice of each slot, once the slot is allowed.
struct SlotBilling;

impl Handler for SlotBilling {
    fn lead(&mut self, _work: &LeaderWork) -> Vec<Effect> {
        Vec::new()
    }

    fn slot(&mut self, work: &SlotWork) -> Vec<Effect> {
        vec![Effect(work.slot_ms)]
    }
}

fn main() -> Result<(), String> {
    let seed = std::env::args()
        .nth(1)
        .map(|s| s.parse::<u64>().map_err(|e| format!("seed {s:?}: {e}")))
        .transpose()?
        .unwrap_or(1);
    let scenario = Scenario::CrashLoop;
    let run = |handler: fn(usize) -> Box<dyn Handler>| -> Result<_, String> {
        let config = scenario.config(seed, 3, Duration::from_secs(600));
        Ok(World::new(config)?.with_handler(handler).run(|_| {}).0)
    };
    let memory = run(|_| Box::new(MemoryBilling { next_invoice: 0 }))?;
    println!(
        "MemoryBilling: {} charges, {} duplicates (first: {:?})",
        memory.user_effects, memory.user_duplicates, memory.user_duplicate_ids
    );
    let slots = run(|_| Box::new(SlotBilling))?;
    println!(
        "SlotBilling:   {} charges, {} duplicates",
        slots.user_effects, slots.user_duplicates
    );
    Ok(())
}

//! A user's handler in the simulated world: its side effects are checked
//! at the resource for duplicates and stale fences, so a handler bug that
//! only shows across a takeover is found, and one built on guard's guards
//! passes.

use core::time::Duration;

use guard_sim::handler::{Effect, Handler, LeaderWork, SlotWork};
use guard_sim::{Scenario, World};

/// Numbers its charges from a counter in memory: a new leader counts
/// again from its own number.
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

/// One charge per allowed slot.
struct SlotBilling;

impl Handler for SlotBilling {
    fn lead(&mut self, _work: &LeaderWork) -> Vec<Effect> {
        Vec::new()
    }

    fn slot(&mut self, work: &SlotWork) -> Vec<Effect> {
        vec![Effect(work.slot_ms)]
    }
}

/// Charges an identity no other replica or call uses: never a duplicate,
/// so only the fence check can refuse one.
struct UniqueCharges {
    replica: u64,
    calls: u64,
}

impl Handler for UniqueCharges {
    fn lead(&mut self, work: &LeaderWork) -> Vec<Effect> {
        self.calls += 1;
        let _ = work.fence;
        vec![Effect((self.replica << 40) | self.calls)]
    }

    fn slot(&mut self, _work: &SlotWork) -> Vec<Effect> {
        Vec::new()
    }
}

fn run(
    scenario: Scenario,
    seed: u64,
    handler: impl FnMut(usize) -> Box<dyn Handler> + 'static,
) -> guard_sim::Report {
    let config = scenario.config(seed, 3, Duration::from_secs(600));
    let (report, _) = World::new(config)
        .unwrap()
        .with_handler(handler)
        .run(|_| {});
    report
}

#[test]
fn a_handler_that_counts_in_memory_is_caught_charging_twice_after_a_takeover() {
    let report = run(Scenario::CrashLoop, 1, |_| {
        Box::new(MemoryBilling { next_invoice: 0 })
    });
    assert!(report.promotions > 1, "no takeover happened:\n{report}");
    assert!(
        report.user_duplicates > 0,
        "the duplicate charges went unseen:\n{report}"
    );
    assert!(!report.user_duplicate_ids.is_empty());
}

#[test]
fn a_handler_on_slots_charges_each_slot_once_through_crashes_and_skew() {
    for scenario in [Scenario::CrashLoop, Scenario::SkewBelow] {
        for seed in 1..=3 {
            let report = run(scenario, seed, |_| Box::new(SlotBilling));
            assert!(
                report.user_effects > 50,
                "{scenario:?} seed {seed}:\n{report}"
            );
            assert_eq!(
                report.user_duplicates, 0,
                "{scenario:?} seed {seed}: {:?}\n{report}",
                report.user_duplicate_ids
            );
            assert_eq!(report.user_effects, report.slot_runs);
        }
    }
}

#[test]
fn a_woken_leader_s_handler_effects_are_refused_by_their_fence() {
    let report = run(Scenario::LongPause, 7, |r| {
        Box::new(UniqueCharges {
            replica: r as u64,
            calls: 0,
        })
    });
    assert!(report.user_effects > 0, "{report}");
    assert!(
        report.user_rejected_stale > 0,
        "the stale leader's charges were not refused:\n{report}"
    );
    assert_eq!(report.user_accepted_stale, 0);
    assert_eq!(report.user_duplicates, 0);
}

#[test]
fn a_world_without_a_handler_reports_no_user_effects_and_runs_as_before() {
    let config = Scenario::LongPause.config(7, 3, Duration::from_secs(40));
    let (plain, _) = World::new(config.clone()).unwrap().run(|_| {});
    let (with, _) = World::new(config)
        .unwrap()
        .with_handler(|_| Box::new(SlotBilling))
        .run(|_| {});
    assert_eq!(plain.user_effects, 0);
    // The handler adds events but changes no guard decision.
    assert_eq!(plain.promotions, with.promotions);
    assert_eq!(plain.slot_runs, with.slot_runs);
    assert_eq!(plain.rejected_stale, with.rejected_stale);
}

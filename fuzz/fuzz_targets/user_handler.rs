//! An example for guard's users: fuzzing your own handler as guard drives
//! it. `Billing` is application code (an elected consumer that charges
//! while leading, and a job that closes each slot's books); the fuzzer
//! picks the lease timing, the slot setup and every event (time, locker
//! answers and failures, a rival, failovers, demotions, wake-ups), and
//! `guard_core::fuzz`'s harnesses drive `ActiveGuard` and `OnceGuard`
//! against a simulated locker. A broken promise of guard comes back as a
//! `Violation`; the handler's own assertions check the application's.
#![no_main]

use guard_core::fuzz::{
    LeaderHandler, LeaderHarness, LeaderStep, SlotHandler, SlotHarness, SlotSetup, SlotStep, Work,
};
use guard_core::guard::{ActiveConfig, DemoteReason};
use libfuzzer_sys::fuzz_target;

/// The application: charges only while leading, with the lease's fence,
/// and closes each slot's books once.
#[derive(Default)]
struct Billing {
    leading: Option<u64>,
    charged: u64,
    closed: Vec<u64>,
}

impl LeaderHandler for Billing {
    fn promoted(&mut self, fence: u64) {
        assert!(self.leading.is_none(), "promoted twice");
        self.leading = Some(fence);
    }

    fn demoted(&mut self, _reason: DemoteReason) {
        assert!(self.leading.take().is_some(), "demoted while not leading");
    }

    fn work(&mut self, work: Work) -> bool {
        // The promotion's fence, or a higher one where the locker cannot
        // renew and the leader acquires again each interval.
        let promoted = self.leading.expect("charged while not leading");
        assert!(work.fence >= promoted, "charged under an older fence");
        assert!(work.now < work.until, "charged past the renew deadline");
        self.charged += 1;
        true
    }
}

impl SlotHandler for Billing {
    fn run(&mut self, _replica: usize, slot_ms: u64, fence: Option<u64>) {
        assert!(fence.is_some(), "a slot closed without a claim");
        self.closed.push(slot_ms);
    }
}

fuzz_target!(|input: (
    ActiveConfig,
    bool,
    Vec<LeaderStep>,
    SlotSetup,
    Vec<SlotStep>
)| {
    let (config, renewable, leader_steps, setup, slot_steps) = input;
    let mut billing = Billing::default();
    // A timing the guard refuses is not a run (the configuration check
    // would stop it at start-up).
    if let Ok(harness) = LeaderHarness::new(config, renewable) {
        if let Err(broken) = harness.run(&leader_steps, &mut billing) {
            panic!("{broken}");
        }
    }
    if let Err(broken) = SlotHarness::new(setup).run(&slot_steps, &mut billing) {
        panic!("{broken}");
    }
});

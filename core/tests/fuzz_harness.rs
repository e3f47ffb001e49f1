//! The fuzzing harnesses users drive their handlers with
//! (`guard_core::fuzz`, feature `arbitrary`): scripted runs with known
//! outcomes, and random step sequences on which guard keeps every promise
//! the harnesses check.
#![cfg(feature = "arbitrary")]

use std::time::Duration;

use guard_core::fuzz::arbitrary::{Arbitrary, Unstructured};
use guard_core::fuzz::{
    self, LeaderHandler, LeaderHarness, LeaderStep, SlotHandler, SlotHarness, SlotSetup, SlotStep,
    Work,
};
use guard_core::guard::{ActiveConfig, DemoteReason};
use guard_core::lock::Ttl;
use guard_core::slot::Every;
use proptest::prelude::*;

#[derive(Default)]
struct Recorder {
    promoted: Vec<u64>,
    demoted: Vec<DemoteReason>,
    work: Vec<Work>,
    slots: Vec<(usize, u64)>,
}

impl LeaderHandler for Recorder {
    fn promoted(&mut self, fence: u64) {
        self.promoted.push(fence);
    }
    fn demoted(&mut self, reason: DemoteReason) {
        self.demoted.push(reason);
    }
    fn work(&mut self, work: Work) -> bool {
        self.work.push(work);
        true
    }
}

impl SlotHandler for Recorder {
    fn run(&mut self, replica: usize, slot_ms: u64, _fence: Option<u64>) {
        self.slots.push((replica, slot_ms));
    }
}

fn config() -> ActiveConfig {
    ActiveConfig::new()
        .with_ttl(Ttl::from_millis(3_000).unwrap())
        .with_interval(Duration::from_millis(1_000))
}

#[test]
fn a_leader_works_with_its_fence_and_a_failover_s_stale_work_is_refused_by_the_resource() {
    use LeaderStep::*;
    let steps = [
        Answer,         // granted: fence 1, promoted
        Work,           // accepted
        ServiceForgets, // a failover loses the lease
        Rival,          // the rival takes it with fence 2 and writes
        Work,           // ours: still within our deadline, fence 1 < 2: refused
        Wait(11),       // the renewal is due (11/32 of 3 s)
        Answer,         // renewal: lost
    ];
    let mut handler = Recorder::default();
    let report = LeaderHarness::new(config(), true)
        .unwrap()
        .run(&steps, &mut handler)
        .unwrap();
    assert_eq!(handler.promoted, vec![1]);
    assert_eq!(handler.demoted, vec![DemoteReason::LeaseLost]);
    assert_eq!(
        (report.work, report.accepted, report.refused_stale),
        (2, 1, 1)
    );
    assert!(handler.work.iter().all(|w| w.fence == 1 && w.now < w.until));
}

#[test]
fn no_work_is_handed_over_past_the_renew_deadline_while_a_renewal_hangs() {
    use LeaderStep::*;
    // Promoted; 1.03 s later the renewal is sent and hangs.
    let mut steps = vec![Answer, Wait(11)];
    // Work offered every 0.47 s for 3.75 s.
    steps.extend([Work, Wait(5)].repeat(8));
    let mut handler = Recorder::default();
    let report = LeaderHarness::new(config(), true)
        .unwrap()
        .run(&steps, &mut handler)
        .unwrap();
    assert_eq!(handler.demoted, vec![DemoteReason::RenewDeadline]);
    // The deadline: the renewal's send (1.03 s) + ttl (3 s) - drift (0.3 s).
    let last = handler.work.last().unwrap();
    assert!(last.now < last.until);
    assert!(
        report.work < 8,
        "work went on past the deadline: {report:?}"
    );
}

#[test]
fn two_skewed_replicas_run_each_slot_once() {
    let setup = SlotSetup {
        every: Every::new(Duration::from_millis(100)).unwrap(),
        key_ttl: Ttl::from_millis(500).unwrap(),
        skew_ms: 40,
    };
    let mut steps = Vec::new();
    for _ in 0..100 {
        steps.extend([
            SlotStep::Wait(2),
            SlotStep::Fire(true),
            SlotStep::Fire(false),
        ]);
    }
    let mut handler = Recorder::default();
    let report = SlotHarness::new(setup).run(&steps, &mut handler).unwrap();
    let mut slots: Vec<u64> = handler.slots.iter().map(|(_, s)| *s).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), handler.slots.len(), "a slot ran twice");
    assert!(report.runs >= 9 && report.refused >= 9, "{report:?}");
}

/// Replica 1 fires at the first slot's start, replica 0 half a period
/// (of 1 s) later, with a retention of `key_ttl_ms` and replica 1 ahead
/// by `skew_ms`.
fn a_late_replica(key_ttl_ms: u64, skew_ms: u16) -> (Recorder, fuzz::SlotReport) {
    let setup = SlotSetup {
        every: Every::new(Duration::from_millis(1_000)).unwrap(),
        key_ttl: Ttl::from_millis(key_ttl_ms).unwrap(),
        skew_ms,
    };
    let steps = [
        SlotStep::Wait(16),
        SlotStep::Fire(true),
        SlotStep::Wait(8),
        SlotStep::Fire(false),
    ];
    let mut handler = Recorder::default();
    let report = SlotHarness::new(setup).run(&steps, &mut handler).unwrap();
    (handler, report)
}

#[test]
fn a_replica_firing_later_than_the_retention_runs_the_slot_again_the_documented_limit() {
    // No skew, but the claim replica 1 made at the slot's start (kept
    // 100 ms) has expired when replica 0 fires: skew + lateness is past
    // the retention, so the second run is the limit the README states,
    // not a broken promise.
    let (handler, report) = a_late_replica(100, 0);
    let slot = 1_700_000_001_000;
    assert_eq!(handler.slots, vec![(1, slot), (0, slot)]);
    assert_eq!(report.runs, 2);
}

#[test]
fn a_replica_firing_late_within_the_retention_is_refused() {
    // A retention above skew + lateness: one run.
    let (handler, report) = a_late_replica(1_000, 300);
    assert_eq!(handler.slots.len(), 1);
    assert_eq!((report.runs, report.refused), (1, 1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever happens, guard keeps the harnesses' promises.
    #[test]
    fn random_runs_keep_every_promise(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        // A fixed timing, then one the bytes choose.
        let mut u = Unstructured::new(&bytes);
        let renewable = bool::arbitrary(&mut u).unwrap_or(true);
        let steps: Vec<LeaderStep> = fuzz::steps(&mut u);
        let mut handler = Recorder::default();
        let harness = LeaderHarness::new(config(), renewable).unwrap();
        prop_assert_eq!(harness.run(&steps, &mut handler).err(), None);
        let mut u = Unstructured::new(&bytes);
        let config = ActiveConfig::arbitrary(&mut u).unwrap_or_default();
        let renewable = bool::arbitrary(&mut u).unwrap_or(true);
        let steps: Vec<LeaderStep> = fuzz::steps(&mut u);
        if let Ok(harness) = LeaderHarness::new(config, renewable) {
            let mut handler = Recorder::default();
            prop_assert_eq!(harness.run(&steps, &mut handler).err(), None);
        }
        let mut u = Unstructured::new(&bytes);
        if let Ok(setup) = SlotSetup::arbitrary(&mut u) {
            let steps: Vec<SlotStep> = fuzz::steps(&mut u);
            let mut handler = Recorder::default();
            prop_assert_eq!(SlotHarness::new(setup).run(&steps, &mut handler).err(), None);
        }
    }
}

//! Every named scenario on fixed seeds with its expected verdict, a few
//! random seeds, and replay: one seed, one event-log hash.

use std::time::Duration;

use guard_sim::{Scenario, World, WorldConfig};

fn run(config: WorldConfig) -> guard_sim::Report {
    World::new(config).expect("valid world").run(|_| {}).0
}

fn expect(scenario: Scenario, seed: u64, seconds: u64) -> guard_sim::Report {
    let report = run(scenario.config(seed, 3, Duration::from_secs(seconds)));
    if let Err(wrong) = scenario.check(&report) {
        panic!(
            "{} seed {seed}: {}\n{report}",
            scenario.name(),
            wrong.join("; ")
        );
    }
    report
}

#[test]
fn skew_below_the_key_retention_runs_each_slot_once() {
    let r = expect(Scenario::SkewBelow, 1, 120);
    assert!(r.slots_planned >= 110, "{r}");
}

#[test]
fn skew_above_the_key_retention_runs_slots_twice_and_says_so() {
    let r = expect(Scenario::SkewAbove, 2, 120);
    assert!(r.duplicate_runs > 0);
}

#[test]
fn a_partitioned_leader_stops_before_a_standby_starts() {
    expect(Scenario::PartitionedLeader, 3, 120);
}

#[test]
fn fencing_rejects_the_stale_leader_after_a_failover_that_lost_writes() {
    expect(Scenario::Failover, 4, 120);
}

#[test]
fn without_fencing_the_stale_leader_after_a_failover_is_accepted() {
    let mut config = Scenario::Failover.config(4, 3, Duration::from_secs(120));
    config.fencing = false;
    let r = run(config);
    assert!(r.accepted_stale > 0, "{r}");
}

#[test]
fn fencing_rejects_a_leader_waking_from_a_long_pause() {
    expect(Scenario::LongPause, 5, 120);
}

#[test]
fn without_fencing_a_leader_waking_from_a_long_pause_writes_stale() {
    let mut config = Scenario::LongPause.config(5, 3, Duration::from_secs(120));
    config.fencing = false;
    let r = run(config);
    assert!(r.accepted_stale > 0, "{r}");
}

#[test]
fn crash_loops_are_taken_over_within_the_bound() {
    let r = expect(Scenario::CrashLoop, 6, 180);
    assert!(r.takeovers.iter().all(|&t| t <= r.takeover_bound_ns), "{r}");
}

#[test]
fn the_once_scenario_runs_every_slot_exactly_once() {
    let r = expect(Scenario::Once, 7, 600);
    assert!(
        r.slot_runs >= r.slots_planned && r.slots_planned >= 590,
        "{r}"
    );
}

#[test]
fn the_same_seed_gives_the_same_log_hash() {
    for scenario in Scenario::ALL {
        let a = run(scenario.config(11, 3, Duration::from_secs(60)));
        let b = run(scenario.config(11, 3, Duration::from_secs(60)));
        assert_eq!(a.log_hash, b.log_hash, "{}", scenario.name());
        assert_eq!(a.events, b.events, "{}", scenario.name());
        let c = run(scenario.config(12, 3, Duration::from_secs(60)));
        assert_ne!(a.log_hash, c.log_hash, "{}", scenario.name());
    }
}

/// A few random seeds per run (`GUARD_SIM_SEEDS` per scenario, default
/// two) hold every guarantee; a failing seed is printed so it can be
/// replayed with
/// `guard-sim --seed S --scenario NAME --duration 90`.
#[test]
fn random_seeds_meet_every_scenario_verdict() {
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let per_scenario: u64 = std::env::var("GUARD_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let runs = Scenario::ALL
        .into_iter()
        .flat_map(|s| (0..per_scenario).map(move |n| (s, n)));
    for (i, (scenario, _)) in runs.enumerate() {
        let seed = base.wrapping_add(i as u64 * 0x9e37_79b9);
        let report = run(scenario.config(seed, 3, Duration::from_secs(90)));
        if let Err(wrong) = scenario.check_safety(&report) {
            panic!(
                "guard-sim --seed {seed} --scenario {} --duration 90: {}\n{report}",
                scenario.name(),
                wrong.join("; ")
            );
        }
    }
}

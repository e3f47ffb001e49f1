//! Simulated slots per second of wall time in the OnceGuard scenario: three
//! replicas claiming every one-second slot through guard-core's OnceGuard
//! against the simulated lock service.
//!
//! `cargo bench -p guard-sim --bench slots`

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use guard_sim::{Scenario, World};

/// Simulated seconds per iteration; one slot per second.
const SECONDS: u64 = 2_000;

fn once_scenario(c: &mut Criterion) {
    let mut g = c.benchmark_group("sim_once");
    g.throughput(Throughput::Elements(SECONDS));
    g.sample_size(10);
    g.bench_function("slots", |b| {
        b.iter(|| {
            let config = Scenario::Once.config(42, 3, Duration::from_secs(SECONDS));
            let (report, _) = World::new(config).expect("world").run(|_| {});
            assert_eq!(report.duplicate_runs, 0);
            report.slot_runs
        })
    });
    g.finish();
}

criterion_group!(benches, once_scenario);
criterion_main!(benches);

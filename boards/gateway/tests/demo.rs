//! The main job, shortened: no duplicate, a takeover.

use std::time::Duration;

use guard_gateway::demo::{self, DemoOptions};

#[test]
fn the_demo_runs_every_slot_once_and_hands_over_the_lead() {
    let options = DemoOptions {
        replicas: 3,
        duration: Duration::from_secs(5),
        ..DemoOptions::default()
    };
    let mut ticks = 0;
    let report = demo::run(&options, |_| ticks += 1).expect("demo");
    assert!(ticks > 10, "progress was reported");
    assert_eq!(report.duplicates, 0, "{report}");
    assert_eq!(report.missed, 0, "{report}");
    assert!(report.slots >= 4, "{report}");
    assert!(report.leader_changes >= 1, "{report}");
    let takeover = report.takeover.expect("a standby took over");
    assert!(takeover < Duration::from_millis(500), "{report}");
    assert_eq!(report.executions.iter().sum::<usize>(), report.slots);
    assert!(report.to_string().contains("duplicates        0"));
    assert!(report.kept_promises());
    // A missed slot, a duplicate or no slot at all fails the run (exit 1).
    for broken in [
        demo::DemoReport {
            missed: 1,
            ..report.clone()
        },
        demo::DemoReport {
            duplicates: 1,
            ..report.clone()
        },
        demo::DemoReport {
            slots: 0,
            ..report.clone()
        },
    ] {
        assert!(!broken.kept_promises(), "{broken}");
    }
}

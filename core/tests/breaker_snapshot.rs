//! A breaker written as bytes and read back decides as the breaker it was
//! (over any sequence of calls, outcomes, manual moves and times, with a
//! count or a time window); bytes that are not a snapshot are refused,
//! naming what is wrong.

use core::time::Duration;

use guard_core::breaker::{
    BreakerConfig, CallWindow, CircuitBreaker, CountWindow, InvalidSnapshot, Permit, TimeWindow,
    WindowSnapshot,
};
use guard_core::time::Instant;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// Ask for a permit `after_ms` later; report it `took_ms` later as
    /// failed or not, or ignore it.
    Call {
        after_ms: u16,
        took_ms: u16,
        failed: bool,
        ignored: bool,
    },
    Close,
    Open,
    HalfOpen,
    ForceOpen,
    Disable,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        20 => (0u16..3_000, 0u16..1_500, any::<bool>(), any::<bool>()).prop_map(
            |(after_ms, took_ms, failed, ignored)| Op::Call { after_ms, took_ms, failed, ignored: ignored && failed }
        ),
        1 => Just(Op::Close),
        1 => Just(Op::Open),
        1 => Just(Op::HalfOpen),
        1 => Just(Op::ForceOpen),
        1 => Just(Op::Disable),
    ]
}

fn config() -> BreakerConfig {
    BreakerConfig::new()
        .with_minimum_calls(3)
        .with_failure_rate(50)
        .with_slow_call_rate(60)
        .with_slow_call_duration(Duration::from_millis(700))
        .with_half_open_calls(2)
        .with_wait_in_open(Duration::from_secs(2))
        .with_max_wait_in_half_open(Duration::from_secs(5))
}

fn round_trip<W: WindowSnapshot>(breaker: &CircuitBreaker<W>) -> CircuitBreaker<W> {
    let mut bytes = vec![0u8; CircuitBreaker::<W>::ENCODED_LEN];
    breaker.encode(&mut bytes).unwrap();
    CircuitBreaker::<W>::decode(*breaker.config(), &bytes).unwrap()
}

/// Runs `ops` on `kept` and on a breaker that is written and read back
/// before every step: both decide alike, step by step.
fn decides_alike<W: WindowSnapshot + Clone>(window: W, ops: &[Op]) {
    let mut kept = CircuitBreaker::new(config(), window).unwrap();
    let mut shared = round_trip(&kept);
    let mut now = Instant::from_secs(1_000);
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Call {
                after_ms,
                took_ms,
                failed,
                ignored,
            } => {
                now = now + Duration::from_millis(after_ms.into());
                let a = kept.try_acquire(now);
                shared = round_trip(&shared);
                let b = shared.try_acquire(now);
                match (a, b) {
                    (Ok(a), Ok(b)) => {
                        let end = now + Duration::from_millis(took_ms.into());
                        shared = round_trip(&shared);
                        // The permit crosses as its parts, as a shared
                        // breaker's does.
                        let (started, epoch) = b.into_parts();
                        let b = Permit::from_parts(started, epoch);
                        if ignored {
                            kept.on_ignored(a);
                            shared.on_ignored(b);
                        } else {
                            assert_eq!(
                                kept.on_result(a, end, failed),
                                shared.on_result(b, end, failed),
                                "step {step}: the same transition"
                            );
                        }
                    }
                    (Err(a), Err(b)) => assert_eq!(a, b, "step {step}: the same refusal"),
                    (a, b) => panic!("step {step}: {a:?} against {b:?}"),
                }
            }
            Op::Close => assert_eq!(kept.close(), shared.close()),
            Op::Open => assert_eq!(kept.open(now), shared.open(now)),
            Op::HalfOpen => assert_eq!(kept.half_open(now), shared.half_open(now)),
            Op::ForceOpen => assert_eq!(kept.force_open(), shared.force_open()),
            Op::Disable => assert_eq!(kept.disable(), shared.disable()),
        }
        shared = round_trip(&shared);
        assert_eq!(kept.state(), shared.state(), "step {step}: the same state");
        assert_eq!(
            kept.metrics(now),
            shared.metrics(now),
            "step {step}: the same metrics"
        );
    }
}

proptest! {
    #[test]
    fn a_count_window_breaker_read_back_decides_as_it_was(ops in prop::collection::vec(op(), 1..200)) {
        decides_alike(CountWindow::<5>::new(), &ops);
    }

    #[test]
    fn a_time_window_breaker_read_back_decides_as_it_was(ops in prop::collection::vec(op(), 1..200)) {
        decides_alike(TimeWindow::<4>::new(), &ops);
    }

    #[test]
    fn no_bytes_decode_into_a_breaker_that_panics(
        writes in prop::collection::vec((0usize..67, any::<u8>()), 1..8),
    ) {
        type B = CircuitBreaker<CountWindow<5>>;
        // A snapshot with some of its bytes overwritten.
        let mut bytes = bytes_of(CountWindow::<5>::new());
        for (at, value) in writes {
            let len = bytes.len();
            bytes[at % len] = value;
        }
        if let Ok(mut breaker) = B::decode(config(), &bytes) {
            let now = Instant::from_secs(5);
            if let Ok(permit) = breaker.try_acquire(now) {
                breaker.on_result(permit, now, true);
            }
            let _ = breaker.metrics(now);
        }
    }
}

fn bytes_of<W: WindowSnapshot + CallWindow>(window: W) -> Vec<u8> {
    let breaker = CircuitBreaker::new(config(), window).unwrap();
    let mut bytes = vec![0u8; CircuitBreaker::<W>::ENCODED_LEN];
    breaker.encode(&mut bytes).unwrap();
    bytes
}

#[test]
fn bytes_that_are_not_a_snapshot_are_refused_naming_what_is_wrong() {
    type Count = CircuitBreaker<CountWindow<5>>;
    type Time = CircuitBreaker<TimeWindow<4>>;
    let good = bytes_of(CountWindow::<5>::new());
    assert!(Count::decode(config(), &good).is_ok());
    let refused = |bytes: &[u8]| Count::decode(config(), bytes).unwrap_err();

    assert_eq!(
        refused(&good[1..]),
        InvalidSnapshot::Length {
            expected: good.len(),
            got: good.len() - 1
        }
    );
    let mut b = good.clone();
    b[0] = 9;
    assert_eq!(refused(&b), InvalidSnapshot::Version(9));
    let mut b = good.clone();
    b[1] = 7;
    assert_eq!(refused(&b), InvalidSnapshot::Field("state"));
    // Half-open with more trials ended than handed out.
    let mut b = good.clone();
    b[1] = 2;
    b[14] = 1;
    assert_eq!(refused(&b), InvalidSnapshot::Field("half-open trials"));
    // A last tally with more failures than calls.
    let mut b = good.clone();
    b[34] = 1;
    assert_eq!(refused(&b), InvalidSnapshot::Field("last tally"));
    let window = good.len() - CountWindow::<5>::ENCODED_LEN;
    let mut b = good.clone();
    b[window] = 6;
    assert_eq!(refused(&b), InvalidSnapshot::Field("count window size"));
    let mut b = good.clone();
    b[window + 4] = 5;
    assert_eq!(refused(&b), InvalidSnapshot::Field("count window position"));
    let mut b = good.clone();
    b[window + 8] = 0x01; // a failure flag on an empty slot
    assert_eq!(refused(&b), InvalidSnapshot::Field("count window call"));
    // A count window's bytes are not a time window's.
    assert!(matches!(
        Time::decode(config(), &good),
        Err(InvalidSnapshot::Length { .. })
    ));
    // A time window's bucket out of its place.
    let mut t = bytes_of(TimeWindow::<4>::new());
    let at = t.len() - TimeWindow::<4>::ENCODED_LEN + 4;
    t[at..at + 8].copy_from_slice(&5u64.to_le_bytes()); // second 5 sits at index 1, not 0
    assert_eq!(
        Time::decode(config(), &t).unwrap_err(),
        InvalidSnapshot::Field("time window bucket")
    );
    assert!(
        Count::decode(config().with_failure_rate(0), &good).is_err(),
        "the configuration is checked too"
    );
    let message = refused(&good[1..]).to_string();
    assert!(message.contains("bytes"), "{message}");
}

//! The circuit breaker against Resilience4j's own tests, scenario by
//! scenario: `CircuitBreakerStateMachineTest`, `CircuitBreakerMetricsTest`,
//! `FixedSizeSlidingWindowMetricsTest` and `SlidingTimeWindowMetricsTest`
//! (resilience4j-circuitbreaker and resilience4j-core). Each test names the
//! scenario it ports; the figures asserted are Resilience4j's.
//!
//! Resilience4j records an outcome with a duration and no permission; here
//! a call is a permit taken when it starts and handed back when it ends, so
//! a call of `took` is permitted at `now - took` and reported at `now` (the
//! time window files it under `now`, as Resilience4j does).
//!
//! Where the two differ, on purpose:
//! - refusals (`not_permitted`) are counted since the breaker was built, a
//!   counter a metrics system can scrape; Resilience4j starts them again
//!   in each state;
//! - a manual move is taken from any state (Resilience4j refuses
//!   closed → half-open and closed → closed); `close` on a closed breaker
//!   is Resilience4j's `reset`;
//! - thresholds are whole percentages, compared exactly in integers;
//! - not ported: an open wait that grows with each opening
//!   (`waitIntervalFunctionInOpenState`), and the `FORCED_CLOSE` and
//!   `METRICS_ONLY` states.

use core::time::Duration;

use guard_core::breaker::{
    BreakerConfig, CallWindow, CircuitBreaker, CountWindow, Metrics, Permit, State, Tally,
    TimeWindow,
};
use guard_core::time::Instant;

/// 2019-01-01T12:00:00Z, the mock clock of `CircuitBreakerStateMachineTest`.
const STATE_MACHINE_CLOCK: u64 = 1_546_344_000;
/// 2019-08-04T12:00:00Z, the mock clock of `SlidingTimeWindowMetricsTest`.
const METRICS_CLOCK: u64 = 1_564_920_000;

/// The breaker of `CircuitBreakerStateMachineTest.setUp`: failure rate 50%,
/// 4 half-open calls, slow beyond 4 s, slow call rate 50%, a time window of
/// 5 s with at least 5 calls, 5 s open.
fn r4j_config() -> BreakerConfig {
    BreakerConfig::new()
        .with_failure_rate(50)
        .with_half_open_calls(4)
        .with_slow_call_duration(Duration::from_secs(4))
        .with_slow_call_rate(50)
        .with_minimum_calls(5)
        .with_wait_in_open(Duration::from_secs(5))
}

/// A breaker on a mock clock, with Resilience4j's calls.
struct Mock {
    breaker: CircuitBreaker<TimeWindow<5>>,
    now: Instant,
}

impl Mock {
    fn new() -> Self {
        Mock {
            breaker: CircuitBreaker::new(r4j_config(), TimeWindow::new()).unwrap(),
            now: Instant::from_secs(STATE_MACHINE_CLOCK),
        }
    }

    fn advance(&mut self, secs: u64) {
        self.now = self.now + Duration::from_secs(secs);
    }

    /// `tryAcquirePermission`: the permit, if any.
    fn acquire(&mut self) -> Option<Permit> {
        self.breaker.try_acquire(self.now).ok()
    }

    /// `tryAcquirePermission` whose permit is handed back unjudged: for
    /// the scenarios that only ask whether a call would be permitted.
    fn permitted(&mut self) -> bool {
        match self.acquire() {
            Some(permit) => {
                self.breaker.on_ignored(permit);
                true
            }
            None => false,
        }
    }

    /// A permitted call that took `took` and ended now, failed or not.
    fn call(&mut self, took: Duration, failed: bool) {
        let permit = self
            .breaker
            .try_acquire(self.now - took)
            .expect("the call is permitted");
        self.breaker.on_result(permit, self.now, failed);
    }

    fn success(&mut self) {
        self.call(Duration::ZERO, false);
    }

    fn error(&mut self) {
        self.call(Duration::ZERO, true);
    }

    /// An error the classifier ignores (Resilience4j's
    /// `ignoreExceptions(NumberFormatException.class)`).
    fn ignored(&mut self) {
        let permit = self.acquire().expect("the call is permitted");
        self.breaker.on_ignored(permit);
    }

    fn state(&self) -> State {
        self.breaker.state()
    }

    fn metrics(&mut self) -> Metrics {
        self.breaker.metrics(self.now)
    }

    /// `assertCircuitBreakerMetricsEqualTo(rate, successes, buffered,
    /// failed, notPermitted)`, the rate `None` for Resilience4j's `-1`.
    #[track_caller]
    fn assert_metrics(
        &mut self,
        failure_rate: Option<u32>,
        successes: u32,
        buffered: u32,
        failed: u32,
        not_permitted: u64,
    ) {
        let m = self.metrics();
        assert_eq!(m.failure_rate(), failure_rate, "failure rate");
        assert_eq!(m.tally.calls - m.tally.failures, successes, "successes");
        assert_eq!(m.tally.calls, buffered, "buffered calls");
        assert_eq!(m.tally.failures, failed, "failed calls");
        assert_eq!(m.not_permitted, not_permitted, "not permitted");
    }

    #[track_caller]
    fn assert_reset(&mut self, not_permitted: u64) {
        self.assert_metrics(None, 0, 0, 0, not_permitted);
    }

    fn half_open(&mut self) {
        self.breaker.open(self.now);
        self.breaker.half_open(self.now);
        assert_eq!(self.state(), State::HalfOpen);
    }
}

#[test]
fn should_throw_call_not_permitted_exception_when_state_is_open() {
    let mut cb = Mock::new();
    cb.breaker.open(cb.now);
    let refused = cb.breaker.try_acquire(cb.now).unwrap_err();
    assert_eq!(refused.state, State::Open);
    assert_eq!(refused.retry_after, Some(Duration::from_secs(5)));
    assert_eq!(cb.metrics().not_permitted, 1);
}

#[test]
fn should_throw_call_not_permitted_exception_when_state_is_forced_open() {
    let mut cb = Mock::new();
    cb.breaker.force_open();
    let refused = cb.breaker.try_acquire(cb.now).unwrap_err();
    assert_eq!(refused.state, State::ForcedOpen);
    assert_eq!(refused.retry_after, None);
    assert_eq!(cb.metrics().not_permitted, 1);
}

#[test]
fn should_increase_counter_on_release_permission() {
    let mut cb = Mock::new();
    cb.half_open();
    let permits: Vec<Permit> = (0..4).map(|_| cb.acquire().unwrap()).collect();
    assert!(cb.acquire().is_none());
    assert!(cb.acquire().is_none());
    let mut permits = permits.into_iter();
    cb.breaker.on_ignored(permits.next().unwrap()); // releasePermission
    assert!(cb.acquire().is_some());
}

#[test]
fn should_throw_call_not_permitted_exception_when_not_further_test_calls_are_permitted() {
    let mut cb = Mock::new();
    cb.half_open();
    let _trials: Vec<Permit> = (0..4).map(|_| cb.acquire().unwrap()).collect();
    let refused = cb.breaker.try_acquire(cb.now).unwrap_err();
    assert_eq!(refused.state, State::HalfOpen);
    assert_eq!(cb.metrics().not_permitted, 1);
}

#[test]
fn should_only_permit_four_calls_in_half_open_state() {
    let mut cb = Mock::new();
    cb.assert_reset(0);
    for _ in 0..2 {
        cb.half_open();
        let _trials: Vec<Permit> = (0..4).map(|_| cb.acquire().unwrap()).collect();
        assert!(cb.acquire().is_none());
        assert!(cb.acquire().is_none());
    }
}

#[test]
fn should_open_after_failure_rate_threshold_exceeded() {
    let mut cb = Mock::new();
    assert!(cb.permitted());
    assert_eq!(cb.state(), State::Closed);
    cb.assert_reset(0);

    cb.error();
    assert_eq!(cb.state(), State::Closed);
    cb.assert_metrics(None, 0, 1, 1, 0);
    cb.error();
    assert_eq!(cb.state(), State::Closed);
    cb.assert_metrics(None, 0, 2, 2, 0);
    cb.error();
    assert_eq!(cb.state(), State::Closed);
    cb.assert_metrics(None, 0, 3, 3, 0);
    cb.success();
    assert_eq!(cb.state(), State::Closed);
    cb.assert_metrics(None, 1, 4, 3, 0);
    cb.success();

    // Five calls, the minimum, three failed: 60%.
    assert_eq!(cb.state(), State::Open);
    cb.assert_metrics(Some(60), 2, 5, 3, 0);

    assert!(!cb.permitted());
    cb.assert_metrics(Some(60), 2, 5, 3, 1);
}

#[test]
fn should_open_after_slow_call_rate_threshold_exceeded() {
    let mut cb = Mock::new();
    let (slow, fast) = (Duration::from_secs(5), Duration::from_millis(100));
    cb.call(slow, true);
    assert_eq!(cb.state(), State::Closed);
    cb.call(slow, false);
    assert_eq!(cb.state(), State::Closed);
    cb.call(fast, true);
    assert_eq!(cb.state(), State::Closed);
    cb.call(fast, false);
    assert_eq!(cb.state(), State::Closed);
    cb.call(slow, false);

    // Two failures of five (40%), but three slow calls: 60%.
    assert_eq!(cb.state(), State::Open);
    let m = cb.metrics();
    assert_eq!(m.tally.calls, 5);
    assert_eq!(m.tally.slow, 3);
    assert_eq!(m.slow_call_rate(), Some(60));
    assert_eq!(m.failure_rate(), Some(40));
}

#[test]
fn should_transition_to_half_open_after_wait_duration() {
    let mut cb = Mock::new();
    cb.breaker.open(cb.now);
    cb.assert_reset(0);
    assert_eq!(cb.state(), State::Open);
    assert!(!cb.permitted());

    cb.advance(3);
    // The wait of 5 s is not over.
    assert_eq!(cb.state(), State::Open);
    assert!(!cb.permitted());
    cb.assert_metrics(None, 0, 0, 0, 2);

    cb.advance(3);
    assert!(cb.permitted());
    assert_eq!(cb.state(), State::HalfOpen);
    // Fresh trials (the refusals are counted since the breaker was built).
    cb.assert_metrics(None, 0, 0, 0, 2);
}

#[test]
fn should_transition_back_to_open_state_when_failure_rate_is_above_threshold() {
    let mut cb = Mock::new();
    cb.half_open();
    cb.assert_reset(0);
    cb.error();
    cb.error();
    cb.success();
    cb.error();
    // Four trials, three failed.
    assert_eq!(cb.state(), State::Open);
    cb.assert_metrics(Some(75), 1, 4, 3, 0);
}

#[test]
fn should_transition_back_to_open_state_when_slow_call_rate_is_above_threshold() {
    let mut cb = Mock::new();
    cb.half_open();
    for _ in 0..3 {
        cb.call(Duration::from_secs(5), false);
    }
    cb.call(Duration::from_secs(1), false);
    // No failure, but three slow trials of four.
    assert_eq!(cb.state(), State::Open);
    let m = cb.metrics();
    assert_eq!(m.tally.slow, 3);
    assert_eq!(m.slow_call_rate(), Some(75));
    assert_eq!(m.failure_rate(), Some(0));
}

#[test]
fn should_transition_back_to_closed_state_when_failure_is_below_threshold() {
    let mut cb = Mock::new();
    cb.half_open();
    cb.assert_reset(0);
    cb.error();
    cb.success();
    cb.success();
    cb.success();
    // One failed trial of four: 25%.
    assert!(cb.permitted());
    assert_eq!(cb.state(), State::Closed);
    cb.assert_reset(0);

    cb.success();
    cb.assert_metrics(None, 1, 1, 0, 0);
}

#[test]
fn should_reset_metrics() {
    let mut cb = Mock::new();
    assert_eq!(cb.state(), State::Closed);
    cb.assert_reset(0);
    cb.success();
    cb.error();
    cb.assert_metrics(None, 1, 2, 1, 0);
    cb.breaker.close(); // reset
    cb.assert_reset(0);
}

#[test]
fn should_disable_circuit_breaker() {
    let mut cb = Mock::new();
    cb.breaker.disable();
    assert_eq!(cb.state(), State::Disabled);
    cb.assert_reset(0);
    cb.success();
    for _ in 0..4 {
        cb.error();
    }
    // Nothing judged, nothing recorded.
    assert_eq!(cb.state(), State::Disabled);
    cb.assert_reset(0);
}

#[test]
fn should_force_open_circuit_breaker() {
    let mut cb = Mock::new();
    cb.breaker.force_open();
    assert_eq!(cb.state(), State::ForcedOpen);
    assert!(!cb.permitted());
    cb.advance(6);
    assert!(!cb.permitted());
    // The open wait does not apply to a forced open breaker.
    assert_eq!(cb.state(), State::ForcedOpen);
    cb.assert_metrics(None, 0, 0, 0, 2);
}

#[test]
fn should_release_permission_when_exception_ignored() {
    let mut cb = Mock::new();
    cb.half_open();
    cb.success();
    assert_eq!(cb.state(), State::HalfOpen);
    cb.assert_metrics(None, 1, 1, 0, 0);
    cb.success();
    assert_eq!(cb.state(), State::HalfOpen);
    cb.assert_metrics(None, 2, 2, 0, 0);
    cb.success();
    assert_eq!(cb.state(), State::HalfOpen);
    cb.assert_metrics(None, 3, 3, 0, 0);

    // The ignored error gives its trial back.
    cb.ignored();
    assert_eq!(cb.state(), State::HalfOpen);
    cb.assert_metrics(None, 3, 3, 0, 0);

    cb.error();
    assert_eq!(cb.state(), State::Closed);
    cb.assert_reset(0);
}

#[test]
fn should_ignore_exceptions_and_then_transition_to_closed() {
    let mut cb = Mock::new();
    cb.half_open();
    for _ in 0..4 {
        cb.ignored();
        assert_eq!(cb.state(), State::HalfOpen);
    }
    cb.assert_reset(0);
    for _ in 0..3 {
        cb.success();
        assert_eq!(cb.state(), State::HalfOpen);
    }
    cb.assert_metrics(None, 3, 3, 0, 0);
    cb.success();
    assert_eq!(cb.state(), State::Closed);
    cb.assert_reset(0);
}

#[test]
fn should_reset_to_closed_state() {
    let mut cb = Mock::new();
    cb.breaker.open(cb.now);
    cb.breaker.close();
    assert_eq!(cb.state(), State::Closed);
}

#[test]
fn should_reset_closed_state() {
    let mut cb = Mock::new();
    cb.success();
    cb.success();
    assert_eq!(cb.metrics().tally.calls, 2);
    cb.breaker.close();
    assert_eq!(cb.state(), State::Closed);
    assert_eq!(cb.metrics().tally.calls, 0);
}

/// The boundary Resilience4j draws (`duration > slowCallDurationThreshold`):
/// a call of exactly the threshold is not slow.
#[test]
fn a_call_of_exactly_the_slow_threshold_is_not_slow() {
    let config = r4j_config();
    assert!(!config.is_slow(Duration::from_secs(4)));
    assert!(config.is_slow(Duration::from_secs(4) + Duration::from_nanos(1)));

    let mut cb = Mock::new();
    for _ in 0..5 {
        cb.call(Duration::from_secs(4), false);
    }
    assert_eq!(cb.state(), State::Closed);
    assert_eq!(cb.metrics().tally.slow, 0);
}

/// `CircuitBreakerMetricsTest.testCircuitBreakerMetrics`: a count window of
/// 10 calls, at least 10.
#[test]
fn circuit_breaker_metrics() {
    let outcomes = [
        false, false, true, true, // below the minimum
        true, true, true, true, false, false, false, false,
    ];
    let mut window = CountWindow::<10>::new();
    let t = Instant::from_secs(STATE_MACHINE_CLOCK);
    let rate = |w: &mut CountWindow<10>| {
        Metrics {
            tally: w.tally(t),
            minimum_calls: 10,
            not_permitted: 0,
        }
        .failure_rate()
    };
    for &failed in &outcomes[..4] {
        window.record(t, failed, false);
    }
    let tally = window.tally(t);
    assert_eq!((tally.calls, tally.failures), (4, 2));
    assert_eq!(rate(&mut window), None, "four calls of at least ten");

    for &failed in &outcomes[4..] {
        window.record(t, failed, false);
    }
    // Twelve recorded, the last ten kept: six failed, four succeeded.
    let tally = window.tally(t);
    assert_eq!((tally.calls, tally.failures), (10, 6));
    assert_eq!(rate(&mut window), Some(60));

    for _ in 0..3 {
        window.record(t, false, false);
    }
    assert_eq!(rate(&mut window), Some(30));

    // The breaker judging the same calls opens at the tenth: 6 of 10.
    let config = BreakerConfig::new().with_minimum_calls(10);
    let mut breaker = CircuitBreaker::new(config, CountWindow::<10>::new()).unwrap();
    for (i, &failed) in outcomes[..10].iter().enumerate() {
        let permit = breaker.try_acquire(t).unwrap();
        breaker.on_result(permit, t, failed);
        let expected = if i < 9 { State::Closed } else { State::Open };
        assert_eq!(breaker.state(), expected, "after call {}", i + 1);
    }
}

fn tally(calls: u32, failures: u32, slow: u32) -> Tally {
    Tally {
        calls,
        failures,
        slow,
    }
}

/// `FixedSizeSlidingWindowMetricsTest`: `testSlowCallsPercentage`,
/// `testSlidingWindowMetrics` and `testSlidingWindowMetricsWithSlowCalls`.
#[test]
fn fixed_size_sliding_window_metrics() {
    let t = Instant::from_secs(METRICS_CLOCK);
    let mut w = CountWindow::<5>::new();
    assert_eq!(w.tally(t), Tally::default());
    for (failed, slow) in [
        (false, true),
        (true, true),
        (false, false),
        (false, false),
        (false, false),
    ] {
        w.record(t, failed, slow);
    }
    assert_eq!(w.tally(t), tally(5, 1, 2));
    let m = Metrics {
        tally: w.tally(t),
        minimum_calls: 0,
        not_permitted: 0,
    };
    assert_eq!(m.slow_call_rate(), Some(40));

    let mut w = CountWindow::<4>::new();
    let steps = [
        (true, tally(1, 1, 0), 100),
        (false, tally(2, 1, 0), 50),
        (false, tally(3, 1, 0), 33), // 33.333332f
        (false, tally(4, 1, 0), 25),
        (false, tally(4, 0, 0), 0),
    ];
    for (failed, expected, rate) in steps {
        w.record(t, failed, false);
        let got = w.tally(t);
        assert_eq!(got, expected);
        let m = Metrics {
            tally: got,
            minimum_calls: 0,
            not_permitted: 0,
        };
        assert_eq!(m.failure_rate(), Some(rate));
    }

    let mut w = CountWindow::<2>::new();
    let steps = [
        ((true, true), tally(1, 1, 1)),
        ((false, true), tally(2, 1, 2)),
        ((false, false), tally(2, 0, 1)),
        ((false, false), tally(2, 0, 0)),
        ((false, false), tally(2, 0, 0)),
    ];
    for ((failed, slow), expected) in steps {
        w.record(t, failed, slow);
        assert_eq!(w.tally(t), expected);
    }
}

/// `SlidingTimeWindowMetricsTest.testSlidingTimeWindowMetrics`: a window of
/// 5 s on a clock that starts on a whole second.
#[test]
fn sliding_time_window_metrics() {
    let mut w = TimeWindow::<5>::new();
    let mut t = Instant::from_secs(METRICS_CLOCK);
    let millis = Duration::from_millis;
    let secs = Duration::from_secs;
    // (advance before the call, failed, calls after, failures after)
    let steps = [
        (Duration::ZERO, true, 1, 1),
        (millis(100), false, 2, 1),
        (millis(100), false, 3, 1),
        (secs(1), false, 4, 1),
        (secs(1), false, 5, 1),
        (secs(1), true, 6, 2),
        (secs(1), false, 7, 2),
        // The first second leaves.
        (secs(1), false, 5, 1),
        (secs(1), false, 5, 1),
        (secs(5), false, 1, 0),
    ];
    for (i, (advance, failed, calls, failures)) in steps.into_iter().enumerate() {
        t = t + advance;
        w.record(t, failed, false);
        let got = w.tally(t);
        assert_eq!(
            (got.calls, got.failures),
            (calls, failures),
            "step {}",
            i + 1
        );
    }
}

/// `SlidingTimeWindowMetricsTest.shouldClearSlidingTimeWindowMetrics` and
/// `testSlowCallsPercentage`.
#[test]
fn sliding_time_window_metrics_clear_as_time_passes() {
    let mut w = TimeWindow::<5>::new();
    let mut t = Instant::from_secs(METRICS_CLOCK);
    w.record(t, true, false);
    assert_eq!(w.tally(t), tally(1, 1, 0));
    t = t + Duration::from_millis(100);
    w.record(t, false, false);
    assert_eq!(w.tally(t), tally(2, 1, 0));
    t = t + Duration::from_millis(700);
    w.record(t, false, false);
    assert_eq!(w.tally(t), tally(3, 1, 0));
    t = t + Duration::from_secs(4);
    assert_eq!(w.tally(t), tally(3, 1, 0), "4.8 s on: all still in");
    t = t + Duration::from_secs(1);
    assert_eq!(w.tally(t), Tally::default(), "5.8 s on: all gone");
    t = t + Duration::from_millis(100);
    w.record(t, false, false);
    assert_eq!(w.tally(t), tally(1, 0, 0));

    let mut w = TimeWindow::<5>::new();
    let t = Instant::from_secs(METRICS_CLOCK);
    for (failed, slow) in [
        (false, true),
        (true, true),
        (false, false),
        (false, false),
        (false, false),
    ] {
        w.record(t, failed, slow);
    }
    let m = Metrics {
        tally: w.tally(t),
        minimum_calls: 0,
        not_permitted: 0,
    };
    assert_eq!(m.tally, tally(5, 1, 2));
    assert_eq!(m.slow_call_rate(), Some(40));
}

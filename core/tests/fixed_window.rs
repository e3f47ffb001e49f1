//! The fixed window against a brute-force model, its budget on any clock,
//! its alignment to calendar days and its new parameters at run time.
//!
//! The model counts units per window index, `k = (t - offset) / period + 1`
//! past the first boundary and `0` before it, in 128-bit arithmetic: it
//! shares nothing with guard-core's window starts.

use std::collections::HashMap;
use std::time::Duration;

use guard_core::limit::{
    Algorithm, FixedWindow, FullPolicy, Keyed, Limiter, LimiterError, WindowCount,
};
use guard_core::time::Instant;
use proptest::prelude::*;

/// The index of the window that holds `t`.
fn index(period: u128, offset: u128, t: u64) -> u128 {
    let t = u128::from(t);
    if t < offset {
        0
    } else {
        (t - offset) / period + 1
    }
}

/// A window per index, counted by hand, for readings that only move forward.
struct Model {
    period: u128,
    offset: u128,
    limit: u32,
    used: HashMap<u128, u32>,
}

impl Model {
    /// Whether one unit at `t` is admitted, and the wait if not.
    fn check(&mut self, t: u64) -> Option<u128> {
        let k = index(self.period, self.offset, t);
        let used = self.used.entry(k).or_insert(0);
        if *used < self.limit {
            *used += 1;
            return None;
        }
        // Window k ends at offset + k × period, or never within the clock.
        let end = (self.offset + k * self.period).min(u128::from(u64::MAX));
        Some((end - u128::from(t)).max(1))
    }
}

/// A period from a nanosecond to far beyond the clock's range.
fn period() -> impl Strategy<Value = Duration> {
    prop_oneof![
        4 => (1u64..5_000_000_000).prop_map(Duration::from_nanos),
        1 => any::<u64>().prop_map(|n| Duration::from_nanos(n.max(1))),
        1 => Just(Duration::MAX),
    ]
}

/// One reading: anywhere, near either end of the clock, or at it.
fn reading() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => any::<u64>(),
        3 => 0u64..10_000_000_000,
        2 => u64::MAX - 10_000_000_000..=u64::MAX,
        1 => Just(u64::MAX),
        1 => Just(0u64),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_fixed_window_matches_the_model_on_a_forward_clock(
        limit in 1u32..6,
        period in period(),
        offset in period(),
        start in reading(),
        steps in prop::collection::vec(prop_oneof![3 => Just(0u64), 5 => 0u64..2_000_000_000, 1 => any::<u64>()], 1..150),
    ) {
        let window = FixedWindow::new(period, limit).unwrap().with_offset(offset);
        let mut real = Limiter::new(window);
        let mut table: Keyed<u8, FixedWindow, 2> = Keyed::new(window, FullPolicy::DenyNewKeys);
        let mut model = Model {
            period: window.period().as_nanos(),
            offset: window.offset().as_nanos(),
            limit,
            used: HashMap::new(),
        };
        let mut t = start;
        for step in steps {
            t = t.saturating_add(step);
            let now = Instant::from_nanos(t);
            let expected = model.check(t);
            let decision = real.check(now);
            prop_assert_eq!(
                decision.retry_after().map(|d| d.as_nanos()),
                expected,
                "at {} ns ({:?}, offset {:?})", t, window.period(), window.offset()
            );
            // A table that forgets settled keys decides alike.
            prop_assert_eq!(table.check(&1, now), decision);
            let _ = table.purge(now);
        }
    }

    /// In any order, a key is admitted at most `limit` units in each
    /// window its readings touch: alone, and in a table too small for its
    /// keys, which forgets and takes them back.
    #[test]
    fn a_fixed_window_stays_within_its_budget_on_any_clock(
        limit in 1u32..5,
        period in period(),
        offset in period(),
        calls in prop::collection::vec((0u8..6, reading(), 1usize..4, any::<bool>()), 1..100),
    ) {
        let window = FixedWindow::new(period, limit).unwrap().with_offset(offset);
        let (p, o) = (window.period().as_nanos(), window.offset().as_nanos());
        let budget = |min: u64, max: u64| {
            u128::from(limit) * (index(p, o, max) - index(p, o, min) + 1)
        };
        for ordered in [false, true] {
            let mut calls = calls.clone();
            if ordered {
                calls.sort_by_key(|c| c.1);
            }
            let mut single = Limiter::new(window);
            let mut table: Keyed<u8, FixedWindow, 4> = Keyed::new(window, FullPolicy::DenyNewKeys);
            let mut per_key: HashMap<u8, (u64, u64, u128)> = HashMap::new();
            let (mut single_admitted, mut min, mut max) = (0u128, u64::MAX, 0u64);
            for &(key, t, repeat, purge) in &calls {
                let now = Instant::from_nanos(t);
                min = min.min(t);
                max = max.max(t);
                for _ in 0..repeat {
                    single_admitted += u128::from(single.check(now).is_allowed());
                    let e = per_key.entry(key).or_insert((t, t, 0));
                    e.0 = e.0.min(t);
                    e.1 = e.1.max(t);
                    e.2 += u128::from(table.check(&key, now).is_allowed());
                }
                if purge {
                    let _ = table.purge(now);
                }
            }
            prop_assert!(single_admitted <= budget(min, max), "one key: {} admitted, budget {}", single_admitted, budget(min, max));
            for (key, (min, max, admitted)) in per_key {
                prop_assert!(admitted <= budget(min, max), "key {}: {} admitted, budget {}", key, admitted, budget(min, max));
            }
        }
    }

    /// New parameters never give a key more than the larger limit in the
    /// window of the moment.
    #[test]
    fn a_reconfigured_window_admits_at_most_the_larger_limit_in_the_window_of_the_moment(
        before in 1u32..6,
        after in 1u32..6,
        period_ms in 1u64..100,
        used in 0u32..6,
        at in 0u64..100_000_000,
    ) {
        let period = Duration::from_millis(period_ms);
        let old = FixedWindow::new(period, before).unwrap();
        let new = FixedWindow::new(period, after).unwrap();
        let now = Instant::from_nanos(1_000_000_000 + at);
        let mut l = Limiter::new(old);
        let spent = (0..used).filter(|_| l.check(now).is_allowed()).count() as u32;
        l.reconfigure(new, now);
        let more = (0..12).filter(|_| l.check(now).is_allowed()).count() as u32;
        prop_assert_eq!(more, after.saturating_sub(spent));
    }
}

#[test]
fn windows_align_to_calendar_days_at_an_offset_from_utc() {
    // 2026-12-02T00:00:00Z.
    let utc_midnight = 1_796_169_600u64;
    let hour = 3_600u64;
    for (east, local_midnight) in [
        (0, utc_midnight),
        (7_200, utc_midnight - 2 * hour),
        (-18_000, utc_midnight + 5 * hour),
        (50_400, utc_midnight - 14 * hour),
        (-43_200, utc_midnight + 12 * hour),
    ] {
        let days = FixedWindow::days_at_utc_offset(east, 10).unwrap();
        let midnight = Instant::from_secs(local_midnight);
        assert_eq!(days.window_start(midnight), midnight, "UTC{east:+} s");
        assert_eq!(
            days.window_start(midnight - Duration::from_nanos(1)),
            midnight - Duration::from_secs(86_400),
            "the second before local midnight is the day before (UTC{east:+} s)"
        );
        assert_eq!(
            days.window_end(midnight),
            Some(midnight + Duration::from_secs(86_400))
        );
        // A day's quota, spent at 23:59 local time, comes back at midnight.
        let mut l = Limiter::new(days);
        let late = midnight - Duration::from_secs(60);
        assert_eq!(l.check_n(10, late).unwrap().remaining, 0);
        assert_eq!(
            l.check(late).retry_after(),
            Some(Duration::from_secs(60)),
            "UTC{east:+} s"
        );
        assert!(l.check_n(10, midnight).unwrap().is_allowed());
    }
    for east in [86_400, -86_400, i32::MAX, i32::MIN] {
        assert!(
            matches!(
                FixedWindow::days_at_utc_offset(east, 1),
                Err(LimiterError::OffsetAboveWindow { .. })
            ),
            "{east}"
        );
    }
    // Hours in a zone at +05:30 start at :30 UTC.
    let hours = FixedWindow::new(Duration::from_secs(3_600), 1)
        .unwrap()
        .with_utc_offset(19_800)
        .unwrap();
    assert_eq!(hours.offset(), Duration::from_secs(1_800));
    let hours = hours.with_utc_offset(-34_200).unwrap(); // UTC-09:30
    assert_eq!(hours.offset(), Duration::from_secs(1_800));
    let hours = hours.with_utc_offset(-3_600).unwrap();
    assert_eq!(hours.offset(), Duration::ZERO);
    let e = FixedWindow::days_at_utc_offset(90_000, 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "an offset of 90000 s must be shorter than the window of 86400 s"
    );
    assert_eq!(
        FixedWindow::days_at_utc_offset(0, 0).unwrap_err(),
        LimiterError::ZeroLimit
    );
}

#[test]
fn impossible_parameters_are_refused_and_offsets_wrap() {
    assert_eq!(
        FixedWindow::new(Duration::ZERO, 1).unwrap_err(),
        LimiterError::ZeroWindow
    );
    assert_eq!(
        FixedWindow::new(Duration::from_secs(1), 0).unwrap_err(),
        LimiterError::ZeroLimit
    );
    let hours = FixedWindow::new(Duration::from_secs(3_600), 1).unwrap();
    assert_eq!(
        hours.with_offset(Duration::from_secs(3_600 + 60)).offset(),
        Duration::from_secs(60),
        "an offset of a period and a minute aligns as one of a minute"
    );
    // Before the first boundary, readings share the window [0, offset).
    let late = hours.with_offset(Duration::from_secs(600));
    assert_eq!(late.window_start(Instant::from_secs(599)), Instant::ZERO);
    assert_eq!(
        late.window_end(Instant::ZERO),
        Some(Instant::from_secs(600))
    );
    assert_eq!(
        late.window_start(Instant::from_secs(600 + 3_599)),
        Instant::from_secs(600)
    );
}

#[test]
fn reports_give_the_quota_left_and_the_next_boundary() {
    let minute = FixedWindow::new(Duration::from_secs(60), 5).unwrap();
    let mut l = Limiter::new(minute);
    let t = Instant::from_secs(600);
    let r = l.check_n(0, t + Duration::from_secs(10)).unwrap();
    assert_eq!(
        (r.remaining, r.reset_after),
        (5, Duration::ZERO),
        "a key that used nothing is new"
    );
    let r = l.check_n(2, t + Duration::from_secs(10)).unwrap();
    assert_eq!(
        (r.limit, r.remaining, r.reset_after),
        (5, 3, Duration::from_secs(50))
    );
    let r = l.check_n(4, t + Duration::from_secs(20)).unwrap();
    assert_eq!(r.retry_after(), Some(Duration::from_secs(40)));
    assert_eq!((r.remaining, r.reset_after), (3, Duration::from_secs(40)));
    // A reading from the window before is charged to this one: a clock
    // that steps back gets no second quota.
    let r = l.check_n(3, t - Duration::from_secs(1)).unwrap();
    assert!(r.is_allowed());
    let r = l.check(t - Duration::from_secs(1));
    assert_eq!(
        r.retry_after(),
        Some(Duration::from_secs(61)),
        "measured from the caller's reading"
    );
    assert_eq!(
        minute.fresh_at(l.state()),
        Some(t + Duration::from_secs(60))
    );
}

#[test]
fn new_parameters_keep_what_a_key_used_in_the_window_of_the_moment() {
    let t = Instant::from_secs(3_600);
    let hour = |limit| FixedWindow::new(Duration::from_secs(3_600), limit).unwrap();
    let mut l = Limiter::new(hour(4));
    assert!(l.check_n(4, t).unwrap().is_allowed());
    // Raised: the difference at once.
    l.reconfigure(hour(6), t + Duration::from_secs(1));
    assert_eq!(l.check_n(2, t).unwrap().remaining, 0);
    // Lowered below what was used: refused until the window ends.
    l.reconfigure(hour(3), t + Duration::from_secs(2));
    let r = l.check(t + Duration::from_secs(2));
    assert_eq!(r.retry_after(), Some(Duration::from_secs(3_598)));
    assert!(l.check(t + Duration::from_secs(3_600)).is_allowed());
    // A shorter period: the units move to the new window of the moment.
    let mut l = Limiter::new(hour(4));
    assert!(l.check_n(4, t).unwrap().is_allowed());
    let minutes = FixedWindow::new(Duration::from_secs(60), 4).unwrap();
    l.reconfigure(minutes, t + Duration::from_secs(90));
    assert_eq!(
        l.state().window_start(),
        t + Duration::from_secs(60),
        "charged to the minute that holds the reconfiguration"
    );
    assert!(l.check(t + Duration::from_secs(119)).is_denied());
    assert!(l.check(t + Duration::from_secs(120)).is_allowed());
    // A window that had ended under the old parameters leaves the key new.
    let mut l = Limiter::new(minutes);
    assert!(l.check_n(4, t).unwrap().is_allowed());
    l.reconfigure(hour(4), t + Duration::from_secs(60));
    assert_eq!(*l.state(), WindowCount::NEW);
}

#[test]
fn a_forgotten_key_is_not_new_at_an_earlier_reading() {
    let minute = FixedWindow::new(Duration::from_secs(60), 2).unwrap();
    let mut table: Keyed<u8, FixedWindow, 1> = Keyed::new(minute, FullPolicy::DenyNewKeys);
    let t = Instant::from_secs(600);
    assert!(table.check_n(&1, 2, t).unwrap().is_allowed());
    // At the next boundary key 1 is settled and gives its slot to key 2.
    assert!(table.check(&2, t + Duration::from_secs(60)).is_allowed());
    // Key 1, back with a reading from its spent window, is still spent.
    assert!(table.check(&1, t + Duration::from_secs(30)).is_denied());
}

//! Scope and key encoding (collision-free, documented layout) and planned
//! slots (epoch-aligned, the original's advance rule).

use std::collections::HashMap;
use std::time::Duration;

use guard_core::lock::{
    DEFAULT_PREFIX, KeyError, MAX_KEY_LEN, Scope, Token, TokenId, Ttl, active_key, once_key,
};
use guard_core::slot::{Every, InvalidPeriod, Schedule, SlotTimer, UnixMillis};
use proptest::prelude::*;

fn scope(component: &str, segments: &[(&str, &str)]) -> Scope {
    segments
        .iter()
        .try_fold(Scope::new(component).unwrap(), |s, (l, v)| s.segment(l, v))
        .unwrap()
}

#[test]
fn key_layout_is_documented_and_stable() {
    let s = scope(
        "endpoint/schedule",
        &[("owner", "tenantA"), ("chain", "chainA"), ("router", "r1")],
    );
    assert_eq!(
        once_key(DEFAULT_PREFIX, &s, "1767225600000")
            .unwrap()
            .as_str(),
        "guard:once:endpoint/schedule:owner=tenantA:chain=chainA:router=r1:1767225600000"
    );
    assert_eq!(
        active_key("prod1:", &s).unwrap().as_str(),
        "prod1:active:endpoint/schedule:owner=tenantA:chain=chainA:router=r1"
    );
}

#[test]
fn empty_segments_are_skipped_without_aliasing() {
    let owner_only = scope("c", &[("owner", "x"), ("chain", "")]);
    let chain_only = scope("c", &[("owner", ""), ("chain", "x")]);
    assert_eq!(owner_only.as_str(), "c:owner=x");
    assert_eq!(chain_only.as_str(), "c:chain=x");
    assert_ne!(owner_only, chain_only, "the original gave both c:x");
}

#[test]
fn separators_and_braces_in_values_are_escaped() {
    let a = scope("c", &[("owner", "a:b")]);
    let b = scope("c", &[("owner", "a"), ("b", "")]);
    assert_eq!(a.as_str(), "c:owner=a%3Ab");
    assert_ne!(a, b);
    let braces = once_key("", &scope("{c}", &[]), "{k}%").unwrap();
    assert_eq!(braces.as_str(), "once:%7Bc%7D:%7Bk%7D%25");
    assert!(!braces.contains('{'), "no accidental Redis hash tag");
}

#[test]
fn bad_labels_and_long_keys_are_errors() {
    let s = Scope::new("c").unwrap();
    for label in ["", "Owner", "a:b", "a=b", "a b"] {
        assert_eq!(
            s.clone().segment(label, "v").unwrap_err(),
            KeyError::InvalidLabel,
            "{label:?}"
        );
    }
    let long = "x".repeat(200);
    assert_eq!(
        Scope::new(&long).unwrap_err(),
        KeyError::TooLong { limit: 128 }
    );
    let err = once_key(DEFAULT_PREFIX, &s, &long.repeat(2)).unwrap_err();
    assert_eq!(err, KeyError::TooLong { limit: MAX_KEY_LEN });
    assert_eq!(err.to_string(), "key or scope longer than 256 bytes");
}

#[test]
fn ttl_below_one_millisecond_is_refused() {
    assert!(Ttl::new(Duration::ZERO).is_err());
    assert!(Ttl::new(Duration::from_micros(999)).is_err());
    assert!(Ttl::from_millis(0).is_err());
    assert_eq!(Ttl::from_millis(1).unwrap().as_millis_ceil(), 1);
    assert_eq!(
        Ttl::new(Duration::from_micros(1_500))
            .unwrap()
            .as_millis_ceil(),
        2
    );
    assert_eq!(
        Ttl::new(Duration::from_micros(999))
            .unwrap_err()
            .to_string(),
        "a lock TTL must be at least 1 ms"
    );
}

#[test]
fn token_ids_print_as_32_hex_digits_and_parse_back() {
    let id = TokenId([0xab; 16]);
    let hex = id.to_string();
    assert_eq!(hex, "ab".repeat(16));
    assert_eq!(TokenId::from_hex(&hex), Some(id));
    assert_eq!(TokenId::from_hex(&hex.to_uppercase()), Some(id));
    assert_eq!(TokenId::from_hex("abc"), None);
    assert_eq!(TokenId::from_hex(&"zz".repeat(16)), None);
    assert_eq!(Token::new(id, 9).fence(), 9);
}

#[test]
fn every_second_slots_are_aligned_to_the_epoch() {
    let every = Every::new(Duration::from_secs(1)).unwrap();
    assert_eq!(
        every.slot_of(UnixMillis(1_767_225_600_999)),
        UnixMillis(1_767_225_600_000)
    );
    assert_eq!(
        every.next_after(UnixMillis(1_767_225_600_000)),
        Some(UnixMillis(1_767_225_601_000))
    );
    // Replicas started at different instants agree on the slots.
    let a = SlotTimer::new(every, UnixMillis(10_123));
    let b = SlotTimer::new(every, UnixMillis(10_877));
    assert_eq!(a.next_fire(), b.next_fire());
    assert_eq!(Every::new(Duration::ZERO), Err(InvalidPeriod));
    assert_eq!(Every::new(Duration::from_micros(1_500)), Err(InvalidPeriod));
}

#[test]
fn advance_slot_maps_early_timers_to_the_planned_slot_and_skips_stale_ones() {
    // The original's TestAdvanceSlot, with base = 1,000 s.
    let every = Every::new(Duration::from_secs(1)).unwrap();
    let base = 1_000_000;
    let mut late = SlotTimer::new(every, UnixMillis(base - 1));
    assert_eq!(late.next_fire(), Some(UnixMillis(base)));
    assert_eq!(
        late.fire(UnixMillis(base + 3_500)),
        Some(UnixMillis(base + 3_000))
    );
    assert_eq!(late.next_fire(), Some(UnixMillis(base + 4_000)));

    let mut early = SlotTimer::new(every, UnixMillis(base + 4_000));
    assert_eq!(early.next_fire(), Some(UnixMillis(base + 5_000)));
    assert_eq!(early.fire(UnixMillis(base)), Some(UnixMillis(base + 5_000)));
    assert_eq!(early.next_fire(), Some(UnixMillis(base + 6_000)));
}

/// A schedule with no arithmetic shortcut, to exercise the default walk.
struct Listed(Vec<u64>);

impl Schedule for Listed {
    fn next_after(&self, t: UnixMillis) -> Option<UnixMillis> {
        self.0.iter().copied().find(|&x| x > t.0).map(UnixMillis)
    }
}

#[test]
fn the_default_walk_finds_the_newest_slot_and_ends_with_the_schedule() {
    let mut timer = SlotTimer::new(Listed(vec![10, 20, 30, 40]), UnixMillis(0));
    assert_eq!(timer.fire(UnixMillis(35)), Some(UnixMillis(30)));
    assert_eq!(timer.next_fire(), Some(UnixMillis(40)));
    assert_eq!(timer.fire(UnixMillis(41)), Some(UnixMillis(40)));
    assert_eq!(timer.next_fire(), None);
    assert_eq!(timer.fire(UnixMillis(50)), None);
}

/// (component, non-empty segments, delivery key).
type KeyInput = (String, Vec<(String, String)>, String);

fn segment_value() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-c:%{}=]{0,4}",]
}

proptest! {
    /// Distinct (component, segments, delivery key) inputs never give the
    /// same key, once empty segments are taken as absent.
    #[test]
    fn distinct_inputs_never_share_a_key(
        inputs in prop::collection::vec(
            ("[a-c:%{}]{0,3}", prop::collection::vec((prop::sample::select(vec!["owner", "chain", "router"]), segment_value()), 0..3), "[a-c:%{}]{0,3}"),
            1..40,
        ),
    ) {
        let mut seen: HashMap<String, KeyInput> = HashMap::new();
        for (component, segments, key) in inputs {
            let scope = segments.iter().try_fold(Scope::new(&component).unwrap(), |s, (l, v)| s.segment(l, v)).unwrap();
            let full = once_key(DEFAULT_PREFIX, &scope, &key).unwrap().to_string();
            let canonical: Vec<_> = segments.into_iter().filter(|(_, v)| !v.is_empty()).map(|(l, v)| (l.to_string(), v)).collect();
            let input = (component, canonical, key);
            if let Some(previous) = seen.insert(full.clone(), input.clone()) {
                prop_assert_eq!(previous, input, "two inputs share {}", full);
            }
        }
    }

    /// Epoch-aligned slots: every replica's timer, whenever it started and
    /// however late it fires, lands on a multiple of the period, never
    /// goes backwards and never runs a slot in the future.
    #[test]
    fn slots_are_multiples_never_future_never_repeated(
        period_ms in 1u64..10_000,
        start in 0u64..1_000_000_000,
        lateness in prop::collection::vec(0u64..30_000, 1..50),
    ) {
        let every = Every::new(Duration::from_millis(period_ms)).unwrap();
        let mut timer = SlotTimer::new(every, UnixMillis(start));
        let mut last: Option<UnixMillis> = None;
        for late in lateness {
            let planned = timer.next_fire().unwrap();
            let now = UnixMillis(planned.0 + late);
            let slot = timer.fire(now).unwrap();
            prop_assert_eq!(slot.0 % period_ms, 0);
            prop_assert!(slot <= now);
            prop_assert!(slot >= planned);
            prop_assert!(last.is_none_or(|l| slot > l), "slot repeated or went back");
            prop_assert!(now.0 - slot.0 < period_ms, "the newest slot is run");
            last = Some(slot);
        }
    }
}

#[test]
fn prefixes_and_raw_keys_that_would_split_cluster_slots_are_refused() {
    use guard_core::lock::check_prefix;
    use guard_core::lock::redis::{InvalidRedisKey, RedisKeys};
    let s = scope("consumer", &[]);
    // A guard prefix with a brace: refused by the key builders, named.
    for prefix in ["}", "p{", "a}b:"] {
        assert_eq!(check_prefix(prefix), Err(KeyError::BraceInPrefix));
        assert_eq!(once_key(prefix, &s, "m1"), Err(KeyError::BraceInPrefix));
        assert_eq!(active_key(prefix, &s), Err(KeyError::BraceInPrefix));
    }
    assert!(
        KeyError::BraceInPrefix.to_string().contains("'{' or '}'"),
        "the message names the rule"
    );
    // A locker prefix with a brace, and raw keys whose domain starts with
    // '}' (an empty hash tag): refused where the Redis keys are built.
    assert_eq!(
        RedisKeys::new("p{", "guard:once:s:1"),
        Err(InvalidRedisKey::BraceInPrefix)
    );
    for key in ["}x:1", "}", "}once:scope:slot"] {
        assert_eq!(
            RedisKeys::new("", key),
            Err(InvalidRedisKey::DomainStartsWithBrace),
            "{key}"
        );
    }
    // A brace later in a raw domain leaves both keys on one tag.
    assert!(RedisKeys::new("prod1:", "a}b:1").is_ok());
}

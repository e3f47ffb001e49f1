//! The bounded keyed table: memory stays fixed, and eviction never lets a
//! key through more often than its limit allows.

use std::collections::HashMap;
use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::limit::{
    Algorithm, Decision, FullPolicy, Keyed, KeyedSlot, KeyedSlots, Limiter, Rate, SharedKeyed,
    SlidingWindow, TokenBucket,
};
use guard_core::time::Instant;

const CAPACITY: usize = 1024;

/// Checks that the admissions of each key, taken alone, are a schedule the
/// limiter itself would admit from a new key: if a key ever got a fresh
/// bucket while busy, some admission would fail this check.
struct PerKeyAudit<A: guard_core::limit::Algorithm + Clone> {
    algorithm: A,
    per_key: HashMap<u64, Limiter<A>>,
}

impl<A: guard_core::limit::Algorithm + Clone> PerKeyAudit<A> {
    fn admitted(&mut self, key: u64, now: Instant) {
        let limiter = self
            .per_key
            .entry(key)
            .or_insert_with(|| Limiter::new(self.algorithm.clone()));
        assert!(
            limiter.check(now).is_allowed(),
            "key {key} admitted at {now:?} beyond its own limit"
        );
    }
}

/// Runs `requests` through a fresh table: half go to 200 hot keys that come
/// back while still limited, half churn through 100,000 distinct keys.
fn churn(
    bucket: TokenBucket,
    requests: u64,
    step: Duration,
) -> (guard_core::limit::KeyedStats, usize) {
    let mut table: Keyed<u64, TokenBucket, CAPACITY> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    let mut audit = PerKeyAudit {
        algorithm: bucket,
        per_key: HashMap::new(),
    };
    let size = std::mem::size_of_val(&table);
    let mut now = Instant::from_secs(1);
    for i in 0..requests {
        let key = if i % 2 == 0 {
            1_000_000 + (i / 2) % 200
        } else {
            ((i / 2) * 7_919) % 100_000
        };
        now = now + step;
        match table.check(&key, now) {
            Decision::Allowed => audit.admitted(key, now),
            Decision::Denied { retry_after } => assert!(retry_after > Duration::ZERO),
        }
        assert!(table.len() <= CAPACITY);
    }
    assert_eq!(std::mem::size_of_val(&table), size, "memory is fixed");
    let distinct_admitted = audit.per_key.keys().filter(|k| **k < 1_000_000).count();
    (table.stats(), distinct_admitted)
}

#[test]
fn churning_100k_keys_through_1024_slots_never_over_admits() {
    // Keys busy for 200 ms after a burst of 2: slots turn over constantly.
    let short = TokenBucket::new(2, Rate::per(1, Duration::from_millis(100))).unwrap();
    let (stats, distinct) = churn(short, 300_000, Duration::from_micros(200));
    assert!(stats.replaced > 100_000, "slots were reused: {stats:?}");
    // A key is refused only for lack of room, never because another key's
    // eviction left it with a used-up state.
    assert!(
        distinct as u64 + stats.denied_no_room >= 100_000,
        "{distinct} keys admitted: {stats:?}"
    );
    assert!(distinct >= 99_000, "{distinct} keys admitted: {stats:?}");

    // Keys busy for 20 s: the table fills and new keys wait for room.
    let long = TokenBucket::new(2, Rate::per(1, Duration::from_secs(10))).unwrap();
    let (stats, _) = churn(long, 1_000_000, Duration::from_micros(200));
    assert!(stats.denied_no_room > 0, "the table filled up: {stats:?}");
    assert!(
        stats.replaced > 0,
        "and reused slots once keys settled: {stats:?}"
    );
}

#[test]
fn churn_with_sliding_windows_never_over_admits() {
    let window = SlidingWindow::<3>::new(Duration::from_secs(5), 3).unwrap();
    let mut table: Keyed<u64, SlidingWindow<3>, 256> = Keyed::new(window, FullPolicy::DenyNewKeys);
    let mut audit = PerKeyAudit {
        algorithm: window,
        per_key: HashMap::new(),
    };
    let mut now = Instant::from_secs(1);
    for i in 0..100_000u64 {
        let key = (i * 104_729) % 20_000;
        now = now + Duration::from_micros(500);
        if table.check(&key, now).is_allowed() {
            audit.admitted(key, now);
        }
    }
    assert!(table.stats().replaced > 0);
}

#[test]
fn a_full_table_denies_new_keys_until_a_slot_can_be_forgotten() {
    let bucket = TokenBucket::new(1, Rate::per_second(1)).unwrap();
    let mut table: Keyed<u64, TokenBucket, 8> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    let t = Instant::from_secs(10);
    for key in 0..8 {
        assert!(table.check(&key, t).is_allowed());
    }
    // Every slot is busy for one more second.
    assert_eq!(
        table.check(&100, t + Duration::from_millis(400)),
        Decision::Denied {
            retry_after: Duration::from_millis(600)
        }
    );
    assert_eq!(table.stats().denied_no_room, 1);
    // Tracked keys are still decided normally.
    assert!(table.check(&3, t + Duration::from_millis(400)).is_denied());
    // Once the buckets have refilled, a slot is reused and the new key is in.
    assert!(table.check(&100, t + Duration::from_secs(1)).is_allowed());
    assert_eq!(table.stats().replaced, 1);
    assert_eq!(table.len(), 8);
}

#[test]
fn an_evicted_key_behaves_like_a_new_one_and_busy_keys_are_never_evicted() {
    let bucket = TokenBucket::new(2, Rate::per_second(1)).unwrap();
    let mut table: Keyed<u64, TokenBucket, 8> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
    let t = Instant::from_secs(10);
    for key in 0..8 {
        assert!(table.check(&key, t).is_allowed());
    }
    // Key 0 uses its second token; the others refill after 1 s, key 0 after 2 s.
    assert!(table.check(&0, t).is_allowed());
    let later = t + Duration::from_millis(1500);
    for key in 100..107 {
        assert!(table.check(&key, later).is_allowed(), "key {key}");
    }
    assert!(table.state(&0).is_some(), "key 0 is still busy and kept");
    for key in 1..8 {
        assert!(table.state(&key).is_none(), "settled key {key} made room");
    }
    // Key 0 kept its history: 1.5 tokens, so one admission, not two.
    assert!(table.check(&0, later).is_allowed());
    assert!(table.check(&0, later).is_denied());
    let much_later = t + Duration::from_secs(60);
    assert_eq!(table.purge(much_later), 8);
    assert!(table.is_empty());
    assert!(table.check(&1, much_later).is_allowed());
    assert!(table.check(&1, much_later).is_allowed());
    assert!(table.check(&1, much_later).is_denied());
}

#[test]
fn shared_overflow_limits_crowded_out_keys_together() {
    let bucket = TokenBucket::new(2, Rate::per(1, Duration::from_secs(60))).unwrap();
    let mut table: Keyed<u64, TokenBucket, 8> = Keyed::new(bucket, FullPolicy::SharedOverflow);
    let t = Instant::from_secs(10);
    for key in 0..8 {
        assert!(table.check(&key, t).is_allowed());
    }
    // 100 crowded-out keys share one bucket of 2.
    let admitted = (100..200)
        .filter(|key| table.check(key, t).is_allowed())
        .count();
    assert_eq!(admitted, 2);
    assert_eq!(table.stats().overflowed, 100);
    table.clear();
    assert!(table.is_empty());
    assert!(table.check(&100, t).is_allowed());
}

/// How full two-choice sets of eight get before the first new key finds
/// no room when nothing may be forgotten: past 93% of the slots (96% at
/// this size, with one resident moved to its other set when both of a new
/// key's sets are full), so 1.125 slots per key hold every key.
#[test]
fn a_table_of_busy_keys_fills_past_ninety_five_percent() {
    const SLOTS: usize = 1 << 13;
    let bucket = TokenBucket::new(1, Rate::per_second(1)).unwrap();
    let mut table: Box<Keyed<u64, TokenBucket, SLOTS>> =
        Box::new(Keyed::new(bucket, FullPolicy::DenyNewKeys));
    let now = Instant::from_secs(1);
    let mut key = 0u64;
    // Each admitted key has spent its only token: it is busy, never forgettable.
    while table.check(&key, now).is_allowed() {
        key += 1;
    }
    let fill = table.len() as f64 / SLOTS as f64;
    assert!(fill > 0.93, "filled {fill:.3} of the slots");
}

/// The stack a test thread gets here: far below a table of 131,072 token
/// buckets (3 MiB), so a table that passed through the stack on its way to
/// the heap would overflow it.
const SMALL_STACK: usize = 256 * 1024;

/// `N` empty slots, written one at a time straight into the heap.
fn boxed_slots<A: Algorithm, const N: usize>() -> Box<KeyedSlots<u64, A, N>> {
    (0..N)
        .map(|_| KeyedSlot::EMPTY)
        .collect::<Box<[_]>>()
        .try_into()
        .unwrap_or_else(|_| unreachable!("N slots were collected"))
}

/// Runs `f` on a thread with [`SMALL_STACK`].
fn on_a_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(SMALL_STACK)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_table_of_131072_keys_is_built_on_the_heap_from_a_small_stack() {
    const KEYS: usize = 131_072;
    on_a_small_stack(|| {
        let bucket = TokenBucket::new(1, Rate::per_second(1)).unwrap();
        let mut table = Keyed::with_storage(
            bucket,
            FullPolicy::DenyNewKeys,
            boxed_slots::<TokenBucket, KEYS>(),
        );
        assert_eq!(table.capacity(), KEYS);
        assert!(table.is_empty());
        let t = Instant::from_secs(10);
        // Three quarters full: each key has its one token, then none.
        for key in 0..(KEYS as u64 / 4 * 3) {
            assert!(table.check(&key, t).is_allowed(), "key {key}");
            assert_eq!(
                table.check(&key, t).retry_after(),
                Some(Duration::from_secs(1)),
                "key {key}"
            );
        }
        assert_eq!(table.len(), KEYS / 4 * 3);
        assert_eq!(table.stats().denied_no_room, 0);
        // A second later every bucket has refilled once.
        let later = t + Duration::from_secs(1);
        assert!((0..1_000).all(|key| table.check(&key, later).is_allowed()));
        assert!((0..1_000).all(|key| table.check(&key, later).is_denied()));
    });
}

#[test]
fn a_shared_table_on_the_heap_decides_through_a_shared_reference() {
    const KEYS: usize = 131_072;
    on_a_small_stack(|| {
        let bucket = TokenBucket::new(2, Rate::per_second(1)).unwrap();
        let shared: SharedKeyed<CriticalSectionRawMutex, u64, TokenBucket, KEYS, _, _> =
            SharedKeyed::new(Keyed::with_storage(
                bucket,
                FullPolicy::DenyNewKeys,
                boxed_slots::<TokenBucket, KEYS>(),
            ));
        let t = Instant::from_secs(10);
        let admitted: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    let shared = &shared;
                    std::thread::Builder::new()
                        .stack_size(SMALL_STACK)
                        .spawn_scoped(s, move || {
                            (0..10_000u64)
                                .filter(|key| shared.check(key, t).is_allowed())
                                .count()
                        })
                        .unwrap()
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(admitted, 2 * 10_000, "two tokens per key, whoever asks");
        assert_eq!(shared.len(), 10_000);
    });
}

#[test]
fn a_table_over_borrowed_slots_starts_empty_whatever_they_held() {
    let bucket = TokenBucket::new(1, Rate::per_second(1)).unwrap();
    let mut slots: KeyedSlots<u64, TokenBucket, 16> = [const { KeyedSlot::EMPTY }; 16];
    let t = Instant::from_secs(10);
    {
        let mut first = Keyed::with_storage(bucket, FullPolicy::DenyNewKeys, &mut slots);
        assert!((0..16).all(|key| first.check(&key, t).is_allowed()));
        assert!(first.check(&99, t).is_denied(), "full of busy keys");
    }
    let mut second = Keyed::with_storage(bucket, FullPolicy::DenyNewKeys, &mut slots);
    assert!(second.is_empty());
    assert_eq!(second.capacity(), 16);
    assert!(second.check(&1, t).is_allowed(), "a new table, new keys");
    assert!(second.check(&99, t).is_allowed());
    assert_eq!(second.len(), 2);
}

/// What one churn run saw: new keys refused for lack of room, and entries
/// replaced.
#[derive(Debug)]
struct ChurnBesideBusyKeys {
    refused: u64,
    replaced: u64,
}

/// Distinct keys arrive one a millisecond through a table of `N` slots
/// beside `hot` keys that come back in turn, one a millisecond, and never
/// settle. Each bucket holds one token and refills in a time chosen so that
/// `percent_busy` of the slots hold busy keys at steady state (the table is
/// full of settled ones around them). Each distinct key comes back once
/// while still busy: if its state had been forgotten it would be admitted
/// again; the hot keys' admissions are audited against their own limit.
fn churn_beside_busy_keys<const N: usize>(
    percent_busy: u64,
    distinct: u64,
    hot: u64,
) -> ChurnBesideBusyKeys {
    let busy_ms = N as u64 * percent_busy / 100 - hot;
    let bucket = TokenBucket::new(1, Rate::per(1, Duration::from_millis(busy_ms))).unwrap();
    let mut table = Keyed::with_storage(
        bucket,
        FullPolicy::DenyNewKeys,
        boxed_slots::<TokenBucket, N>(),
    );
    let mut audit = PerKeyAudit {
        algorithm: bucket,
        per_key: HashMap::new(),
    };
    // Distinct keys admitted on arrival, in arrival order, until they come back.
    let mut admitted = std::collections::VecDeque::new();
    let start = Instant::from_secs(1);
    for tick in 0..distinct {
        let now = start + Duration::from_millis(tick);
        let key = u64::MAX - tick;
        if table.check(&key, now).is_allowed() {
            admitted.push_back((key, now));
        }
        while let Some(&(back, at)) = admitted.front() {
            if now.saturating_duration_since(at) < Duration::from_millis(busy_ms / 2) {
                break;
            }
            admitted.pop_front();
            assert!(
                table.check(&back, now).is_denied(),
                "key {back} admitted at {at:?} got a fresh bucket at {now:?}"
            );
        }
        let hot_key = tick % hot;
        if table.check(&hot_key, now).is_allowed() {
            audit.admitted(hot_key, now);
        }
    }
    let stats = table.stats();
    ChurnBesideBusyKeys {
        refused: stats.denied_no_room,
        replaced: stats.replaced,
    }
}

/// A table full of settled keys gives their slots to new keys: with a third,
/// three fifths or four fifths of the slots busy, no new key is refused and
/// no busy key is reset. (When a new key's two sets hold only busy keys, one
/// of their residents moves over a settled key in its other set; before it
/// did, this run refused 9, 2,321 and 14,950 of its 300,000 new keys.)
#[test]
fn a_table_full_of_settled_keys_refuses_no_new_key_while_most_slots_are_busy() {
    for percent_busy in [33, 62, 80] {
        let run = churn_beside_busy_keys::<9_000>(percent_busy, 300_000, 100);
        assert_eq!(run.refused, 0, "{percent_busy}% busy: {run:?}");
        assert!(run.replaced > 250_000, "{percent_busy}% busy: {run:?}");
    }
}

/// The same at full size: the table for a million keys (1,125,000 slots)
/// fed 10 million distinct keys beside 1,000 busy ones. Run with
/// `GUARD_KEYED_LONG=1` (a few minutes).
#[test]
fn a_table_for_a_million_keys_refuses_no_new_key_under_ten_million_distinct_ones() {
    if std::env::var_os("GUARD_KEYED_LONG").is_none() {
        return;
    }
    for percent_busy in [33, 62, 80] {
        let run = churn_beside_busy_keys::<1_125_000>(percent_busy, 10_000_000, 1_000);
        eprintln!("{percent_busy}% busy: {run:?}");
        assert_eq!(run.refused, 0, "{percent_busy}% busy: {run:?}");
    }
}

//! FailedElement and dead-letter queue cases from the original (B2, B9),
//! the shared queue under threads, and a model-based property test.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::dlq::{DeadLetterQueue, FailedElement, SharedDeadLetterQueue, UNKNOWN_ERROR};
use guard_core::time::Instant;
use proptest::prelude::*;

const NOW: Instant = Instant::from_millis(1_700_000_000_123);

#[test]
fn failed_element_keeps_every_field() {
    let f = FailedElement::new("payload", Some("Test error"), 2, NOW);
    assert_eq!(*f.element(), "payload");
    assert_eq!(f.error(), Some(&"Test error"));
    assert_eq!(f.error_message().to_string(), "Test error");
    assert_eq!(f.attempts(), 2);
    assert_eq!(f.failed_at(), NOW);
    assert_eq!(f.into_element(), "payload");
}

#[test]
fn a_missing_or_empty_error_reads_unknown_error() {
    let none: FailedElement<u8, &str> = FailedElement::new(1, None, 1, NOW);
    assert_eq!(none.error_message().to_string(), UNKNOWN_ERROR);
    let empty = FailedElement::new(1, Some(""), 1, NOW);
    assert_eq!(empty.error_message().to_string(), "Unknown error");
}

#[test]
fn can_retry_compares_attempts_with_the_maximum() {
    let two = FailedElement::new((), Some("e"), 2, NOW);
    assert!(two.can_retry(3) && two.can_retry(4));
    assert!(!two.can_retry(2) && !two.can_retry(1));
    let zero = FailedElement::new((), Some("e"), 0, NOW);
    assert!(zero.can_retry(1));
    assert!(!zero.can_retry(0));
}

#[test]
fn failed_element_displays_like_the_original() {
    let f = FailedElement::new("x", Some("boom"), 3, NOW);
    assert_eq!(
        f.to_string(),
        "FailedElement{element=\"x\", errorMessage='boom', attemptCount=3, timestamp=1700000000123}"
    );
}

#[test]
fn works_with_several_element_types() {
    let mut numbers: DeadLetterQueue<u64, &str, 2> = DeadLetterQueue::new();
    let mut records: DeadLetterQueue<(String, Vec<u8>), String, 2> = DeadLetterQueue::new();
    assert!(numbers.add(1, Some("e"), 1, NOW).is_ok());
    assert!(
        records
            .add(("k".into(), vec![1, 2]), Some("e".into()), 1, NOW)
            .is_ok()
    );
    assert_eq!(records.peek().unwrap().element().1, vec![1, 2]);
}

#[test]
fn add_then_poll_keeps_element_message_and_attempts() {
    let mut q: DeadLetterQueue<&str, &str, 4> = DeadLetterQueue::new();
    q.add("a", Some("timeout"), 3, NOW).unwrap();
    let f = q.poll().unwrap();
    assert_eq!(
        (*f.element(), f.error(), f.attempts()),
        ("a", Some(&"timeout"), 3)
    );
}

#[test]
fn peek_returns_the_oldest_without_removing_it() {
    let mut q: DeadLetterQueue<&str, &str, 4> = DeadLetterQueue::new();
    q.add("a", None, 1, NOW).unwrap();
    q.add("b", None, 1, NOW).unwrap();
    assert_eq!(*q.peek().unwrap().element(), "a");
    assert_eq!(*q.peek().unwrap().element(), "a");
    assert_eq!(q.len(), 2);
}

#[test]
fn size_and_emptiness_follow_adds_and_polls() {
    let mut q: DeadLetterQueue<u8, &str, 4> = DeadLetterQueue::new();
    assert!(q.is_empty());
    assert_eq!(q.len(), 0);
    q.add(1, None, 1, NOW).unwrap();
    assert_eq!(q.len(), 1);
    q.add(2, None, 1, NOW).unwrap();
    assert_eq!(q.len(), 2);
    q.poll();
    assert_eq!(q.len(), 1);
    assert!(!q.is_empty());
}

#[test]
fn a_full_queue_hands_the_new_element_back() {
    let mut q: DeadLetterQueue<u8, &str, 2> = DeadLetterQueue::new();
    q.add(1, None, 1, NOW).unwrap();
    assert!(!q.is_full());
    q.add(2, None, 1, NOW).unwrap();
    assert!(q.is_full());
    let back = q.add(3, Some("late"), 5, NOW).unwrap_err();
    assert_eq!((*back.element(), back.attempts()), (3, 5));
    assert_eq!(q.len(), 2);
    assert_eq!(
        *q.peek().unwrap().element(),
        1,
        "the oldest is never evicted"
    );
    assert_eq!(q.capacity(), 2);
}

#[test]
fn iteration_keeps_order_and_does_not_drain() {
    let mut q: DeadLetterQueue<u8, &str, 4> = DeadLetterQueue::new();
    for i in 0..3 {
        q.add(i, None, 1, NOW).unwrap();
    }
    let seen: Vec<_> = q.iter().map(|f| *f.element()).collect();
    assert_eq!(seen, [0, 1, 2]);
    assert_eq!(q.len(), 3);
}

#[test]
fn clear_empties_and_an_empty_queue_polls_none_in_fifo_order() {
    let mut q: DeadLetterQueue<u8, &str, 4> = DeadLetterQueue::new();
    for i in 0..3 {
        q.add(i, None, 1, NOW).unwrap();
    }
    assert_eq!(q.clear(), 3);
    assert!(q.is_empty());
    assert!(q.poll().is_none() && q.peek().is_none());
    q.add(7, None, 1, NOW).unwrap();
    q.add(8, None, 1, NOW).unwrap();
    assert_eq!(q.poll().map(FailedElement::into_element), Some(7));
    assert_eq!(q.poll().map(FailedElement::into_element), Some(8));
}

type Shared<const N: usize> = SharedDeadLetterQueue<CriticalSectionRawMutex, u32, &'static str, N>;

#[test]
fn ten_threads_times_one_hundred_adds_are_all_kept() {
    let q: Arc<Shared<1000>> = Arc::new(SharedDeadLetterQueue::new());
    let handles: Vec<_> = (0..10u32)
        .map(|t| {
            let q = q.clone();
            thread::spawn(move || {
                for i in 0..100 {
                    q.add(t * 1000 + i, Some("e"), 1, NOW).unwrap();
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    assert_eq!(q.len(), 1000);
    assert!(q.is_full());
    // FIFO per producer.
    let mut last = [None; 10];
    while let Some(f) = q.poll() {
        let (t, i) = ((f.element() / 1000) as usize, f.element() % 1000);
        assert!(last[t].is_none_or(|prev| prev < i));
        last[t] = Some(i);
    }
}

#[test]
fn clearing_under_concurrent_adds_keeps_the_count_right() {
    let q: Arc<Shared<64>> = Arc::new(SharedDeadLetterQueue::new());
    let stop = Arc::new(AtomicBool::new(false));
    let adders: Vec<_> = (0..2)
        .map(|_| {
            let (q, stop) = (q.clone(), stop.clone());
            thread::spawn(move || {
                let (mut kept, mut handed_back) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    match q.add(1, None, 1, NOW) {
                        Ok(()) => kept += 1,
                        Err(f) => {
                            assert_eq!(*f.element(), 1);
                            handed_back += 1
                        }
                    }
                }
                (kept, handed_back)
            })
        })
        .collect();
    let clearer = {
        let (q, stop) = (q.clone(), stop.clone());
        thread::spawn(move || {
            let mut cleared = 0u64;
            while !stop.load(Ordering::Relaxed) {
                cleared += q.clear() as u64;
                let mut counted = 0;
                q.with_each(|_| counted += 1);
                assert!(counted <= 64);
            }
            cleared
        })
    };
    thread::sleep(Duration::from_millis(400));
    stop.store(true, Ordering::Relaxed);
    let kept: u64 = adders.into_iter().map(|h| h.join().unwrap().0).sum();
    let cleared = clearer.join().unwrap();
    let mut iterated = 0;
    q.with_each(|_| iterated += 1);
    assert_eq!(q.len(), iterated);
    assert!(q.len() <= 64);
    assert_eq!(
        kept,
        cleared + q.len() as u64,
        "nothing lost, nothing counted twice"
    );
}

#[test]
fn the_shared_queue_hands_back_instead_of_deadlocking_when_reentered() {
    let q: Shared<4> = SharedDeadLetterQueue::new();
    q.add(1, None, 1, NOW).unwrap();
    q.with_oldest(|oldest| {
        assert_eq!(oldest.map(|f| *f.element()), Some(1));
        assert_eq!(q.add(2, None, 1, NOW).map_err(|f| *f.element()), Err(2));
        assert!(q.poll().is_none());
    });
    assert_eq!(q.len(), 1);
}

static STATIC_DLQ: SharedDeadLetterQueue<CriticalSectionRawMutex, u8, &str, 2> =
    SharedDeadLetterQueue::new();

#[test]
fn a_shared_queue_can_be_a_static() {
    STATIC_DLQ.add(5, Some("x"), 1, NOW).unwrap();
    assert_eq!(STATIC_DLQ.poll().map(FailedElement::into_element), Some(5));
}

#[derive(Debug, Clone)]
enum Op {
    Add(u16),
    Poll,
    Peek,
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<u16>().prop_map(Op::Add),
        2 => Just(Op::Poll),
        1 => Just(Op::Peek),
        1 => Just(Op::Clear),
    ]
}

proptest! {
    #[test]
    fn queue_matches_a_vecdeque_model(ops in prop::collection::vec(op(), 1..300)) {
        let mut q: DeadLetterQueue<u16, (), 8> = DeadLetterQueue::new();
        let mut model: VecDeque<u16> = VecDeque::new();
        for op in ops {
            match op {
                Op::Add(x) => {
                    let r = q.add(x, None, 1, NOW).map_err(FailedElement::into_element);
                    if model.len() < 8 { model.push_back(x); prop_assert_eq!(r, Ok(())); }
                    else { prop_assert_eq!(r, Err(x)); }
                }
                Op::Poll => prop_assert_eq!(q.poll().map(FailedElement::into_element), model.pop_front()),
                Op::Peek => prop_assert_eq!(q.peek().map(|f| *f.element()), model.front().copied()),
                Op::Clear => { prop_assert_eq!(q.clear(), model.len()); model.clear(); }
            }
            prop_assert_eq!(q.len(), model.len());
            prop_assert_eq!(q.is_full(), model.len() == 8);
            prop_assert!(q.iter().map(|f| *f.element()).eq(model.iter().copied()));
        }
    }
}

//! The dead-letter queue against a `VecDeque` model.
#![no_main]

use std::collections::VecDeque;

use arbitrary::Arbitrary;
use guard_core::dlq::{DeadLetterQueue, FailedElement};
use guard_core::time::Instant;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Op {
    Add(u16),
    Poll,
    Peek,
    Clear,
}

fuzz_target!(|ops: Vec<Op>| {
    let mut q: DeadLetterQueue<u16, (), 8> = DeadLetterQueue::new();
    let mut model: VecDeque<u16> = VecDeque::new();
    for op in ops {
        match op {
            Op::Add(x) => {
                let r = q
                    .add(x, None, 1, Instant::ZERO)
                    .map_err(FailedElement::into_element);
                if model.len() < 8 {
                    model.push_back(x);
                    assert_eq!(r, Ok(()));
                } else {
                    assert_eq!(r, Err(x), "a full queue hands the element back");
                }
            }
            Op::Poll => assert_eq!(q.poll().map(FailedElement::into_element), model.pop_front()),
            Op::Peek => assert_eq!(q.peek().map(|f| *f.element()), model.front().copied()),
            Op::Clear => {
                assert_eq!(q.clear(), model.len());
                model.clear();
            }
        }
        assert_eq!(q.len(), model.len());
        assert!(q.iter().map(|f| *f.element()).eq(model.iter().copied()));
    }
});

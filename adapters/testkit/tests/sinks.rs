//! The sink contract catches a sink breaking each of its rules: an
//! in-memory sink passes the suite as written, and the same sink with one
//! rule broken fails the check that names that rule.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;

use futures_lite::future::block_on;
use guard_testkit::sinks::{self, Answered, Sent, SinkUnderTest};

/// The rule a [`MemorySink`] breaks, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// `Ok` without the receiver taking the message.
    OkWithoutTaking,
    /// The payload changed on the way.
    ChangesPayload,
    /// One call, two messages taken.
    TakesTwice,
    /// `Ok` while the receiver is down.
    OkWhileDown,
    /// A refusal for good while the receiver is down.
    PermanentWhileDown,
    /// Never delivers again once it was down.
    StaysDown,
    /// A new id on every attempt.
    NewIdOnRepeat,
    /// Fences not checked.
    IgnoresFence,
    /// Fences compared as floating-point numbers (as a Lua script's
    /// `tonumber` would): above 2^53 neighbours are equal.
    ComparesAsFloat,
    /// The first fence taken is kept as the highest for good.
    KeepsFirstFence,
}

/// A sink and its receiver in one: a list of what was taken, a fence.
struct MemorySink {
    fault: Fault,
    deduplicates: bool,
    taken: RefCell<Vec<Sent>>,
    highest: Cell<Option<u64>>,
    down: Cell<bool>,
    was_down: Cell<bool>,
    calls: Cell<u32>,
    sent: RefCell<HashSet<String>>,
}

impl MemorySink {
    fn new(fault: Fault, deduplicates: bool) -> Self {
        MemorySink {
            fault,
            deduplicates,
            taken: RefCell::default(),
            highest: Cell::new(None),
            down: Cell::new(false),
            was_down: Cell::new(false),
            calls: Cell::new(0),
            sent: RefCell::default(),
        }
    }

    fn answer(&self, message: &Sent) -> Answered {
        self.calls.set(self.calls.get() + 1);
        if self.down.get() {
            return match self.fault {
                Fault::OkWhileDown => Answered::Delivered,
                Fault::PermanentWhileDown => Answered::Permanent("down".into()),
                _ => Answered::Transient("connection refused".into()),
            };
        }
        if self.fault == Fault::StaysDown && self.was_down.get() {
            return Answered::Transient("still down".into());
        }
        let mut message = message.clone();
        let repeat = !self.sent.borrow_mut().insert(message.id.clone());
        if self.fault == Fault::NewIdOnRepeat && repeat {
            message.id = format!("{}#again", message.id);
        }
        if let (Some(fence), Some(highest)) = (message.fence, self.highest.get()) {
            let stale = match self.fault {
                Fault::IgnoresFence => false,
                #[allow(clippy::cast_precision_loss)]
                Fault::ComparesAsFloat => (fence as f64) < (highest as f64),
                _ => fence < highest,
            };
            if stale {
                return Answered::StaleFence { fence, highest };
            }
        }
        if let Some(fence) = message.fence {
            self.highest
                .set(Some(match (self.fault, self.highest.get()) {
                    (Fault::KeepsFirstFence, Some(first)) => first,
                    (_, highest) => highest.map_or(fence, |h| h.max(fence)),
                }));
        }
        if self.fault == Fault::OkWithoutTaking {
            return Answered::Delivered;
        }
        if self.fault == Fault::ChangesPayload {
            message.payload.push(b'!');
        }
        let mut taken = self.taken.borrow_mut();
        let seen = taken.iter().any(|t| t.id == message.id);
        if !(self.deduplicates && seen) {
            taken.push(message.clone());
            if self.fault == Fault::TakesTwice {
                taken.push(message);
            }
        }
        Answered::Delivered
    }
}

impl SinkUnderTest for MemorySink {
    async fn send(&self, message: &Sent) -> Answered {
        self.answer(message)
    }
    fn taken(&self) -> Vec<Sent> {
        self.taken.borrow().clone()
    }
    fn set_down(&self, down: bool) {
        self.down.set(down);
        if down {
            self.was_down.set(true);
        }
    }
    fn deduplicates(&self) -> bool {
        self.deduplicates
    }
    fn fence_receiver(&self) -> bool {
        true
    }
}

#[test]
fn a_sink_that_keeps_every_rule_passes_with_and_without_a_duplicate_window() {
    for deduplicates in [false, true] {
        block_on(sinks::run_all(
            &MemorySink::new(Fault::None, deduplicates),
            "memory",
        ));
    }
}

#[test]
fn a_sink_that_breaks_a_rule_fails_the_check_that_names_it() {
    for (fault, rule) in [
        (Fault::OkWithoutTaking, "delivered means taken as sent"),
        (Fault::ChangesPayload, "delivered means taken as sent"),
        (Fault::TakesTwice, "delivered means taken as sent"),
        (Fault::OkWhileDown, "down is transient"),
        (Fault::PermanentWhileDown, "down is transient"),
        (Fault::StaysDown, "down recovers"),
        (Fault::NewIdOnRepeat, "a repeat carries its id"),
        (Fault::IgnoresFence, "stale fences are refused"),
        (Fault::ComparesAsFloat, "stale fences are refused"),
        (Fault::KeepsFirstFence, "stale fences are refused"),
    ] {
        for deduplicates in [false, true] {
            let sink = MemorySink::new(fault, deduplicates);
            let message = guard_testkit::broken_rule("a broken sink", || {
                block_on(sinks::run_all(&sink, "broken"))
            });
            assert!(
                message.contains(&format!("{rule}:")),
                "{fault:?} (deduplicating: {deduplicates}) failed elsewhere: {message}"
            );
        }
    }
}

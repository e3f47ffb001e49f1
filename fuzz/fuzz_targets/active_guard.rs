//! The ActiveGuard state machine under arbitrary events: the invariants of
//! `core/tests/models/active.rs` hold after every one.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../core/tests/models/mod.rs"]
mod models;

use models::active::{Checker, Event};

fuzz_target!(|input: (bool, Vec<Event>)| {
    let (renewable, events) = input;
    let mut checker = Checker::new(renewable);
    for ev in events {
        if let Err(broken) = checker.apply(ev) {
            panic!("{broken} after {ev:?}");
        }
    }
});

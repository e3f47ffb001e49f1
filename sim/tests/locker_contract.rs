//! The simulator's locker passes the Locker contract every backend runs.
//!
//! `SimLocker` turns each call into a request in its outbox and waits for
//! the world to hand in the answer. Here a driver joined with the suite on
//! one thread plays the world's part, with no latency and no faults: it
//! takes each request to a `LockService` at the current simulated time and
//! hands the reply back. Waiting for a TTL advances the simulated clock,
//! so the suite takes no real time for its expiries.
//!
//! Every call of the suite, renewals included, is `SimLocker`'s own.

use std::cell::{Cell, RefCell};
use std::future::{Ready, poll_fn, ready};
use std::task::Poll;
use std::time::Duration;

use futures_lite::future::{block_on, or};
use guard_sim::FenceRule;
use guard_sim::clock::{Clock, Nanos};
use guard_sim::locker::{Answer, SimLocker, TimedOut};
use guard_sim::server::{LockOp, LockService};
use guard_testkit::contract;

/// The lock service and the simulated time.
struct Network {
    service: RefCell<LockService>,
    now: Cell<Nanos>,
}

impl Network {
    fn new(fence_rule: FenceRule) -> Self {
        Network {
            service: RefCell::new(LockService::new(
                5_000_000,
                [Clock::EXACT, Clock::EXACT],
                fence_rule,
            )),
            now: Cell::new(0),
        }
    }

    fn handle(&self, op: &LockOp) -> Answer {
        self.service
            .borrow_mut()
            .handle(op, self.now.get())
            .ok_or(TimedOut)
    }

    /// Answers every request waiting in `locker`'s outbox, in order.
    fn deliver(&self, locker: &SimLocker) {
        let requests = std::mem::take(&mut *locker.outbox.borrow_mut());
        for (id, op) in requests {
            locker.answer(id, self.handle(&op));
        }
    }

    /// Advances the simulated clock by `d`.
    fn sleep(&self, d: Duration) -> Ready<()> {
        let d = u64::try_from(d.as_nanos()).expect("a short wait");
        self.now.set(self.now.get() + d);
        ready(())
    }
}

/// Runs the suite against a service deriving fences by `fence_rule`; the
/// simulated time it waited.
fn run_contract(fence_rule: FenceRule, namespace: &str) -> Duration {
    let network = Network::new(fence_rule);
    let locker = SimLocker::new(0, 0);
    let suite = contract::run_all(&locker, namespace, 50, |d| network.sleep(d));
    let world = poll_fn(|cx| {
        network.deliver(&locker);
        cx.waker().wake_by_ref();
        Poll::<()>::Pending
    });
    block_on(or(suite, world));
    Duration::from_nanos(network.now.get())
}

#[test]
fn the_simulators_locker_passes_the_locker_contract() {
    let waited = run_contract(FenceRule::ServerTime, "sim");
    assert!(
        waited >= Duration::from_millis(400),
        "the suite waited on the simulated clock ({waited:?})"
    );
}

#[test]
fn the_simulators_locker_passes_with_plain_counter_fences() {
    run_contract(FenceRule::PlainCounter, "sim:plain");
}

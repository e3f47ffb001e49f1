//! LocalLocker passes the ClaimStore contract, on the system clock and
//! on a manual clock; and the suite fails a store that breaks a rule,
//! with a message naming the rule.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::convert::Infallible;
use std::time::Duration;

use futures_lite::future::block_on;
use guard_core::claim::{Begin, ClaimStore, Settled, Start};
use guard_core::lock::{Renewal, Token, Ttl};
use guard_core::slot::UnixMillis;
use guard_std::{LocalLocker, ManualClock};
use guard_testkit::claims;

#[test]
fn local_locker_passes_the_claim_contract() {
    let store = LocalLocker::new();
    block_on(claims::run_all(
        &store,
        "claims",
        50,
        1,
        async_io::Timer::after,
    ));
}

#[test]
fn local_locker_on_a_manual_clock_passes_the_claim_contract() {
    let clock = ManualClock::new(UnixMillis(0));
    let store = LocalLocker::with_clock(clock.clone());
    block_on(claims::run_all(&store, "manual", 50, 1, |d: Duration| {
        clock.advance(d);
        std::future::ready(())
    }));
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Every begin starts an attempt: two workers run one delivery.
    StartsWhileRunning,
    /// Attempts reuse one fence.
    RepeatsFences,
    /// Attempts are all numbered 1.
    NeverCountsAttempts,
    /// Every attempt says it is fresh.
    HidesWhyItStarted,
    /// Complete and fail accept any token.
    SettlesForAnyToken,
    /// A done record is answered as running.
    ForgetsItIsDone,
    /// A result is stored without its last byte.
    CutsResults,
    /// A failure keeps the delivery until the lease ends.
    FailKeepsTheLease,
    /// An ended lease can still be extended.
    ExtendsEndedLeases,
    /// Extend answers as asked, but the lease ends at once.
    ExtendsWithoutExtending,
    /// Settled records are never forgotten.
    KeepsForever,
    /// A record is forgotten at its keep time even while its lease runs.
    ForgetsRunningLeases,
    /// Checks, yields, then starts: a race.
    CheckThenAct,
}

/// LocalLocker on a manual clock, with one rule broken.
struct Broken {
    inner: LocalLocker<ManualClock>,
    fault: Fault,
    fences: Cell<u64>,
    /// Keys failed under [`Fault::FailKeepsTheLease`].
    failed: RefCell<HashSet<String>>,
}

impl ClaimStore for Broken {
    type Error = Infallible;

    async fn try_begin(
        &self,
        key: &str,
        lease: Ttl,
        keep: Ttl,
        result: &mut [u8],
    ) -> Result<Begin, Infallible> {
        let begun = match self.fault {
            Fault::StartsWhileRunning => {
                self.fences.set(self.fences.get() + 1);
                let fresh = format!("{key}#{}", self.fences.get());
                self.inner.try_begin_now(&fresh, lease, keep, result)
            }
            Fault::ForgetsItIsDone => match self.inner.try_begin_now(key, lease, keep, result) {
                Begin::Done { .. } => Begin::Running {
                    lease_left: Duration::ZERO,
                },
                other => other,
            },
            Fault::FailKeepsTheLease if self.failed.borrow().contains(key) => Begin::Running {
                lease_left: Duration::ZERO,
            },
            // The record goes at its keep time: so does the lease.
            Fault::ForgetsRunningLeases => {
                self.inner.try_begin_now(key, lease.min(keep), keep, result)
            }
            Fault::CheckThenAct => {
                let free = self.fences.get() == 0;
                futures_lite::future::yield_now().await;
                if !free {
                    return Ok(Begin::Running {
                        lease_left: Duration::ZERO,
                    });
                }
                self.fences.set(self.fences.get() + 1);
                let own = format!("{key}#{}", self.fences.get());
                self.inner.try_begin_now(&own, lease, keep, result)
            }
            _ => self.inner.try_begin_now(key, lease, keep, result),
        };
        Ok(match begun {
            Begin::Started {
                token,
                attempt,
                after,
            } => match self.fault {
                Fault::RepeatsFences => Begin::Started {
                    token: Token::new(*token.id(), 1),
                    attempt,
                    after,
                },
                Fault::NeverCountsAttempts => Begin::Started {
                    token,
                    attempt: 1,
                    after,
                },
                Fault::HidesWhyItStarted => Begin::Started {
                    token,
                    attempt,
                    after: Start::Fresh,
                },
                _ => begun,
            },
            other => other,
        })
    }

    async fn extend(&self, key: &str, token: &Token, lease: Ttl) -> Result<Renewal, Infallible> {
        Ok(match self.fault {
            Fault::ExtendsWithoutExtending => self.inner.extend_now(key, token, Ttl::MIN),
            Fault::ExtendsEndedLeases => {
                self.inner.extend_now(key, token, lease);
                Renewal::Held
            }
            _ => self.inner.extend_now(key, token, lease),
        })
    }

    async fn complete(
        &self,
        key: &str,
        token: &Token,
        keep: Ttl,
        result: &[u8],
    ) -> Result<Settled, Infallible> {
        let keep = match self.fault {
            Fault::KeepsForever => Ttl::from_secs(1_000_000).unwrap(),
            _ => keep,
        };
        let result = match self.fault {
            Fault::CutsResults => &result[..result.len().saturating_sub(1)],
            _ => result,
        };
        Ok(match self.fault {
            // Says it recorded whatever happened.
            Fault::SettlesForAnyToken => {
                self.inner.settle_now(key, token, keep, Some(result));
                Settled::Recorded
            }
            _ => self.inner.settle_now(key, token, keep, Some(result)),
        })
    }

    async fn fail(&self, key: &str, token: &Token, keep: Ttl) -> Result<Settled, Infallible> {
        Ok(match self.fault {
            Fault::SettlesForAnyToken => {
                self.inner.settle_now(key, token, keep, None);
                Settled::Recorded
            }
            Fault::FailKeepsTheLease => {
                let settled = self.inner.settle_now(key, token, keep, None);
                if settled == Settled::Recorded {
                    self.failed.borrow_mut().insert(key.to_owned());
                }
                settled
            }
            _ => self.inner.settle_now(key, token, keep, None),
        })
    }
}

#[test]
fn a_store_that_breaks_a_rule_fails_the_check_that_names_it() {
    for (fault, rule) in [
        (
            Fault::StartsWhileRunning,
            "c:running: a delivery whose lease runs: a begin answers Running",
        ),
        (
            Fault::RepeatsFences,
            "c:fail: the next attempt has a greater fence",
        ),
        (
            Fault::NeverCountsAttempts,
            "c:fail: after a failure: attempt 2 starts AfterFailure",
        ),
        (
            Fault::HidesWhyItStarted,
            "c:fail: after a failure: attempt 2 starts AfterFailure",
        ),
        (
            Fault::SettlesForAnyToken,
            "c:running: a wrong token completes nothing",
        ),
        (
            Fault::ForgetsItIsDone,
            "c:done: a done delivery answers Done",
        ),
        (
            Fault::CutsResults,
            "c:done: a done delivery answers its stored result, byte for byte",
        ),
        (
            Fault::FailKeepsTheLease,
            "c:fail: after a failure: an attempt starts",
        ),
        (
            Fault::ExtendsEndedLeases,
            "c:expiry: a taken-over attempt cannot extend",
        ),
        (
            Fault::ExtendsWithoutExtending,
            "c:extend: an extended lease outlives its first end",
        ),
        (
            Fault::KeepsForever,
            "c:keep: done and kept past its keep time: an attempt starts",
        ),
        (
            Fault::ForgetsRunningLeases,
            "c:keep:leased: a record is kept while its lease runs",
        ),
    ] {
        let clock = ManualClock::new(UnixMillis(0));
        let store = Broken {
            inner: LocalLocker::with_clock(clock.clone()),
            fault,
            fences: Cell::new(0),
            failed: RefCell::default(),
        };
        let message = guard_testkit::broken_rule("a broken store", || {
            block_on(claims::run_all(&store, "c", 8, 1, |d: Duration| {
                clock.advance(d);
                std::future::ready(())
            }))
        });
        assert!(message.contains(rule), "{fault:?}: {message}");
    }
}

#[test]
fn a_check_then_act_race_is_caught_by_begins_joined_on_one_thread() {
    let clock = ManualClock::new(UnixMillis(0));
    let store = Broken {
        inner: LocalLocker::with_clock(clock),
        fault: Fault::CheckThenAct,
        fences: Cell::new(0),
        failed: RefCell::default(),
    };
    let message = guard_testkit::broken_rule("a broken store", || {
        block_on(claims::one_attempt_among(&store, "race", 8, 1))
    });
    assert!(
        message.contains("race: exactly one of 8 concurrent begins starts an attempt"),
        "{message}"
    );
}

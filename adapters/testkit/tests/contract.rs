//! LocalLocker passes the Locker contract that every backend runs: on the
//! system clock (waiting in real time) and on a manual clock (waiting is
//! advancing it). And the suite fails a locker that breaks a rule, with a
//! message naming the rule.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use futures_lite::future::block_on;
use guard_core::lock::{LeaseRenewer, Locker, Renewal, Token, TokenId, Ttl, UnlockError};
use guard_core::slot::UnixMillis;
use guard_std::{LocalLocker, ManualClock};
use guard_testkit::contract;

#[test]
fn local_locker_passes_the_locker_contract() {
    let locker = LocalLocker::new();
    let real_time = async_io::Timer::after;
    block_on(contract::run_all(&locker, "contract", 50, real_time));
}

#[test]
fn local_locker_on_a_manual_clock_passes_the_locker_contract() {
    let clock = ManualClock::new(UnixMillis(0));
    let locker = LocalLocker::with_clock(clock.clone());
    block_on(contract::run_all(&locker, "manual", 50, |d: Duration| {
        clock.advance(d);
        std::future::ready(())
    }));
}

// The suite itself: a locker that breaks one rule fails the check of that
// rule, with a message naming it; a race is caught on one thread.

#[derive(Clone, Copy, Debug)]
enum Fault {
    GrantsHeldKeys,
    UnlocksForAnyToken,
    NeverExpires,
    RenewsWithoutExtending,
    RepeatsFences,
}

/// LocalLocker on a manual clock, with one rule broken.
struct Broken {
    inner: LocalLocker<ManualClock>,
    fault: Fault,
    holders: RefCell<HashMap<String, Token>>,
    grants: Cell<u64>,
}

impl Locker for Broken {
    type Error = Infallible;

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, Infallible> {
        let granted = match self.fault {
            Fault::GrantsHeldKeys => {
                self.grants.set(self.grants.get() + 1);
                let key = format!("{key}#{}", self.grants.get());
                self.inner.try_lock(&key, ttl).await?
            }
            Fault::NeverExpires => {
                let forever = Ttl::from_secs(3_600).unwrap();
                self.inner.try_lock(key, forever).await?
            }
            Fault::RepeatsFences => self
                .inner
                .try_lock(key, ttl)
                .await?
                .map(|t| Token::new(*t.id(), 1)),
            _ => self.inner.try_lock(key, ttl).await?,
        };
        if let Some(token) = granted {
            self.holders.borrow_mut().insert(key.to_owned(), token);
        }
        Ok(granted)
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<Infallible>> {
        match self.fault {
            Fault::UnlocksForAnyToken => {
                let holder = self.holders.borrow().get(key).copied();
                match holder {
                    Some(holder) => self.inner.unlock(key, &holder).await,
                    None => Err(UnlockError::NotHeld),
                }
            }
            _ => self.inner.unlock(key, token).await,
        }
    }
}

impl LeaseRenewer for Broken {
    async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, Infallible> {
        match self.fault {
            Fault::RenewsWithoutExtending => Ok(Renewal::Held),
            _ => self.inner.renew(key, token, ttl).await,
        }
    }
}

#[test]
fn a_locker_that_breaks_a_rule_fails_the_check_that_names_it() {
    for (fault, rule) in [
        (
            Fault::GrantsHeldKeys,
            "contract:exclusive: a held key is refused",
        ),
        (
            Fault::UnlocksForAnyToken,
            "contract:unlock: a stale or wrong token never releases",
        ),
        (
            Fault::NeverExpires,
            "contract:expiry: a key is free once its TTL has passed",
        ),
        (
            Fault::RenewsWithoutExtending,
            "contract:renew: a renewed lease outlives its first TTL",
        ),
        (
            Fault::RepeatsFences,
            "contract:unlock: a new grant has a greater fence",
        ),
    ] {
        let clock = ManualClock::new(UnixMillis(0));
        let locker = Broken {
            inner: LocalLocker::with_clock(clock.clone()),
            fault,
            holders: RefCell::default(),
            grants: Cell::new(0),
        };
        let message = guard_testkit::broken_rule("a broken locker", || {
            block_on(contract::run_all(&locker, "contract", 8, |d: Duration| {
                clock.advance(d);
                std::future::ready(())
            }))
        });
        assert!(message.contains(rule), "{fault:?}: {message}");
    }
}

/// Checks, then yields, then takes: the race a one-thread join must catch.
#[derive(Default)]
struct CheckThenAct {
    held: RefCell<HashMap<String, u64>>,
    fence: Cell<u64>,
}

impl Locker for CheckThenAct {
    type Error = Infallible;

    async fn try_lock(&self, key: &str, _ttl: Ttl) -> Result<Option<Token>, Infallible> {
        let free = !self.held.borrow().contains_key(key);
        futures_lite::future::yield_now().await;
        if !free {
            return Ok(None);
        }
        self.fence.set(self.fence.get() + 1);
        let fence = self.fence.get();
        self.held.borrow_mut().insert(key.to_owned(), fence);
        let mut id = [0; 16];
        id[..8].copy_from_slice(&fence.to_le_bytes());
        Ok(Some(Token::new(TokenId(id), fence)))
    }

    async fn unlock(&self, key: &str, _token: &Token) -> Result<(), UnlockError<Infallible>> {
        self.held
            .borrow_mut()
            .remove(key)
            .map(drop)
            .ok_or(UnlockError::NotHeld)
    }
}

#[test]
fn a_check_then_act_race_is_caught_by_contenders_joined_on_one_thread() {
    let locker = CheckThenAct::default();
    let message = guard_testkit::broken_rule("a broken locker", || {
        block_on(contract::one_winner_among(&locker, "race", 8))
    });
    assert!(
        message.contains("race: exactly one of 8 concurrent contenders wins"),
        "{message}"
    );
}

#[test]
fn local_locker_tells_a_last_fence_never_below_a_granted_one() {
    block_on(contract::last_fence_is_never_below_a_granted_one(
        &LocalLocker::new(),
        "last-fence",
    ));
}

/// LocalLocker telling the first fence it granted, forever.
struct StuckFence {
    inner: LocalLocker,
    first: std::sync::Mutex<Option<u64>>,
}

impl Locker for StuckFence {
    type Error = Infallible;

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, Infallible> {
        let granted = self.inner.try_lock(key, ttl).await?;
        if let Some(token) = &granted {
            self.first.lock().unwrap().get_or_insert(token.fence());
        }
        Ok(granted)
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<Infallible>> {
        self.inner.unlock(key, token).await
    }
}

impl LeaseRenewer for StuckFence {
    async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, Infallible> {
        self.inner.renew(key, token, ttl).await
    }
}

impl guard_std::LastFence for StuckFence {
    type Error = Infallible;

    async fn last_fence(&self, _key: &str) -> Result<Option<u64>, Infallible> {
        Ok(*self.first.lock().unwrap())
    }
}

#[test]
fn a_locker_that_tells_a_stale_last_fence_fails_the_case() {
    let locker = StuckFence {
        inner: LocalLocker::new(),
        first: std::sync::Mutex::new(None),
    };
    let message = guard_testkit::broken_rule("a stale last fence", || {
        block_on(contract::last_fence_is_never_below_a_granted_one(
            &locker, "stuck",
        ))
    });
    assert!(
        message.contains("contract:last-fence: told") && message.contains("after the next grant"),
        "{message}"
    );
}

//! The original's OnceGuard tests (seed-originals A2), on LocalLocker, plus
//! the outcome hook and the fence handed to the winner.

use std::cell::RefCell;
use std::convert::Infallible;
use std::fmt;
use std::time::Duration;

use futures_lite::future::block_on;
use guard_core::guard::{FailPolicy, OnceGuard, OnceOutcome};
use guard_core::lock::{Locker, Scope, Token, TokenId, Ttl, UnlockError};
use guard_std::LocalLocker;

fn scope(owner: &str, chain: &str, router: &str) -> Scope {
    Scope::new("schedule")
        .and_then(|s| s.segment("owner", owner))
        .and_then(|s| s.segment("chain", chain))
        .and_then(|s| s.segment("router", router))
        .unwrap()
}

#[test]
fn without_a_locker_every_call_is_allowed() {
    let guard: OnceGuard<'_, LocalLocker> = OnceGuard::new(None, scope("o1", "", "r1"));
    for _ in 0..3 {
        assert_eq!(block_on(guard.allow("1000")), Ok(OnceOutcome::Unguarded));
    }
}

#[test]
fn the_same_key_runs_once_and_a_different_key_passes() {
    let locker = LocalLocker::new();
    let guard = OnceGuard::new(Some(&locker), scope("o1", "", "r1"));
    let first = block_on(guard.allow("1000")).unwrap();
    assert!(matches!(first, OnceOutcome::Won { .. }));
    assert_eq!(
        block_on(guard.allow("1000")),
        Ok(OnceOutcome::AlreadyClaimed)
    );
    assert!(block_on(guard.allow("1001")).unwrap().is_allowed());
}

#[test]
fn two_replicas_sharing_a_locker_run_a_key_once() {
    let locker = LocalLocker::new();
    let a = OnceGuard::new(Some(&locker), scope("o1", "c1", "r1"));
    let b = OnceGuard::new(Some(&locker), scope("o1", "c1", "r1"));
    let runs = ["1", "2", "3"]
        .iter()
        .flat_map(|k| [block_on(a.allow(k)).unwrap(), block_on(b.allow(k)).unwrap()])
        .filter(OnceOutcome::is_allowed)
        .count();
    assert_eq!(runs, 3);
}

#[test]
fn the_key_has_the_documented_layout() {
    let locker = LocalLocker::new();
    let guard = OnceGuard::new(Some(&locker), scope("o1", "ep1", "r1"));
    assert!(block_on(guard.allow("1000")).unwrap().is_allowed());
    // The claim is a plain lock on the documented key.
    let key = "guard:once:schedule:owner=o1:chain=ep1:router=r1:1000";
    assert!(locker.try_lock_now(key, Ttl::MIN).is_none());
}

#[test]
fn scopes_isolate_owners_chains_and_routers() {
    let locker = LocalLocker::new();
    for s in [
        scope("tenantA", "c", "r"),
        scope("tenantB", "c", "r"),
        scope("tenantA", "c2", "r"),
        scope("tenantA", "c", "r2"),
        scope("", "tenantA", "r"),
    ] {
        let guard = OnceGuard::new(Some(&locker), s);
        assert!(block_on(guard.allow("1000")).unwrap().is_allowed());
    }
}

#[test]
fn the_winner_gets_an_increasing_fence() {
    let locker = LocalLocker::new();
    let guard = OnceGuard::new(Some(&locker), scope("o", "", "r"));
    let f1 = block_on(guard.allow("1")).unwrap().fence().unwrap();
    let f2 = block_on(guard.allow("2")).unwrap().fence().unwrap();
    assert!(f2 > f1);
}

/// A locker whose backend is down.
struct Down;

#[derive(Debug)]
struct ConnectionRefused;

impl fmt::Display for ConnectionRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("connection refused")
    }
}

impl Locker for Down {
    type Error = ConnectionRefused;
    async fn try_lock(&self, _: &str, _: Ttl) -> Result<Option<Token>, ConnectionRefused> {
        Err(ConnectionRefused)
    }
    async fn unlock(&self, _: &str, _: &Token) -> Result<(), UnlockError<ConnectionRefused>> {
        Err(UnlockError::Backend(ConnectionRefused))
    }
}

#[test]
fn a_backend_failure_skips_by_default_and_runs_when_fail_open() {
    let seen = RefCell::new(vec![]);
    let closed = OnceGuard::new(Some(&Down), scope("o", "", "r")).with_observer(
        |e: &guard_core::guard::OnceEvent<'_>| {
            seen.borrow_mut().push(format!(
                "{} {} {} {}",
                e.scope,
                e.key,
                e.outcome.name(),
                e.error.map(|x| x.to_string()).unwrap_or_default()
            ));
        },
    );
    assert_eq!(block_on(closed.allow("1")), Ok(OnceOutcome::SkippedOnError));
    let open =
        OnceGuard::new(Some(&Down), scope("o", "", "r")).with_fail_policy(FailPolicy::FailOpen);
    assert_eq!(block_on(open.allow("1")), Ok(OnceOutcome::AllowedOnError));
    assert_eq!(
        *seen.borrow(),
        ["schedule:owner=o:router=r 1 skipped_on_error connection refused"]
    );
}

/// A locker that refuses every key as invalid input (as a store refuses
/// a key it cannot hold).
struct RefusesKeys;

/// The refusal of [`RefusesKeys`].
#[derive(Debug)]
struct KeyRefused;

impl fmt::Display for KeyRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key this store cannot hold")
    }
}

impl Locker for RefusesKeys {
    type Error = KeyRefused;
    async fn try_lock(&self, _: &str, _: Ttl) -> Result<Option<Token>, KeyRefused> {
        Err(KeyRefused)
    }
    async fn unlock(&self, _: &str, _: &Token) -> Result<(), UnlockError<KeyRefused>> {
        Err(UnlockError::Backend(KeyRefused))
    }
    fn is_invalid_input(_: &KeyRefused) -> bool {
        true
    }
}

#[test]
fn a_key_the_store_refuses_is_skipped_even_when_fail_open() {
    let open = OnceGuard::new(Some(&RefusesKeys), scope("o", "", "r"))
        .with_fail_policy(FailPolicy::FailOpen);
    for _ in 0..3 {
        assert_eq!(block_on(open.allow("1")), Ok(OnceOutcome::SkippedOnError));
    }
}

/// Records the TTL of every acquisition.
struct Recording(RefCell<Vec<Duration>>);

impl Locker for Recording {
    type Error = Infallible;
    async fn try_lock(&self, _: &str, ttl: Ttl) -> Result<Option<Token>, Infallible> {
        self.0.borrow_mut().push(ttl.as_duration());
        Ok(Some(Token::new(TokenId([1; 16]), 1)))
    }
    async fn unlock(&self, _: &str, _: &Token) -> Result<(), UnlockError<Infallible>> {
        Ok(())
    }
}

#[test]
fn the_ttl_option_reaches_the_locker_and_the_default_is_one_hour() {
    let recording = Recording(RefCell::new(vec![]));
    let default = OnceGuard::new(Some(&recording), scope("o", "", "r"));
    block_on(default.allow("1")).unwrap();
    let five_minutes = OnceGuard::new(Some(&recording), scope("o", "", "r"))
        .with_ttl(Ttl::from_secs(300).unwrap());
    block_on(five_minutes.allow("2")).unwrap();
    assert_eq!(
        *recording.0.borrow(),
        [Duration::from_secs(3600), Duration::from_secs(300)]
    );
}

#[test]
fn the_observer_sees_every_outcome() {
    let locker = LocalLocker::new();
    let outcomes = RefCell::new(vec![]);
    let guard = OnceGuard::new(Some(&locker), scope("o", "", "r")).with_observer(
        |e: &guard_core::guard::OnceEvent<'_>| outcomes.borrow_mut().push(e.outcome.name()),
    );
    block_on(guard.allow("1")).unwrap();
    block_on(guard.allow("1")).unwrap();
    assert_eq!(*outcomes.borrow(), ["won", "lost"]);
}

#[test]
fn an_overlong_key_is_an_error_not_a_silent_skip() {
    let locker = LocalLocker::new();
    let guard = OnceGuard::new(Some(&locker), scope("o", "", "r"));
    assert!(block_on(guard.allow(&"k".repeat(300))).is_err());
}

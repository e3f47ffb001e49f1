//! The Locker contract, as a suite every backend runs.
//!
//! Each check takes a fresh `namespace` for its keys, so backends shared
//! between tests (a Redis server) do not interfere. Checks panic with a
//! message naming the broken rule; they wait in real time (TTLs of tens of
//! milliseconds), because a remote backend expires keys on its own clock.
//!
//! ```
//! guard_testkit::contract::run_all(&guard_std::LocalLocker::new(), "doc", 50);
//! ```

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use futures_lite::future::block_on;
use guard_core::lock::{LeaseRenewer, Locker, Renewal, Token, Ttl, UnlockError};

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).expect("positive test TTL")
}

fn grant<L: Locker>(locker: &L, key: &str, ms: u64) -> Option<Token>
where
    L::Error: Debug,
{
    block_on(locker.try_lock(key, ttl(ms))).expect("backend error in try_lock")
}

/// Runs every check; `contenders` concurrent acquirers race for one key.
pub fn run_all<L>(locker: &L, namespace: &str, contenders: usize)
where
    L: LeaseRenewer + Sync,
    L::Error: Debug,
{
    exclusivity(locker, &format!("{namespace}:exclusive"));
    compare_and_delete_unlock(locker, &format!("{namespace}:unlock"));
    expiry(locker, &format!("{namespace}:expiry"));
    renewal(locker, &format!("{namespace}:renew"));
    fences_strictly_increase(locker, &format!("{namespace}:fence"), 1_000);
    one_winner_among(locker, &format!("{namespace}:race"), contenders);
}

/// A held key is refused to everyone else; other keys are independent.
pub fn exclusivity<L: Locker>(locker: &L, key: &str)
where
    L::Error: Debug,
{
    assert!(
        grant(locker, key, 10_000).is_some(),
        "a free key is granted"
    );
    assert!(
        grant(locker, key, 10_000).is_none(),
        "a held key is refused (None, not an error)"
    );
    assert!(
        grant(locker, &format!("{key}:other"), 10_000).is_some(),
        "keys are independent"
    );
}

/// Unlock deletes only for the holder's token.
pub fn compare_and_delete_unlock<L: Locker>(locker: &L, key: &str)
where
    L::Error: Debug,
{
    let first = grant(locker, key, 10_000).expect("granted");
    let other = grant(locker, &format!("{key}:x"), 10_000).expect("granted");
    let wrong = Token::new(*other.id(), first.fence());
    assert!(
        matches!(
            block_on(locker.unlock(key, &wrong)),
            Err(UnlockError::NotHeld)
        ),
        "a wrong token never releases"
    );
    assert!(
        grant(locker, key, 10_000).is_none(),
        "still held after a wrong unlock"
    );
    assert!(
        block_on(locker.unlock(key, &first)).is_ok(),
        "the holder releases"
    );
    assert!(
        matches!(
            block_on(locker.unlock(key, &first)),
            Err(UnlockError::NotHeld)
        ),
        "a second unlock finds nothing"
    );
    let second = grant(locker, key, 10_000).expect("free again after unlock");
    assert_ne!(second.id(), first.id(), "a new grant has a new token");
    assert!(second.fence() > first.fence(), "and a greater fence");
}

/// A granted key frees itself after its TTL, unlocked or not.
pub fn expiry<L: Locker>(locker: &L, key: &str)
where
    L::Error: Debug,
{
    let first = grant(locker, key, 60).expect("granted");
    assert!(grant(locker, key, 60).is_none());
    thread::sleep(Duration::from_millis(120));
    let second = grant(locker, key, 60).expect("free after the TTL");
    assert!(
        second.fence() > first.fence(),
        "the fence increases across an expiry"
    );
    assert!(
        matches!(
            block_on(locker.unlock(key, &first)),
            Err(UnlockError::NotHeld)
        ),
        "an expired token releases nothing"
    );
}

/// Renewal extends only the holder's live lease.
pub fn renewal<L: LeaseRenewer>(locker: &L, key: &str)
where
    L::Error: Debug,
{
    let token = grant(locker, key, 150).expect("granted");
    let renewed = block_on(locker.renew(key, &token, ttl(60_000))).expect("backend error in renew");
    assert_eq!(renewed, Renewal::Held, "the holder renews");
    thread::sleep(Duration::from_millis(250));
    assert!(
        grant(locker, key, 150).is_none(),
        "a renewed lease outlives its first TTL"
    );
    let stranger = grant(locker, &format!("{key}:x"), 150).expect("granted");
    let wrong = Token::new(*stranger.id(), token.fence());
    assert_eq!(
        block_on(locker.renew(key, &wrong, ttl(60_000))).expect("backend error"),
        Renewal::Lost,
        "a wrong token renews nothing"
    );
    let short = grant(locker, &format!("{key}:short"), 50).expect("granted");
    thread::sleep(Duration::from_millis(100));
    assert_eq!(
        block_on(locker.renew(&format!("{key}:short"), &short, ttl(60_000)))
            .expect("backend error"),
        Renewal::Lost,
        "an expired lease cannot be renewed"
    );
}

/// The fence strictly increases over `rounds` acquisitions of one key.
pub fn fences_strictly_increase<L: Locker>(locker: &L, key: &str, rounds: usize)
where
    L::Error: Debug,
{
    let mut last = 0u64;
    for round in 0..rounds {
        let token = grant(locker, key, 10_000).expect("free after unlock");
        assert!(
            token.fence() > last,
            "fence {} after {} at round {round}",
            token.fence(),
            last
        );
        last = token.fence();
        block_on(locker.unlock(key, &token)).expect("holder unlocks");
    }
}

/// `contenders` threads race for one key at once: exactly one wins.
pub fn one_winner_among<L: Locker + Sync>(locker: &L, key: &str, contenders: usize)
where
    L::Error: Debug,
{
    let start = Barrier::new(contenders);
    let winners: Vec<Token> = thread::scope(|s| {
        let handles: Vec<_> = (0..contenders)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    grant(locker, key, 10_000)
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().expect("contender thread"))
            .collect()
    });
    assert_eq!(winners.len(), 1, "exactly one of {contenders} wins");
    let ids: HashSet<_> = winners.iter().map(|t| *t.id()).collect();
    assert_eq!(ids.len(), 1);
}

//! The `Semaphore` contract (guard-core's `semaphore` module), as a suite
//! every semaphore runs: `LocalLocker`, and the Redis, PostgreSQL and etcd
//! lockers against their real servers.
//!
//! As the [`contract`](crate::contract) suite: async on one thread,
//! contenders joined on the caller's task, waits through the caller's
//! `sleep` on the semaphore's clock, every lease and wait multiplied by
//! `scale` for a backend with coarse leases (etcd), keys under a fresh
//! `namespace`. A check panics with a message that starts with the key
//! and names the broken rule.
//!
//! ```
//! use std::time::Duration;
//!
//! use guard_std::{LocalLocker, ManualClock};
//! use guard_core::slot::UnixMillis;
//!
//! let clock = ManualClock::new(UnixMillis(0));
//! let semaphore = LocalLocker::with_clock(clock.clone());
//! futures_lite::future::block_on(guard_testkit::semaphore::run_all(&semaphore, "doc", 20, 1, |d: Duration| {
//!     clock.advance(d);
//!     std::future::ready(())
//! }));
//! ```

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use guard_core::lock::{Renewal, Token};
use guard_core::semaphore::{Permits, Semaphore};

use crate::contract::{Scale, backend, race, released};

/// A lease of the suite no check waits out, in ms (before scaling).
const LONG: u64 = 60_000;

/// Runs every check, each on keys of its own under `namespace`;
/// `contenders` futures (at least 4) race for three permits; every lease
/// and wait is multiplied by `scale` (0 is taken as 1); `sleep(d)` waits
/// `d` on the semaphore's clock.
pub async fn run_all<S, Z, F>(
    semaphore: &S,
    namespace: &str,
    contenders: usize,
    scale: u32,
    sleep: Z,
) where
    S: Semaphore,
    Z: Fn(Duration) -> F,
    F: Future,
{
    let scale = Scale(scale.max(1));
    let at = |check: &str| format!("{namespace}:{check}");
    at_most_permits_among_at(semaphore, &at("race"), contenders.max(4), scale).await;
    release_only_by_its_token(semaphore, &at("release"), scale).await;
    a_dead_holders_permit_returns(semaphore, &at("expiry"), scale, &sleep).await;
    renewal_extends_only_a_live_permit(semaphore, &at("renew"), scale, &sleep).await;
    fences_strictly_increase(semaphore, &at("fence"), scale).await;
    fewer_permits_are_refused_while_as_many_are_live(semaphore, &at("fewer"), scale).await;
    keys_are_independent(semaphore, &at("keys"), scale).await;
}

fn permits(n: u32) -> Permits {
    Permits::new(n).expect("the suite's permits are 1 to 3")
}

async fn acquire<S: Semaphore>(
    semaphore: &S,
    key: &str,
    n: u32,
    scale: Scale,
    lease: u64,
) -> Option<Token> {
    let acquired = semaphore
        .try_acquire(key, permits(n), scale.ttl(lease))
        .await;
    backend(key, "try_acquire", acquired)
}

async fn granted<S: Semaphore>(
    semaphore: &S,
    key: &str,
    n: u32,
    scale: Scale,
    lease: u64,
    why: &str,
) -> Token {
    acquire(semaphore, key, n, scale, lease)
        .await
        .unwrap_or_else(|| panic!("{key}: {why}: a permit is granted"))
}

async fn release<S: Semaphore>(semaphore: &S, key: &str, token: &Token) -> Result<(), ()> {
    released(key, "release", semaphore.release(key, token).await)
}

async fn renew<S: Semaphore>(
    semaphore: &S,
    key: &str,
    token: &Token,
    scale: Scale,
    lease: u64,
) -> Renewal {
    let renewed = semaphore.renew(key, token, scale.ttl(lease)).await;
    backend(key, "renew", renewed)
}

async fn holders<S: Semaphore>(semaphore: &S, key: &str) -> u32 {
    backend(key, "holders", semaphore.holders(key).await)
}

/// `contenders` futures race for three permits of one key, all on the
/// caller's task: exactly three win, with distinct tokens and fences; a
/// released permit is granted again.
pub async fn at_most_permits_among<S: Semaphore>(semaphore: &S, key: &str, contenders: usize) {
    at_most_permits_among_at(semaphore, key, contenders, Scale(1)).await;
}

async fn at_most_permits_among_at<S: Semaphore>(
    semaphore: &S,
    key: &str,
    contenders: usize,
    scale: Scale,
) {
    let winners: Vec<Token> = race(contenders, || acquire(semaphore, key, 3, scale, LONG))
        .await
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(
        winners.len(),
        3.min(contenders),
        "{key}: exactly 3 of {contenders} concurrent contenders for 3 permits win"
    );
    let ids: HashSet<_> = winners.iter().map(|t| *t.id()).collect();
    let fences: HashSet<_> = winners.iter().map(Token::fence).collect();
    assert_eq!(
        (ids.len(), fences.len()),
        (winners.len(), winners.len()),
        "{key}: permits held together have distinct tokens and fences"
    );
    assert_eq!(
        holders(semaphore, key).await,
        3,
        "{key}: three permits are live"
    );
    assert!(
        acquire(semaphore, key, 3, scale, LONG).await.is_none(),
        "{key}: a fourth is refused while three are live (None, not an error)"
    );
    let first = winners
        .first()
        .copied()
        .unwrap_or_else(|| panic!("{key}: a winner"));
    assert!(
        release(semaphore, key, &first).await.is_ok(),
        "{key}: a holder's token releases its permit"
    );
    assert_eq!(
        holders(semaphore, key).await,
        2,
        "{key}: a release frees one place"
    );
    let next = granted(semaphore, key, 3, scale, LONG, "after a release").await;
    let highest = winners.iter().map(Token::fence).max().unwrap_or(0);
    assert!(
        next.fence() > highest,
        "{key}: a new permit's fence is greater than every earlier one ({} after {highest})",
        next.fence()
    );
}

/// Release acts only on its own token's live permit.
async fn release_only_by_its_token<S: Semaphore>(semaphore: &S, key: &str, scale: Scale) {
    let first = granted(semaphore, key, 2, scale, LONG, "a free semaphore").await;
    let second = granted(semaphore, key, 2, scale, LONG, "one of two taken").await;
    let other = granted(
        semaphore,
        &format!("{key}:x"),
        1,
        scale,
        LONG,
        "another key",
    )
    .await;
    let wrong = Token::new(*other.id(), first.fence());
    assert!(
        release(semaphore, key, &wrong).await.is_err(),
        "{key}: a stranger's token releases nothing (NotHeld)"
    );
    assert_eq!(
        holders(semaphore, key).await,
        2,
        "{key}: both permits are live after a stranger's release"
    );
    assert!(
        release(semaphore, key, &first).await.is_ok(),
        "{key}: the holder's token releases"
    );
    assert!(
        release(semaphore, key, &first).await.is_err(),
        "{key}: a second release of the same token finds nothing (NotHeld)"
    );
    assert_eq!(
        holders(semaphore, key).await,
        1,
        "{key}: one permit is left after one release, however many were asked"
    );
    let third = granted(semaphore, key, 2, scale, LONG, "a place freed").await;
    assert_ne!(
        third.id(),
        first.id(),
        "{key}: a new permit has a new token"
    );
    assert!(
        release(semaphore, key, &first).await.is_err(),
        "{key}: a released token does not release the permit granted after it"
    );
    assert_eq!(
        holders(semaphore, key).await,
        2,
        "{key}: the later permits are live after a stale release"
    );
    assert!(
        release(semaphore, key, &second).await.is_ok()
            && release(semaphore, key, &third).await.is_ok(),
        "{key}: each holder releases its own"
    );
}

/// A holder that never releases gives its permit back when its lease
/// ends; its token then releases and renews nothing.
async fn a_dead_holders_permit_returns<S, Z, F>(semaphore: &S, key: &str, scale: Scale, sleep: Z)
where
    S: Semaphore,
    Z: Fn(Duration) -> F,
    F: Future,
{
    let dead = [
        granted(semaphore, key, 2, scale, 60, "a free semaphore").await,
        granted(semaphore, key, 2, scale, 60, "one of two taken").await,
    ];
    assert!(
        acquire(semaphore, key, 2, scale, 60).await.is_none(),
        "{key}: permits are held within their leases"
    );
    sleep(scale.ms(120)).await;
    assert_eq!(
        holders(semaphore, key).await,
        0,
        "{key}: permits whose leases ended count no more"
    );
    let alive = [
        granted(
            semaphore,
            key,
            2,
            scale,
            LONG,
            "after the leases ended (expiry)",
        )
        .await,
        granted(
            semaphore,
            key,
            2,
            scale,
            LONG,
            "both ended permits returned",
        )
        .await,
    ];
    let last_dead = dead.iter().map(Token::fence).max().unwrap_or(0);
    assert!(
        alive.iter().all(|t| t.fence() > last_dead),
        "{key}: fences increase across an expiry ({:?} after {last_dead})",
        alive.map(|t| t.fence())
    );
    for token in &dead {
        assert!(
            release(semaphore, key, token).await.is_err(),
            "{key}: an ended permit's token releases nothing (NotHeld)"
        );
        assert_eq!(
            renew(semaphore, key, token, scale, LONG).await,
            Renewal::Lost,
            "{key}: an ended permit cannot be renewed"
        );
    }
    assert_eq!(
        holders(semaphore, key).await,
        2,
        "{key}: the live permits stay after the ended ones' release"
    );
}

/// Renewal extends only its own token's live permit.
async fn renewal_extends_only_a_live_permit<S, Z, F>(
    semaphore: &S,
    key: &str,
    scale: Scale,
    sleep: Z,
) where
    S: Semaphore,
    Z: Fn(Duration) -> F,
    F: Future,
{
    let token = granted(semaphore, key, 1, scale, 150, "a free semaphore").await;
    assert_eq!(
        renew(semaphore, key, &token, scale, LONG).await,
        Renewal::Held,
        "{key}: the holder renews its live permit"
    );
    sleep(scale.ms(250)).await;
    assert!(
        acquire(semaphore, key, 1, scale, 150).await.is_none(),
        "{key}: a renewed permit outlives its first lease (renewal extends)"
    );
    let stranger = granted(semaphore, &format!("{key}:x"), 1, scale, 150, "another key").await;
    let wrong = Token::new(*stranger.id(), token.fence());
    assert_eq!(
        renew(semaphore, key, &wrong, scale, LONG).await,
        Renewal::Lost,
        "{key}: a stranger's token renews nothing"
    );
    let short = format!("{key}:short");
    let lapsed = granted(semaphore, &short, 1, scale, 50, "a free semaphore").await;
    sleep(scale.ms(100)).await;
    assert_eq!(
        renew(semaphore, &short, &lapsed, scale, LONG).await,
        Renewal::Lost,
        "{short}: an ended permit cannot be renewed"
    );
    let taker = granted(semaphore, &short, 1, scale, LONG, "an ended permit's place").await;
    assert_eq!(
        renew(semaphore, &short, &taker, scale, LONG).await,
        Renewal::Held,
        "{short}: the new holder renews"
    );
    assert_eq!(
        holders(semaphore, &short).await,
        1,
        "{short}: one permit is live after an ended one's renewal was refused"
    );
}

/// Fences strictly increase over many grants, while another permit of the
/// key stays held.
async fn fences_strictly_increase<S: Semaphore>(semaphore: &S, key: &str, scale: Scale) {
    let kept = granted(semaphore, key, 2, scale, LONG, "a free semaphore").await;
    let mut last = kept.fence();
    for round in 0..200 {
        let token = granted(semaphore, key, 2, scale, LONG, "one of two free again").await;
        assert!(
            token.fence() > last,
            "{key}: fences strictly increase, but fence {} came after {last} at round {round}",
            token.fence()
        );
        last = token.fence();
        assert!(
            release(semaphore, key, &token).await.is_ok(),
            "{key}: the holder's token releases"
        );
    }
}

/// A caller passing fewer permits than are live is refused until enough
/// are given back.
async fn fewer_permits_are_refused_while_as_many_are_live<S: Semaphore>(
    semaphore: &S,
    key: &str,
    scale: Scale,
) {
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(granted(semaphore, key, 3, scale, LONG, "three permits").await);
    }
    assert!(
        acquire(semaphore, key, 2, scale, LONG).await.is_none(),
        "{key}: asking for 2 permits while 3 are live is refused"
    );
    for token in held.drain(..2) {
        assert!(
            release(semaphore, key, &token).await.is_ok(),
            "{key}: a holder releases"
        );
    }
    assert!(
        acquire(semaphore, key, 2, scale, LONG).await.is_some(),
        "{key}: with one of 2 live, one more is granted"
    );
}

/// A key's permits do not count toward another's.
async fn keys_are_independent<S: Semaphore>(semaphore: &S, key: &str, scale: Scale) {
    granted(semaphore, key, 1, scale, LONG, "a free semaphore").await;
    assert!(
        acquire(semaphore, key, 1, scale, LONG).await.is_none(),
        "{key}: a one-permit semaphore is refused while held"
    );
    granted(
        semaphore,
        &format!("{key}:other"),
        1,
        scale,
        LONG,
        "keys are independent",
    )
    .await;
    assert_eq!(
        holders(semaphore, &format!("{key}:unused")).await,
        0,
        "{key}:unused: a key never acquired has no holders"
    );
}

/// What [`held_at_once`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldAtOnce {
    /// The most permits held together, counted by their holders (up
    /// after a grant, down before its release).
    pub most: u32,
    /// Permits granted, held and released.
    pub runs: u64,
}

/// Real contention, beside the one-thread suite: each of `replicas` (a
/// semaphore on a connection of its own) has `callers` threads that take
/// a permit of `key` (of `permits`), hold it 2 ms and release it, again
/// and again for `period`; the most held together. A backend error
/// panics naming the call.
pub fn held_at_once<S: Semaphore + Sync>(
    replicas: &[S],
    callers: usize,
    key: &str,
    permits: Permits,
    period: Duration,
) -> HeldAtOnce {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    let lease = Scale(1).ttl(LONG);
    let (in_flight, most, runs) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU64::new(0));
    let end = std::time::Instant::now() + period;
    std::thread::scope(|s| {
        for replica in replicas {
            for _ in 0..callers {
                let (in_flight, most, runs) = (&in_flight, &most, &runs);
                s.spawn(move || {
                    futures_lite::future::block_on(async {
                        while std::time::Instant::now() < end {
                            let acquired = replica.try_acquire(key, permits, lease).await;
                            let Some(token) = backend(key, "try_acquire", acquired) else {
                                async_io::Timer::after(Duration::from_millis(1)).await;
                                continue;
                            };
                            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            async_io::Timer::after(Duration::from_millis(2)).await;
                            in_flight.fetch_sub(1, Ordering::SeqCst);
                            let release = replica.release(key, &token).await;
                            assert!(
                                released(key, "release", release).is_ok(),
                                "{key}: a holder releases its live permit"
                            );
                            runs.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                });
            }
        }
    });
    HeldAtOnce {
        most: most.into_inner(),
        runs: runs.into_inner(),
    }
}

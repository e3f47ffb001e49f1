//! The Locker contract, as a suite every backend runs.
//!
//! The suite is async and runs on one thread: the "one winner among N
//! contenders" check races N futures joined on the caller's task, so a
//! locker that is neither `Send` nor `Sync` (one connection behind a
//! `NoopRawMutex`, a table in a `RefCell`, a simulated client) runs it as
//! it is. Drive it with any executor (`futures_lite::future::block_on`,
//! `smol::block_on` for a backend on async-io sockets).
//!
//! Waiting for a TTL to pass goes through the caller's `sleep`, which must
//! wait on the backend's notion of time: a real timer for a server that
//! expires keys on its own clock, embassy-time's timer for a locker on
//! embassy-time, or a function that advances a simulated or manual clock
//! (and returns at once). A backend whose TTLs are coarse (etcd's leases
//! are whole seconds, 1 s at the least) runs [`run_all_scaled`], which
//! multiplies every TTL and every wait.
//!
//! Each check takes a fresh `namespace` (or key) for its keys, so backends
//! shared between tests (a Redis server) do not interfere. A check panics
//! with a message that starts with the key and names the broken rule; a
//! backend error panics naming the call that failed.
//!
//! ```
//! use std::time::Duration;
//!
//! use guard_std::{LocalLocker, ManualClock};
//! use guard_core::slot::UnixMillis;
//!
//! // A locker on a manual clock: sleeping is advancing it.
//! let clock = ManualClock::new(UnixMillis(0));
//! let locker = LocalLocker::with_clock(clock.clone());
//! futures_lite::future::block_on(guard_testkit::contract::run_all(
//!     &locker,
//!     "doc",
//!     50,
//!     |d: Duration| {
//!         clock.advance(d);
//!         std::future::ready(())
//!     },
//! ));
//! ```

use std::cell::Cell;
use std::collections::HashSet;
use std::fmt::Display;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use guard_core::lock::{LeaseRenewer, Locker, Renewal, Token, Ttl, UnlockError};

/// Rounds of lock and unlock in [`fences_strictly_increase`] by
/// [`run_all`].
pub const FENCE_ROUNDS: usize = 1_000;

/// How much longer than the suite's own TTLs and waits a backend's are:
/// every TTL and every sleep is multiplied by it (1 for the suite as
/// written; etcd, whose leases are whole seconds with a server minimum,
/// needs about 40).
#[derive(Clone, Copy)]
pub(crate) struct Scale(pub(crate) u32);

impl Scale {
    pub(crate) fn ttl(self, ms: u64) -> Ttl {
        Ttl::from_millis(ms.saturating_mul(u64::from(self.0))).expect("positive test TTL")
    }

    pub(crate) fn ms(self, ms: u64) -> Duration {
        Duration::from_millis(ms.saturating_mul(u64::from(self.0)))
    }
}

pub(crate) fn backend<T>(key: &str, call: &str, result: Result<T, impl Display>) -> T {
    result.unwrap_or_else(|e| panic!("{key}: backend error in {call}: {e}"))
}

async fn grant<L: Locker>(locker: &L, key: &str, scale: Scale, ms: u64) -> Option<Token> {
    backend(key, "try_lock", locker.try_lock(key, scale.ttl(ms)).await)
}

async fn unlock<L: Locker>(locker: &L, key: &str, token: &Token) -> Result<(), ()> {
    released(key, "unlock", locker.unlock(key, token).await)
}

/// Whether a release released (`Err(())` for `NotHeld`); a backend error
/// panics naming the call.
pub(crate) fn released<E: Display>(
    key: &str,
    call: &str,
    result: Result<(), UnlockError<E>>,
) -> Result<(), ()> {
    match result {
        Ok(()) => Ok(()),
        Err(UnlockError::NotHeld) => Err(()),
        Err(e) => panic!("{key}: {call} failed: {e}"),
    }
}

async fn renew<L: LeaseRenewer>(
    locker: &L,
    key: &str,
    token: &Token,
    scale: Scale,
    ms: u64,
) -> Renewal {
    backend(key, "renew", locker.renew(key, token, scale.ttl(ms)).await)
}

/// Runs every check, each on keys of its own under `namespace`;
/// `contenders` futures race for one key; `sleep(d)` waits `d` on the
/// backend's clock.
pub async fn run_all<L, S, F>(locker: &L, namespace: &str, contenders: usize, sleep: S)
where
    L: LeaseRenewer,
    S: Fn(Duration) -> F,
    F: Future,
{
    run_all_scaled(locker, namespace, contenders, 1, sleep).await;
}

/// [`run_all`] with every TTL and every sleep multiplied by `scale`, for
/// a backend whose TTLs are coarse: etcd's leases are whole seconds with a
/// server minimum (about 1.5 election timeouts), so the suite's 50 to
/// 250 ms TTLs and waits need a scale of about 40 there. A `scale` of 1
/// is [`run_all`]; 0 is taken as 1.
pub async fn run_all_scaled<L, S, F>(
    locker: &L,
    namespace: &str,
    contenders: usize,
    scale: u32,
    sleep: S,
) where
    L: LeaseRenewer,
    S: Fn(Duration) -> F,
    F: Future,
{
    let scale = Scale(scale.max(1));
    exclusivity_at(locker, &format!("{namespace}:exclusive"), scale).await;
    compare_and_delete_unlock_at(locker, &format!("{namespace}:unlock"), scale).await;
    expiry_at(locker, &format!("{namespace}:expiry"), scale, &sleep).await;
    renewal_at(locker, &format!("{namespace}:renew"), scale, &sleep).await;
    fences_strictly_increase_at(locker, &format!("{namespace}:fence"), FENCE_ROUNDS, scale).await;
    one_winner_among_at(locker, &format!("{namespace}:race"), contenders, scale).await;
}

/// A held key is refused to everyone else; other keys are independent.
pub async fn exclusivity<L: Locker>(locker: &L, key: &str) {
    exclusivity_at(locker, key, Scale(1)).await;
}

async fn exclusivity_at<L: Locker>(locker: &L, key: &str, scale: Scale) {
    assert!(
        grant(locker, key, scale, 10_000).await.is_some(),
        "{key}: a free key is granted"
    );
    assert!(
        grant(locker, key, scale, 10_000).await.is_none(),
        "{key}: a held key is refused (None, not an error)"
    );
    assert!(
        grant(locker, &format!("{key}:other"), scale, 10_000)
            .await
            .is_some(),
        "{key}: keys are independent (another key is granted while this one is held)"
    );
}

/// Unlock deletes only for the holder's token (compare-and-delete).
pub async fn compare_and_delete_unlock<L: Locker>(locker: &L, key: &str) {
    compare_and_delete_unlock_at(locker, key, Scale(1)).await;
}

async fn compare_and_delete_unlock_at<L: Locker>(locker: &L, key: &str, scale: Scale) {
    let first = grant(locker, key, scale, 10_000)
        .await
        .unwrap_or_else(|| panic!("{key}: a free key is granted"));
    let other = grant(locker, &format!("{key}:x"), scale, 10_000)
        .await
        .unwrap_or_else(|| panic!("{key}:x: a free key is granted"));
    let wrong = Token::new(*other.id(), first.fence());
    assert!(
        unlock(locker, key, &wrong).await.is_err(),
        "{key}: a stale or wrong token never releases (NotHeld)"
    );
    assert!(
        grant(locker, key, scale, 10_000).await.is_none(),
        "{key}: still held after an unlock with a wrong token"
    );
    assert!(
        unlock(locker, key, &first).await.is_ok(),
        "{key}: the holder's token releases"
    );
    assert!(
        unlock(locker, key, &first).await.is_err(),
        "{key}: a second unlock with the same token finds nothing (NotHeld)"
    );
    let second = grant(locker, key, scale, 10_000)
        .await
        .unwrap_or_else(|| panic!("{key}: free again after the holder's unlock"));
    assert_ne!(
        second.id(),
        first.id(),
        "{key}: a new grant has a new token"
    );
    assert!(
        second.fence() > first.fence(),
        "{key}: a new grant has a greater fence ({} after {})",
        second.fence(),
        first.fence()
    );
    assert!(
        unlock(locker, key, &first).await.is_err(),
        "{key}: the previous holder's stale token does not release the new grant (NotHeld)"
    );
    assert!(
        grant(locker, key, scale, 10_000).await.is_none(),
        "{key}: the new grant is still held after a stale unlock"
    );
}

/// A granted key frees itself after its TTL, unlocked or not.
pub async fn expiry<L, S, F>(locker: &L, key: &str, sleep: S)
where
    L: Locker,
    S: Fn(Duration) -> F,
    F: Future,
{
    expiry_at(locker, key, Scale(1), sleep).await;
}

async fn expiry_at<L, S, F>(locker: &L, key: &str, scale: Scale, sleep: S)
where
    L: Locker,
    S: Fn(Duration) -> F,
    F: Future,
{
    let first = grant(locker, key, scale, 60)
        .await
        .unwrap_or_else(|| panic!("{key}: a free key is granted"));
    assert!(
        grant(locker, key, scale, 60).await.is_none(),
        "{key}: a key is held within its TTL"
    );
    sleep(scale.ms(120)).await;
    let second = grant(locker, key, scale, 10_000)
        .await
        .unwrap_or_else(|| panic!("{key}: a key is free once its TTL has passed (expiry)"));
    assert!(
        second.fence() > first.fence(),
        "{key}: the fence increases across an expiry ({} after {})",
        second.fence(),
        first.fence()
    );
    assert!(
        unlock(locker, key, &first).await.is_err(),
        "{key}: an expired token releases nothing (NotHeld), not even the next holder's grant"
    );
    assert!(
        grant(locker, key, scale, 60).await.is_none(),
        "{key}: the next holder still holds after an expired token's unlock"
    );
}

/// Renewal extends only the holder's live lease, and fails once the lease
/// is lost.
pub async fn renewal<L, S, F>(locker: &L, key: &str, sleep: S)
where
    L: LeaseRenewer,
    S: Fn(Duration) -> F,
    F: Future,
{
    renewal_at(locker, key, Scale(1), sleep).await;
}

async fn renewal_at<L, S, F>(locker: &L, key: &str, scale: Scale, sleep: S)
where
    L: LeaseRenewer,
    S: Fn(Duration) -> F,
    F: Future,
{
    let token = grant(locker, key, scale, 150)
        .await
        .unwrap_or_else(|| panic!("{key}: a free key is granted"));
    assert_eq!(
        renew(locker, key, &token, scale, 60_000).await,
        Renewal::Held,
        "{key}: the holder renews its live lease"
    );
    sleep(scale.ms(250)).await;
    assert!(
        grant(locker, key, scale, 150).await.is_none(),
        "{key}: a renewed lease outlives its first TTL (renewal extends)"
    );
    let stranger = grant(locker, &format!("{key}:x"), scale, 150)
        .await
        .unwrap_or_else(|| panic!("{key}:x: a free key is granted"));
    let wrong = Token::new(*stranger.id(), token.fence());
    assert_eq!(
        renew(locker, key, &wrong, scale, 60_000).await,
        Renewal::Lost,
        "{key}: a wrong token renews nothing"
    );

    let short = format!("{key}:short");
    let lapsed = grant(locker, &short, scale, 50)
        .await
        .unwrap_or_else(|| panic!("{short}: a free key is granted"));
    sleep(scale.ms(100)).await;
    assert_eq!(
        renew(locker, &short, &lapsed, scale, 60_000).await,
        Renewal::Lost,
        "{short}: an expired lease cannot be renewed"
    );
    let taker = grant(locker, &short, scale, 60_000)
        .await
        .unwrap_or_else(|| panic!("{short}: a lapsed lease's key is free to take"));
    assert_eq!(
        renew(locker, &short, &lapsed, scale, 60_000).await,
        Renewal::Lost,
        "{short}: a lease lost to another holder cannot be renewed"
    );
    assert!(
        unlock(locker, &short, &lapsed).await.is_err(),
        "{short}: the lost lease's token releases nothing (NotHeld)"
    );
    assert_eq!(
        renew(locker, &short, &taker, scale, 60_000).await,
        Renewal::Held,
        "{short}: the new holder renews"
    );
}

/// A lock the lock service loses mid-lease (its key deleted by hand,
/// evicted) is granted to nobody before the end of the lease its holder
/// was granted: the holder's renewal reports the loss, and the key is
/// granted again (under a greater fence) once that end has passed, or at
/// once when the holder released it. `lose(key)` deletes the lock's key
/// in the backend, nothing else; `sleep(d)` waits `d` on the backend's
/// clock.
///
/// Not part of [`run_all`]: it needs a hand inside the backend.
pub async fn a_lost_key_is_granted_to_nobody_before_its_deadline<L, S, F, X, G>(
    locker: &L,
    key: &str,
    lose: X,
    sleep: S,
) where
    L: LeaseRenewer,
    S: Fn(Duration) -> F,
    F: Future,
    X: Fn(&str) -> G,
    G: Future,
{
    a_lost_key_is_granted_to_nobody_before_its_deadline_scaled(locker, key, 1, lose, sleep).await;
}

/// [`a_lost_key_is_granted_to_nobody_before_its_deadline`] with every TTL
/// and wait times `scale` (as [`run_all_scaled`]): 2 s and 4 s leases, 5 s
/// of waits, unscaled.
pub async fn a_lost_key_is_granted_to_nobody_before_its_deadline_scaled<L, S, F, X, G>(
    locker: &L,
    key: &str,
    scale: u32,
    lose: X,
    sleep: S,
) where
    L: LeaseRenewer,
    S: Fn(Duration) -> F,
    F: Future,
    X: Fn(&str) -> G,
    G: Future,
{
    let scale = Scale(scale);
    let holder = grant(locker, key, scale, 2_000)
        .await
        .unwrap_or_else(|| panic!("{key}: a free key is granted"));
    assert_eq!(
        renew(locker, key, &holder, scale, 4_000).await,
        Renewal::Held,
        "{key}: the holder renews its live lease"
    );
    // Past the first grant's end, within the renewed lease's: what the
    // holder believes now is the renewal.
    sleep(scale.ms(2_500)).await;
    lose(key).await;
    assert!(
        grant(locker, key, scale, 60_000).await.is_none(),
        "{key}: a key lost mid-lease is granted to nobody before the renewed lease's end"
    );
    assert_eq!(
        renew(locker, key, &holder, scale, 4_000).await,
        Renewal::Lost,
        "{key}: the holder's renewal finds its key lost"
    );
    assert!(
        grant(locker, key, scale, 60_000).await.is_none(),
        "{key}: a failed renewal extends nothing, and grants nothing either"
    );
    // Past the renewed lease's end, with room for a lock service that
    // expires leases on a timer of its own (etcd).
    sleep(scale.ms(2_500)).await;
    let next = grant(locker, key, scale, 60_000)
        .await
        .unwrap_or_else(|| panic!("{key}: once the lost lease has ended, the key is granted"));
    assert!(
        next.fence() > holder.fence(),
        "{key}: the next grant's fence {} is above the lost one's {}",
        next.fence(),
        holder.fence()
    );

    let released = format!("{key}:released");
    let holder = grant(locker, &released, scale, 60_000)
        .await
        .unwrap_or_else(|| panic!("{released}: a free key is granted"));
    lose(&released).await;
    assert!(
        grant(locker, &released, scale, 60_000).await.is_none(),
        "{released}: a key lost mid-lease is granted to nobody before the lease's end"
    );
    // The holder gives the lease up: nothing of it is believed any more.
    let _ = unlock(locker, &released, &holder).await;
    assert!(
        grant(locker, &released, scale, 60_000).await.is_some(),
        "{released}: once its holder released it, a lost key is granted at once"
    );
}

/// A locker whose store lost every record of a key (its lock, its grant
/// record and its fence: a `FLUSHALL`, a restart without persistence, a
/// new cluster) grants it to nobody for one TTL, so that a holder the
/// store had granted has seen its lease end first; the next grant's fence
/// is still above the lost one's. A key never granted waits the same
/// (nothing tells it from a lost one). `lose_all(key)` deletes every
/// record of the key in the backend; `sleep(d)` waits `d` on its clock.
///
/// Not part of [`run_all`]: it needs a hand inside the backend, and a
/// locker that waits out such a loss (a quarantine).
pub async fn a_lost_store_grants_nothing_for_one_ttl<L, S, F, X, G>(
    locker: &L,
    key: &str,
    lose_all: X,
    sleep: S,
) where
    L: LeaseRenewer,
    S: Fn(Duration) -> F,
    F: Future,
    X: Fn(&str) -> G,
    G: Future,
{
    let scale = Scale(1);
    assert!(
        grant(locker, key, scale, 2_000).await.is_none(),
        "{key}: a key with no record at all is granted to nobody at first"
    );
    sleep(scale.ms(2_500)).await;
    let holder = grant(locker, key, scale, 2_000)
        .await
        .unwrap_or_else(|| panic!("{key}: granted once the first TTL has passed"));
    assert_eq!(
        renew(locker, key, &holder, scale, 2_000).await,
        Renewal::Held,
        "{key}: the holder renews"
    );
    lose_all(key).await;
    assert!(
        grant(locker, key, scale, 2_000).await.is_none(),
        "{key}: after every record is lost, nobody is granted the key while its holder may still believe it"
    );
    assert_eq!(
        renew(locker, key, &holder, scale, 2_000).await,
        Renewal::Lost,
        "{key}: the holder's renewal finds its key lost"
    );
    sleep(scale.ms(1_000)).await;
    assert!(
        grant(locker, key, scale, 2_000).await.is_none(),
        "{key}: nor within one TTL of the loss"
    );
    sleep(scale.ms(1_500)).await;
    let next = grant(locker, key, scale, 2_000)
        .await
        .unwrap_or_else(|| panic!("{key}: once one TTL has passed, the key is granted"));
    assert!(
        next.fence() > holder.fence(),
        "{key}: the next grant's fence {} is above the lost one's {}",
        next.fence(),
        holder.fence()
    );
}

/// What a locker tells of a key's last fence
/// ([`LastFence`](guard_std::LastFence)) is never below a fence it
/// granted for the key: while the grant is held, after its renewal and
/// its release, and after the next grant.
///
/// Not part of [`run_all`]: a locker need not tell its fences.
pub async fn last_fence_is_never_below_a_granted_one<L>(locker: &L, key: &str)
where
    L: LeaseRenewer + guard_std::LastFence,
{
    let scale = Scale(1);
    let told = async || {
        backend(key, "last_fence", locker.last_fence(key).await).unwrap_or_else(|| {
            panic!("{key}: contract:last-fence: a locker that granted the key tells a fence")
        })
    };
    let first = grant(locker, key, scale, 10_000)
        .await
        .unwrap_or_else(|| panic!("{key}: a free key is granted"));
    let held = told().await;
    assert!(
        held >= first.fence(),
        "{key}: contract:last-fence: told {held} while fence {} is held",
        first.fence()
    );
    assert_eq!(
        renew(locker, key, &first, scale, 10_000).await,
        Renewal::Held,
        "{key}: the holder renews"
    );
    assert!(
        told().await >= first.fence(),
        "{key}: contract:last-fence: after a renewal"
    );
    assert!(unlock(locker, key, &first).await.is_ok(), "{key}: released");
    assert!(
        told().await >= first.fence(),
        "{key}: contract:last-fence: a release forgets no fence"
    );
    let next = grant(locker, key, scale, 10_000)
        .await
        .unwrap_or_else(|| panic!("{key}: a released key is granted"));
    let after = told().await;
    assert!(
        after >= next.fence(),
        "{key}: contract:last-fence: told {after} after the next grant's fence {}",
        next.fence()
    );
    let _ = unlock(locker, key, &next).await;
}

/// The fence strictly increases over `rounds` acquisitions of one key.
pub async fn fences_strictly_increase<L: Locker>(locker: &L, key: &str, rounds: usize) {
    fences_strictly_increase_at(locker, key, rounds, Scale(1)).await;
}

async fn fences_strictly_increase_at<L: Locker>(
    locker: &L,
    key: &str,
    rounds: usize,
    scale: Scale,
) {
    let mut last = 0u64;
    for round in 0..rounds {
        let token = grant(locker, key, scale, 10_000)
            .await
            .unwrap_or_else(|| panic!("{key}: free again after the holder's unlock"));
        assert!(
            token.fence() > last,
            "{key}: fences strictly increase, but fence {} came after {last} at round {round}",
            token.fence(),
        );
        last = token.fence();
        assert!(
            unlock(locker, key, &token).await.is_ok(),
            "{key}: the holder's token releases"
        );
    }
}

/// `contenders` futures race for one key, all on the caller's task:
/// exactly one wins.
///
/// Every contender first reaches a start line, so none asks before all
/// have started; with a backend that answers later, all the requests are
/// in flight together.
pub async fn one_winner_among<L: Locker>(locker: &L, key: &str, contenders: usize) {
    one_winner_among_at(locker, key, contenders, Scale(1)).await;
}

async fn one_winner_among_at<L: Locker>(locker: &L, key: &str, contenders: usize, scale: Scale) {
    let winners: Vec<Token> = race(contenders, || grant(locker, key, scale, 10_000))
        .await
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "{key}: exactly one of {contenders} concurrent contenders wins"
    );
    let ids: HashSet<_> = winners.iter().map(|t| *t.id()).collect();
    assert_eq!(ids.len(), 1, "{key}: the winner holds one token");
}

/// Runs `contenders` calls of `call` on the caller's task, each started
/// only once all have reached a start line, so with a backend that
/// answers later all the requests are in flight together; their outputs.
pub(crate) async fn race<F: Future>(contenders: usize, call: impl Fn() -> F) -> Vec<F::Output> {
    let arrived = &Cell::new(0usize);
    let call = &call;
    let racers = (0..contenders).map(|_| async move {
        arrived.set(arrived.get() + 1);
        poll_fn(|cx| {
            if arrived.get() >= contenders {
                Poll::Ready(())
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
        .await;
        call().await
    });
    join_all(racers).await
}

/// Polls every future on the caller's task until all are done; their
/// outputs in order.
async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(out) => *output = Some(out),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

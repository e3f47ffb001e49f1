//! The `ClaimStore` contract (guard-core's `claim` module), as a suite
//! every store runs: `LocalLocker`, and the Redis, PostgreSQL and etcd
//! lockers against their real servers.
//!
//! As the [`contract`](crate::contract) suite: async on one thread,
//! contenders joined on the caller's task, waits through the caller's
//! `sleep` on the store's clock, every TTL and wait multiplied by `scale`
//! for a store with coarse leases (etcd), keys under a fresh `namespace`.
//! A check panics with a message that starts with the key and names the
//! broken rule.
//!
//! ```
//! use std::time::Duration;
//!
//! use guard_std::{LocalLocker, ManualClock};
//! use guard_core::slot::UnixMillis;
//!
//! let clock = ManualClock::new(UnixMillis(0));
//! let store = LocalLocker::with_clock(clock.clone());
//! futures_lite::future::block_on(guard_testkit::claims::run_all(&store, "doc", 20, 1, |d: Duration| {
//!     clock.advance(d);
//!     std::future::ready(())
//! }));
//! ```

use std::future::Future;
use std::time::Duration;

use guard_core::claim::{Begin, ClaimStore, Settled, Start};
use guard_core::lock::{Renewal, Token, TokenId};

use crate::contract::{Scale, backend, race};

/// A long lease or keep time of the suite, in ms (before scaling): one
/// no check waits out.
const LONG: u64 = 60_000;

/// Runs every check, each on keys of its own under `namespace`;
/// `contenders` futures race for one delivery; every TTL and wait is
/// multiplied by `scale` (0 is taken as 1); `sleep(d)` waits `d` on the
/// store's clock.
pub async fn run_all<C, S, F>(store: &C, namespace: &str, contenders: usize, scale: u32, sleep: S)
where
    C: ClaimStore,
    S: Fn(Duration) -> F,
    F: Future,
{
    let scale = Scale(scale.max(1));
    let at = |check: &str| format!("{namespace}:{check}");
    first_attempt_and_running(store, &at("running"), scale).await;
    done_answers_its_result(store, &at("done"), scale).await;
    failure_gives_the_delivery_back(store, &at("fail"), scale).await;
    expiry_is_taken_over(store, &at("expiry"), scale, &sleep).await;
    settling_after_the_lease_without_a_taker(store, &at("late"), scale, &sleep).await;
    extend_only_a_running_lease(store, &at("extend"), scale, &sleep).await;
    records_are_forgotten_after_keep(store, &at("keep"), scale, &sleep).await;
    one_attempt_among_at(store, &at("race"), contenders, scale).await;
}

async fn begin<C: ClaimStore>(
    store: &C,
    key: &str,
    scale: Scale,
    lease: u64,
    keep: u64,
    result: &mut [u8],
) -> Begin {
    let begun = store
        .try_begin(key, scale.ttl(lease), scale.ttl(keep), result)
        .await;
    backend(key, "try_begin", begun)
}

/// The token of a begin that must start an attempt, checked to be
/// attempt `attempt` started after `after`.
async fn started<C: ClaimStore>(
    store: &C,
    key: &str,
    scale: Scale,
    lease: u64,
    attempt: u32,
    after: Start,
    why: &str,
) -> Token {
    match begin(store, key, scale, lease, LONG, &mut []).await {
        Begin::Started {
            token,
            attempt: n,
            after: cause,
        } => {
            assert_eq!(
                (n, cause),
                (attempt, after),
                "{key}: {why}: attempt {attempt} starts {after:?} (got attempt {n}, {cause:?})"
            );
            token
        }
        other => panic!("{key}: {why}: an attempt starts, but the store answered {other:?}"),
    }
}

async fn complete<C: ClaimStore>(
    store: &C,
    key: &str,
    token: &Token,
    scale: Scale,
    result: &[u8],
) -> Settled {
    let settled = store.complete(key, token, scale.ttl(LONG), result).await;
    backend(key, "complete", settled)
}

async fn fail<C: ClaimStore>(store: &C, key: &str, token: &Token, scale: Scale) -> Settled {
    backend(key, "fail", store.fail(key, token, scale.ttl(LONG)).await)
}

async fn extend<C: ClaimStore>(
    store: &C,
    key: &str,
    token: &Token,
    scale: Scale,
    lease: u64,
) -> Renewal {
    let renewal = store.extend(key, token, scale.ttl(lease)).await;
    backend(key, "extend", renewal)
}

fn assert_running(key: &str, begun: Begin, lease: Duration, why: &str) {
    match begun {
        Begin::Running { lease_left } => assert!(
            lease_left <= lease,
            "{key}: {why}: the time left ({lease_left:?}) is within the lease ({lease:?})"
        ),
        other => panic!("{key}: {why}: a begin answers Running, but got {other:?}"),
    }
}

/// A first begin starts attempt 1; while its lease runs every other begin
/// answers Running, and a wrong token settles nothing.
async fn first_attempt_and_running<C: ClaimStore>(store: &C, key: &str, scale: Scale) {
    let token = started(store, key, scale, LONG, 1, Start::Fresh, "a new delivery").await;
    let again = begin(store, key, scale, LONG, LONG, &mut []).await;
    assert_running(key, again, scale.ms(LONG), "a delivery whose lease runs");
    let other = format!("{key}:other");
    let stranger = started(store, &other, scale, LONG, 1, Start::Fresh, "another key").await;
    let wrong = Token::new(*stranger.id(), token.fence());
    assert_eq!(
        complete(store, key, &wrong, scale, b"x").await,
        Settled::Superseded,
        "{key}: a wrong token completes nothing"
    );
    assert_eq!(
        fail(store, key, &wrong, scale).await,
        Settled::Superseded,
        "{key}: a wrong token fails nothing"
    );
    let still = begin(store, key, scale, LONG, LONG, &mut []).await;
    assert_running(
        key,
        still,
        scale.ms(LONG),
        "still running after a wrong token's settling",
    );
}

/// A completed delivery answers every begin with its result, whole or
/// (in a smaller buffer) its first bytes and its length; nothing settles
/// it again.
async fn done_answers_its_result<C: ClaimStore>(store: &C, key: &str, scale: Scale) {
    let token = started(store, key, scale, LONG, 1, Start::Fresh, "a new delivery").await;
    let result = b"HTTP 201 {\"id\":42}\x00\xff";
    assert_eq!(
        complete(store, key, &token, scale, result).await,
        Settled::Recorded,
        "{key}: the running attempt completes"
    );
    for round in 0..2 {
        let mut buffer = [0u8; 64];
        match begin(store, key, scale, LONG, LONG, &mut buffer).await {
            Begin::Done { result_len } => assert_eq!(
                buffer.get(..result_len),
                Some(&result[..]),
                "{key}: a done delivery answers its stored result, byte for byte (round {round})"
            ),
            other => panic!("{key}: a done delivery answers Done, but got {other:?}"),
        }
    }
    let mut small = [0u8; 4];
    match begin(store, key, scale, LONG, LONG, &mut small).await {
        Begin::Done { result_len } => assert!(
            result_len == result.len() && small == result[..4],
            "{key}: a small buffer gets the result's first bytes and its whole length"
        ),
        other => panic!("{key}: a done delivery answers Done, but got {other:?}"),
    }
    assert_eq!(
        complete(store, key, &token, scale, b"again").await,
        Settled::Superseded,
        "{key}: a done delivery is not completed twice"
    );
    assert_eq!(
        fail(store, key, &token, scale).await,
        Settled::Superseded,
        "{key}: a done delivery cannot be failed"
    );
    let empty = format!("{key}:empty");
    let token = started(
        store,
        &empty,
        scale,
        LONG,
        1,
        Start::Fresh,
        "a new delivery",
    )
    .await;
    complete(store, &empty, &token, scale, b"").await;
    match begin(store, &empty, scale, LONG, LONG, &mut [0u8; 8]).await {
        Begin::Done { result_len: 0 } => {}
        other => {
            panic!("{empty}: a delivery done with no result answers Done of 0 bytes, got {other:?}")
        }
    }
}

/// A failed attempt gives the delivery back at once: the next begin
/// starts attempt 2 with a greater fence, and the failed token settles
/// nothing.
async fn failure_gives_the_delivery_back<C: ClaimStore>(store: &C, key: &str, scale: Scale) {
    let first = started(store, key, scale, LONG, 1, Start::Fresh, "a new delivery").await;
    assert_eq!(
        fail(store, key, &first, scale).await,
        Settled::Recorded,
        "{key}: the running attempt fails"
    );
    let second = started(
        store,
        key,
        scale,
        LONG,
        2,
        Start::AfterFailure,
        "after a failure",
    )
    .await;
    assert!(
        second.fence() > first.fence(),
        "{key}: the next attempt has a greater fence ({} after {})",
        second.fence(),
        first.fence()
    );
    assert_eq!(
        complete(store, key, &first, scale, b"stale").await,
        Settled::Superseded,
        "{key}: a failed attempt's token completes nothing"
    );
    assert_eq!(
        complete(store, key, &second, scale, b"").await,
        Settled::Recorded,
        "{key}: the second attempt completes"
    );
}

/// An attempt whose lease ended is taken over: the next begin starts the
/// next attempt with a greater fence, and the old token can neither
/// extend nor settle.
async fn expiry_is_taken_over<C, S, F>(store: &C, key: &str, scale: Scale, sleep: &S)
where
    C: ClaimStore,
    S: Fn(Duration) -> F,
    F: Future,
{
    let first = started(store, key, scale, 60, 1, Start::Fresh, "a new delivery").await;
    sleep(scale.ms(150)).await;
    let second = started(
        store,
        key,
        scale,
        LONG,
        2,
        Start::AfterExpiry,
        "after the lease ended",
    )
    .await;
    assert!(
        second.fence() > first.fence(),
        "{key}: a take-over has a greater fence ({} after {})",
        second.fence(),
        first.fence()
    );
    assert_eq!(
        extend(store, key, &first, scale, LONG).await,
        Renewal::Lost,
        "{key}: a taken-over attempt cannot extend"
    );
    assert_eq!(
        complete(store, key, &first, scale, b"late").await,
        Settled::Superseded,
        "{key}: a taken-over attempt completes nothing"
    );
    let running = begin(store, key, scale, LONG, LONG, &mut []).await;
    assert_running(key, running, scale.ms(LONG), "the take-over's lease runs");
    assert_eq!(
        complete(store, key, &second, scale, b"").await,
        Settled::Recorded,
        "{key}: the take-over completes"
    );
}

/// An attempt past its lease that nobody took over still settles: its
/// work is done, and running it again would be a duplicate.
async fn settling_after_the_lease_without_a_taker<C, S, F>(
    store: &C,
    key: &str,
    scale: Scale,
    sleep: &S,
) where
    C: ClaimStore,
    S: Fn(Duration) -> F,
    F: Future,
{
    let token = started(store, key, scale, 60, 1, Start::Fresh, "a new delivery").await;
    sleep(scale.ms(150)).await;
    assert_eq!(
        complete(store, key, &token, scale, b"ok").await,
        Settled::Recorded,
        "{key}: an attempt past its lease that nobody took over completes"
    );
    match begin(store, key, scale, LONG, LONG, &mut [0u8; 8]).await {
        Begin::Done { result_len: 2 } => {}
        other => panic!("{key}: completed past its lease, the delivery is done, got {other:?}"),
    }
}

/// Extend keeps a running lease alive past its first end, only for its
/// own token and never once the lease ended.
async fn extend_only_a_running_lease<C, S, F>(store: &C, key: &str, scale: Scale, sleep: &S)
where
    C: ClaimStore,
    S: Fn(Duration) -> F,
    F: Future,
{
    let token = started(store, key, scale, 150, 1, Start::Fresh, "a new delivery").await;
    assert_eq!(
        extend(store, key, &token, scale, LONG).await,
        Renewal::Held,
        "{key}: the running attempt extends its lease"
    );
    sleep(scale.ms(250)).await;
    let running = begin(store, key, scale, LONG, LONG, &mut []).await;
    assert_running(
        key,
        running,
        scale.ms(LONG),
        "an extended lease outlives its first end",
    );
    let wrong = Token::new(TokenId([0xab; 16]), token.fence());
    assert_eq!(
        extend(store, key, &wrong, scale, LONG).await,
        Renewal::Lost,
        "{key}: a wrong token extends nothing"
    );
    let short = format!("{key}:short");
    let lapsed = started(store, &short, scale, 60, 1, Start::Fresh, "a new delivery").await;
    sleep(scale.ms(150)).await;
    assert_eq!(
        extend(store, &short, &lapsed, scale, LONG).await,
        Renewal::Lost,
        "{short}: an ended lease cannot be extended"
    );
}

/// Settled records are forgotten `keep` after settling (the next begin is
/// a fresh first attempt), never while a lease runs.
async fn records_are_forgotten_after_keep<C, S, F>(store: &C, key: &str, scale: Scale, sleep: &S)
where
    C: ClaimStore,
    S: Fn(Duration) -> F,
    F: Future,
{
    let token = started(store, key, scale, LONG, 1, Start::Fresh, "a new delivery").await;
    let settled = store.complete(key, &token, scale.ttl(60), b"x").await;
    backend(key, "complete", settled);
    sleep(scale.ms(150)).await;
    started(
        store,
        key,
        scale,
        LONG,
        1,
        Start::Fresh,
        "done and kept past its keep time",
    )
    .await;

    let failed = format!("{key}:failed");
    let token = started(
        store,
        &failed,
        scale,
        LONG,
        1,
        Start::Fresh,
        "a new delivery",
    )
    .await;
    backend(
        &failed,
        "fail",
        store.fail(&failed, &token, scale.ttl(60)).await,
    );
    sleep(scale.ms(150)).await;
    started(
        store,
        &failed,
        scale,
        LONG,
        1,
        Start::Fresh,
        "failed and kept past its keep time",
    )
    .await;

    let leased = format!("{key}:leased");
    let begun = begin(store, &leased, scale, 300, 60, &mut []).await;
    assert!(
        matches!(begun, Begin::Started { .. }),
        "{leased}: a new delivery starts, got {begun:?}"
    );
    sleep(scale.ms(150)).await;
    let running = begin(store, &leased, scale, LONG, LONG, &mut []).await;
    assert_running(
        &leased,
        running,
        scale.ms(300),
        "a record is kept while its lease runs, whatever the keep time",
    );
}

/// `contenders` begins of one delivery race on the caller's task: exactly
/// one starts an attempt, every other answers Running.
pub async fn one_attempt_among<C: ClaimStore>(store: &C, key: &str, contenders: usize, scale: u32) {
    one_attempt_among_at(store, key, contenders, Scale(scale.max(1))).await;
}

async fn one_attempt_among_at<C: ClaimStore>(
    store: &C,
    key: &str,
    contenders: usize,
    scale: Scale,
) {
    let answers = race(contenders, || begin(store, key, scale, LONG, LONG, &mut [])).await;
    let started = answers
        .iter()
        .filter(|b| matches!(b, Begin::Started { .. }))
        .count();
    assert_eq!(
        started, 1,
        "{key}: exactly one of {contenders} concurrent begins starts an attempt"
    );
    for answer in answers {
        if !matches!(answer, Begin::Started { .. }) {
            assert_running(
                key,
                answer,
                scale.ms(LONG),
                "a contender that lost the race",
            );
        }
    }
}

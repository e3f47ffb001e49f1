//! `wait_up_to`: requests the limiter refuses wait in line, in tokio's
//! paused virtual time, on a limiter that reads the same virtual clock.
//!
//! A waiter's timer is its retry time plus up to 1/16 of jitter
//! (guard-core's `limit::wait`), so the admission instants are made exact
//! by moving the clock by hand (`tokio::time::advance`) to checkpoints
//! away from the slots: a checkpoint just before a slot admits nobody new,
//! one 100 ms after it (more than the jitter) admits exactly the next
//! waiter, at the checkpoint's instant.

mod common;

use common::Answer;
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use guard_core::limit::{FullPolicy, Rate, TokenBucket};
use guard_std::ratelimit::{LimitFuture, MemoryLimiter, Quota, RateLimiter, ReconfigureError};
use guard_std::run::{LINE_CAPACITY, RuntimeClock};
use guard_tokio::Tokio;
use guard_tower::{ConfigError, HeaderKey, RateLimitLayer, RateLimitService};
use http::{Request, Response, StatusCode};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// A token bucket in memory on tokio's (virtual) clock.
fn bucket(capacity: u32, rate: Rate) -> Arc<dyn RateLimiter> {
    let bucket = TokenBucket::new(capacity, rate).unwrap();
    Arc::new(MemoryLimiter::<_, _, 64>::with_clock(
        bucket,
        64,
        FullPolicy::DenyNewKeys,
        RuntimeClock::new(Tokio::new()),
    ))
}

/// A layer keyed by `x-key` that waits up to `max`.
fn layer(limiter: Arc<dyn RateLimiter>, max: Duration) -> RateLimitLayer {
    RateLimitLayer::builder(limiter)
        .key(HeaderKey::new("x-key").unwrap())
        .cost(|parts| {
            parts
                .headers
                .get("x-cost")
                .map_or(1, |cost| cost.to_str().unwrap().parse().unwrap())
        })
        .wait_up_to(max, Tokio::new())
        .build()
        .unwrap()
}

/// The inner service: `200`, recording each request's `x-id` and the
/// virtual instant it was called at.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<(u32, Instant)>>>,
}

impl Recorder {
    /// The ids seen so far, in order.
    fn ids(&self) -> Vec<u32> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|&(id, _)| id)
            .collect()
    }

    /// When request `id` was seen.
    fn at(&self, id: u32) -> Option<Instant> {
        let seen = self.seen.lock().unwrap();
        seen.iter().find(|&&(i, _)| i == id).map(|&(_, at)| at)
    }
}

impl Service<Request<String>> for Recorder {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<String>) -> Self::Future {
        let id = request.headers()["x-id"].to_str().unwrap().parse().unwrap();
        self.seen.lock().unwrap().push((id, Instant::now()));
        std::future::ready(Ok(Response::new("hello".to_owned())))
    }
}

/// Request `id` on key `key`.
fn request(key: &str, id: u32) -> Request<String> {
    Request::builder()
        .header("x-key", key)
        .header("x-id", id.to_string())
        .body(String::new())
        .unwrap()
}

/// Request `id` through `layer` on its own task, its arrival (its `call`)
/// done before this returns.
async fn spawn(
    layer: &RateLimitLayer,
    inner: &Recorder,
    request: Request<String>,
) -> JoinHandle<Answer> {
    let service = layer.layer(inner.clone());
    let handle = tokio::spawn(async move {
        let response = service.oneshot(request).await.unwrap();
        Answer::read(response).await
    });
    settle().await;
    handle
}

/// The response future of a request arriving through `service`: its
/// `call` done, the future not yet polled.
async fn arrive(
    service: &mut RateLimitService<Recorder>,
    request: Request<String>,
) -> <RateLimitService<Recorder> as Service<Request<String>>>::Future {
    service.ready().await.unwrap().call(request)
}

/// Polls `future` on its own task from now on, after letting it run as
/// far as it can without moving the clock.
async fn poll_from_now<F>(future: F) -> JoinHandle<Answer>
where
    F: Future<Output = Result<Response<guard_tower::ResponseBody<String>>, Infallible>>
        + Send
        + 'static,
{
    let handle = tokio::spawn(async move { Answer::read(future.await.unwrap()).await });
    settle().await;
    handle
}

/// Lets every task that can run, run, without moving the clock (a yield
/// does not let paused time auto-advance).
async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

/// Moves the virtual clock to `start + at` and lets the woken tasks run.
async fn advance_to(start: Instant, at: Duration) {
    let now = Instant::now();
    tokio::time::advance((start + at).saturating_duration_since(now)).await;
    settle().await;
    assert_eq!(
        Instant::now(),
        start + at,
        "the clock is moved by hand only"
    );
}

#[tokio::test(start_paused = true)]
async fn waiters_are_admitted_at_the_limiter_rate_in_arrival_order() {
    // Bursts of 2, one more a second: slots at 1 s, 2 s, 3 s, 4 s.
    let layer = layer(bucket(2, Rate::per_second(1)), Duration::from_secs(10));
    let inner = Recorder::default();
    let start = Instant::now();

    let mut handles = Vec::new();
    for id in 0..6 {
        handles.push(spawn(&layer, &inner, request("k", id)).await);
    }
    assert_eq!(inner.ids(), [0, 1], "the burst at once, the rest waiting");
    assert_eq!(inner.at(1), Some(start));

    for k in 1..=4u32 {
        let slot = Duration::from_secs(u64::from(k));
        advance_to(start, slot - Duration::from_millis(100)).await;
        assert_eq!(inner.ids().len(), 1 + k as usize, "nobody before slot {k}");
        advance_to(start, slot + Duration::from_millis(100)).await;
        let expected: Vec<u32> = (0..=k + 1).collect();
        assert_eq!(inner.ids(), expected, "one more at slot {k}, in order");
        assert_eq!(
            inner.at(k + 1),
            Some(start + slot + Duration::from_millis(100))
        );
    }

    for (id, handle) in handles.into_iter().enumerate() {
        let a = handle.await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "request {id}");
        assert_eq!(a.header("ratelimit-policy"), Some(r#""default";q=2;w=2"#));
        if id >= 2 {
            // The admitting decision's fields: no token left, the bucket
            // full again 1.9 s after the admission.
            assert_eq!(a.header("ratelimit"), Some(r#""default";r=0;t=2"#));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_arriving_while_others_wait_joins_the_line_behind_them() {
    let layer = layer(bucket(1, Rate::per_second(1)), Duration::from_secs(10));
    let inner = Recorder::default();
    let start = Instant::now();
    let first = spawn(&layer, &inner, request("k", 0)).await;
    let waiter = spawn(&layer, &inner, request("k", 1)).await;

    // At the slot the waiter's timer (1 s plus its jitter) has most likely
    // not fired yet; a request arriving now must not take its token.
    advance_to(start, Duration::from_secs(1)).await;
    let late = spawn(&layer, &inner, request("k", 2)).await;
    assert!(
        !inner.ids().contains(&2),
        "the late request passed the waiter"
    );
    // Behind it, a request that costs more than the whole quota.
    let mut too_big = request("k", 3);
    too_big.headers_mut().insert("x-cost", "2".parse().unwrap());
    let too_big = spawn(&layer, &inner, too_big).await;

    advance_to(start, Duration::from_millis(1_100)).await;
    assert_eq!(inner.ids(), [0, 1]);
    // The waiter admitted at 1.1 s, the next token is there at 2.1 s.
    advance_to(start, Duration::from_millis(2_200)).await;
    assert_eq!(inner.ids(), [0, 1, 2]);
    assert_eq!(inner.at(2), Some(start + Duration::from_millis(2_200)));
    for handle in [first, waiter, late] {
        assert_eq!(handle.await.unwrap().status, StatusCode::OK);
    }
    // Answered at its turn, as without waiting: no wait admits it.
    let too_big = too_big.await.unwrap();
    assert_eq!(too_big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(Instant::now(), start + Duration::from_millis(2_200));

    // Another key is not behind anyone.
    let other = spawn(&layer, &inner, request("other", 4)).await;
    assert_eq!(inner.at(4), Some(start + Duration::from_millis(2_200)));
    assert_eq!(other.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        inner.ids(),
        [0, 1, 2, 4],
        "the inner service saw no refusal"
    );
}

#[tokio::test(start_paused = true)]
async fn a_wait_longer_than_max_is_answered_429_at_once() {
    // One token per 2 s, a wait of at most 1 s.
    let layer = layer(
        bucket(1, Rate::per(1, Duration::from_secs(2))),
        Duration::from_secs(1),
    );
    let inner = Recorder::default();
    let start = Instant::now();
    let send = |id| layer.layer(inner.clone()).oneshot(request("k", id));

    assert_eq!(send(0).await.unwrap().status(), StatusCode::OK);
    // Awaited directly in paused time: any sleep would auto-advance the
    // clock to its end.
    let refused = Answer::read(send(1).await.unwrap()).await;
    assert_eq!(Instant::now(), start, "answered without sleeping");
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("2"));
    assert_eq!(refused.header("ratelimit"), Some(r#""default";r=0;t=2"#));
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(r#""default";q=1;w=2"#)
    );
    assert!(refused.text.contains("retry after 2 s"), "{}", refused.text);
    assert_eq!(inner.ids(), [0], "the inner service never saw the refusal");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_behind_others_is_answered_at_its_turn_when_its_wait_cannot_end_in_time() {
    // One token a second, a wait of at most 1.5 s: the first waiter is
    // admitted at 1 s; the second would need until 2 s.
    let layer = layer(bucket(1, Rate::per_second(1)), Duration::from_millis(1_500));
    let inner = Recorder::default();
    let start = Instant::now();
    let first = spawn(&layer, &inner, request("k", 0)).await;
    let waiter = spawn(&layer, &inner, request("k", 1)).await;
    let behind = spawn(&layer, &inner, request("k", 2)).await;

    // Let paused time run by itself now.
    let behind = behind.await.unwrap();
    let admitted = inner.at(1).unwrap();
    assert!(admitted >= start + Duration::from_secs(1));
    assert_eq!(
        Instant::now(),
        admitted,
        "answered at its turn, without sleeping towards its deadline"
    );
    assert_eq!(behind.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(behind.header("retry-after"), Some("1"));
    assert_eq!(behind.header("ratelimit"), Some(r#""default";r=0;t=1"#));
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(waiter.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        inner.ids(),
        [0, 1],
        "the inner service never saw the refusal"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_goes_away_hands_its_turn_on() {
    let layer = layer(bucket(1, Rate::per_second(1)), Duration::from_secs(10));
    let inner = Recorder::default();
    let start = Instant::now();
    let first = spawn(&layer, &inner, request("k", 0)).await;
    let gone = spawn(&layer, &inner, request("k", 1)).await;
    let next = spawn(&layer, &inner, request("k", 2)).await;

    // The head of the line goes away (its response future dropped): the
    // next one becomes the head and takes the slot at 1 s.
    gone.abort();
    settle().await;
    assert!(matches!(gone.await, Err(e) if e.is_cancelled()));
    advance_to(start, Duration::from_millis(1_100)).await;
    assert_eq!(inner.ids(), [0, 2]);
    assert_eq!(inner.at(2), Some(start + Duration::from_millis(1_100)));
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(next.await.unwrap().status, StatusCode::OK);

    // Nobody waits any more: a request refused now waits alone, its slot
    // at 2.1 s.
    let last = spawn(&layer, &inner, request("k", 3)).await;
    advance_to(start, Duration::from_millis(2_000)).await;
    assert_eq!(inner.ids(), [0, 2]);
    advance_to(start, Duration::from_millis(2_200)).await;
    assert_eq!(inner.at(3), Some(start + Duration::from_millis(2_200)));
    assert_eq!(last.await.unwrap().status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_full_line_is_answered_429_and_the_inner_service_sees_only_admissions() {
    // One token each 10 ms: the whole line is through in 2.57 s.
    let layer = layer(
        bucket(1, Rate::per(1, Duration::from_millis(10))),
        Duration::from_secs(60),
    );
    let inner = Recorder::default();
    let start = Instant::now();
    let capacity = u32::try_from(LINE_CAPACITY).unwrap();
    let mut handles = Vec::new();
    // The burst of one, then a full line.
    for id in 0..=capacity {
        handles.push(spawn(&layer, &inner, request("k", id)).await);
    }
    let full = spawn(&layer, &inner, request("k", capacity + 1)).await;
    let full = full.await.unwrap();
    assert_eq!(Instant::now(), start, "answered at once");
    assert_eq!(full.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(full.header("retry-after"), Some("1"));
    assert_eq!(
        full.header("ratelimit-policy"),
        Some(r#""default";q=1;w=1"#)
    );
    assert!(
        full.text.contains("too many requests are already waiting"),
        "{}",
        full.text
    );

    for handle in handles {
        assert_eq!(handle.await.unwrap().status, StatusCode::OK);
    }
    let expected: Vec<u32> = (0..=capacity).collect();
    assert_eq!(
        inner.ids(),
        expected,
        "every admission in order, no refusal"
    );
    assert!(Instant::now() >= start + Duration::from_millis(10) * capacity);
}

/// Asserts that requests 1, 2 and 3, waiting since `start` on a bucket of
/// one token a second emptied at `start`, are admitted in that order, one
/// at each of their checkpoints. A waiter admitted 100 ms after its token
/// (its jitter and the checkpoint) leaves an empty bucket, so the next
/// token comes 1 s after that admission: admissions at 1.1 s, 2.2 s,
/// 3.3 s, and none before 0.9 s, 2.0 s, 3.1 s.
async fn admitted_in_order_at_checkpoints(start: Instant, inner: &Recorder) {
    for k in 1..=3u32 {
        let at = Duration::from_millis(1_100) * k;
        advance_to(start, at - Duration::from_millis(200)).await;
        assert_eq!(inner.ids().len(), k as usize, "nobody before {at:?}");
        advance_to(start, at).await;
        let expected: Vec<u32> = (0..=k).collect();
        assert_eq!(
            inner.ids(),
            expected,
            "at {at:?}, in the order of the calls"
        );
        assert_eq!(inner.at(k), Some(start + at));
    }
}

#[tokio::test(start_paused = true)]
async fn requests_are_admitted_in_the_order_of_their_calls_whatever_order_they_are_polled_in() {
    let layer = layer(bucket(1, Rate::per_second(1)), Duration::from_secs(10));
    let inner = Recorder::default();
    let start = Instant::now();
    let first = spawn(&layer, &inner, request("k", 0)).await;

    // Arrivals 1, 2, 3, as a server that calls the service for several
    // requests before polling any; then polled last to first.
    let mut service = layer.layer(inner.clone());
    let one = arrive(&mut service, request("k", 1)).await;
    let two = arrive(&mut service, request("k", 2)).await;
    let three = arrive(&mut service, request("k", 3)).await;
    let three = poll_from_now(three).await;
    let two = poll_from_now(two).await;
    let one = poll_from_now(one).await;
    assert_eq!(inner.ids(), [0]);

    admitted_in_order_at_checkpoints(start, &inner).await;
    for handle in [first, one, two, three] {
        assert_eq!(handle.await.unwrap().status, StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_before_its_first_poll_hands_its_turn_on() {
    let layer = layer(bucket(1, Rate::per_second(1)), Duration::from_secs(10));
    let inner = Recorder::default();
    let start = Instant::now();
    let first = spawn(&layer, &inner, request("k", 0)).await;

    let mut service = layer.layer(inner.clone());
    let gone = arrive(&mut service, request("k", 1)).await;
    let next = arrive(&mut service, request("k", 2)).await;
    let last = arrive(&mut service, request("k", 3)).await;
    // The first in line goes away without its future ever being polled;
    // the others are polled last to first.
    drop(gone);
    let last = poll_from_now(last).await;
    let next = poll_from_now(next).await;

    advance_to(start, Duration::from_millis(1_100)).await;
    assert_eq!(
        inner.ids(),
        [0, 2],
        "the slot at 1 s goes to the next arrival"
    );
    advance_to(start, Duration::from_millis(2_200)).await;
    assert_eq!(inner.ids(), [0, 2, 3]);
    for handle in [first, next, last] {
        assert_eq!(handle.await.unwrap().status, StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_behind_one_not_yet_polled_waits_no_longer_than_its_max() {
    // One token a second, a wait of at most 2 s.
    let layer = layer(bucket(1, Rate::per_second(1)), Duration::from_secs(2));
    let inner = Recorder::default();
    let start = Instant::now();
    let first = spawn(&layer, &inner, request("k", 0)).await;
    assert_eq!(first.await.unwrap().status, StatusCode::OK);

    let mut service = layer.layer(inner.clone());
    // Refused, in line from its call; its future is held unpolled.
    let held = arrive(&mut service, request("k", 1)).await;
    let behind = spawn(&layer, &inner, request("k", 2)).await;

    // Paused time runs by itself: the token freed at 1 s is kept for the
    // earlier arrival, and the later one is answered at its deadline.
    let behind = behind.await.unwrap();
    assert_eq!(Instant::now(), start + Duration::from_secs(2));
    assert_eq!(behind.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        behind.text.contains("not admitted within"),
        "{}",
        behind.text
    );
    assert_eq!(inner.ids(), [0]);

    // Polled now, the earlier arrival is at its turn and takes that token.
    let held = poll_from_now(held).await;
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    assert_eq!(inner.at(1), Some(start + Duration::from_secs(2)));
}

/// A limiter that waits for its "backend" (one `Pending` before each
/// decision, then `latency` of virtual time), like a Redis one.
struct Remote {
    inner: Arc<dyn RateLimiter>,
    latency: Mutex<Duration>,
}

impl Remote {
    fn new(inner: Arc<dyn RateLimiter>) -> Arc<Remote> {
        Arc::new(Remote {
            inner,
            latency: Mutex::new(Duration::ZERO),
        })
    }
}

impl RateLimiter for Remote {
    fn check_n<'a>(&'a self, key: &'a str, cost: u32) -> LimitFuture<'a> {
        LimitFuture::Pending(Box::pin(async move {
            tokio::task::yield_now().await;
            let latency = *self.latency.lock().unwrap();
            tokio::time::sleep(latency).await;
            self.inner.check_n(key, cost).await
        }))
    }

    fn quota(&self) -> Quota {
        self.inner.quota()
    }

    fn reconfigure(&self, quota: Quota) -> Result<(), ReconfigureError> {
        self.inner.reconfigure(quota)
    }
}

#[tokio::test(start_paused = true)]
async fn a_limiter_that_waits_for_its_backend_waits_in_line_too() {
    let remote = Remote::new(bucket(1, Rate::per_second(1)));
    let layer = layer(remote, Duration::from_millis(1_500));
    let inner = Recorder::default();
    let start = Instant::now();
    let first = spawn(&layer, &inner, request("k", 0)).await;
    let waiter = spawn(&layer, &inner, request("k", 1)).await;
    let behind = spawn(&layer, &inner, request("k", 2)).await;
    advance_to(start, Duration::from_millis(1_100)).await;
    assert_eq!(inner.ids(), [0, 1]);
    assert_eq!(inner.at(1), Some(start + Duration::from_millis(1_100)));
    // Its turn came at 1.1 s with 0.4 s left and 1 s to wait.
    let behind = behind.await.unwrap();
    assert_eq!(behind.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(Instant::now(), start + Duration::from_millis(1_100));
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(waiter.await.unwrap().status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn a_backend_that_holds_waiters_past_their_wait_gets_them_429_at_their_deadline() {
    // One token each 3 s, a wait of at most 5 s.
    let remote = Remote::new(bucket(1, Rate::per(1, Duration::from_secs(3))));
    let layer = layer(
        Arc::clone(&remote) as Arc<dyn RateLimiter>,
        Duration::from_secs(5),
    );
    let inner = Recorder::default();
    let start = Instant::now();
    let first = spawn(&layer, &inner, request("k", 0)).await;
    // Refused (3 s to wait), then in line: the head.
    let head = spawn(&layer, &inner, request("k", 1)).await;
    // Behind it, without a decision of its own.
    let behind = spawn(&layer, &inner, request("k", 2)).await;
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    // From now on the backend takes 10 s to decide: the head's decision
    // at its slot (3 s) would end after both deadlines (5 s).
    *remote.latency.lock().unwrap() = Duration::from_secs(10);

    let head = head.await.unwrap();
    assert_eq!(
        Instant::now(),
        start + Duration::from_secs(5),
        "at its deadline"
    );
    assert_eq!(head.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(head.text.contains("not admitted within"), "{}", head.text);
    // Its own refusal's Retry-After and fields, when it had one.
    assert_eq!(head.header("retry-after"), Some("3"));
    assert_eq!(head.header("ratelimit"), Some(r#""default";r=0;t=3"#));
    let behind = behind.await.unwrap();
    assert_eq!(Instant::now(), start + Duration::from_secs(5));
    assert_eq!(behind.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(behind.header("retry-after"), Some("1"), "none: 1 s");
    assert_eq!(behind.header("ratelimit"), None);
    assert_eq!(
        behind.header("ratelimit-policy"),
        Some(r#""default";q=1;w=3"#)
    );
    assert_eq!(inner.ids(), [0]);
}

#[tokio::test(start_paused = true)]
async fn with_a_limiter_that_waits_for_its_backend_requests_are_admitted_in_the_order_of_their_calls()
 {
    let layer = layer(
        Remote::new(bucket(1, Rate::per_second(1))),
        Duration::from_secs(10),
    );
    let inner = Recorder::default();
    let start = Instant::now();
    let first = spawn(&layer, &inner, request("k", 0)).await;
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    assert_eq!(Instant::now(), start);

    // Arrivals 1, 2, 3, their decisions asked in the order 3, 2, 1.
    let mut service = layer.layer(inner.clone());
    let one = arrive(&mut service, request("k", 1)).await;
    let two = arrive(&mut service, request("k", 2)).await;
    let three = arrive(&mut service, request("k", 3)).await;
    let three = poll_from_now(three).await;
    let two = poll_from_now(two).await;
    let one = poll_from_now(one).await;

    admitted_in_order_at_checkpoints(start, &inner).await;
    for handle in [one, two, three] {
        assert_eq!(handle.await.unwrap().status, StatusCode::OK);
    }
}

#[test]
fn a_wait_of_zero_is_refused() {
    let limiter = bucket(1, Rate::per_second(1));
    let err = RateLimitLayer::builder(limiter)
        .wait_up_to(Duration::ZERO, Tokio::new())
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        ConfigError::WaitUpTo {
            value: Duration::ZERO
        }
    );
    assert!(err.to_string().starts_with("wait up to: 0ns"), "{err}");
}

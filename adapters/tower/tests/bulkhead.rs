//! The bulkhead layer: at most `max` requests in the inner service, the
//! rest answered `503` or, with a wait, let in in the order of their calls
//! within it; permits come back when a response completes or a client
//! goes away. On tokio's paused clock, so the waits take no time.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use guard_tokio::Tokio;
use guard_tower::{BulkheadLayer, ConfigError};
use http::{Request, Response, StatusCode};
use tokio::sync::Semaphore;
use tower::{Layer, Service, ServiceExt};

/// The inner service: logs the id of each request it is called with, then
/// answers once the test opens its gate (one answer per permit added, in
/// call order).
#[derive(Clone)]
struct Gated {
    calls: Arc<Mutex<Vec<u32>>>,
    gate: Arc<Semaphore>,
}

impl Gated {
    fn new() -> Self {
        Gated {
            calls: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }

    fn calls(&self) -> Vec<u32> {
        self.calls.lock().unwrap().clone()
    }

    fn open(&self, n: usize) {
        self.gate.add_permits(n);
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<String>, Infallible>> + Send>>;

impl Service<Request<u32>> for Gated {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<u32>) -> Answer {
        let id = *request.body();
        self.calls.lock().unwrap().push(id);
        let gate = Arc::clone(&self.gate);
        Box::pin(async move {
            gate.acquire().await.unwrap().forget();
            Ok(Response::new(format!("done {id}")))
        })
    }
}

/// Calls the service now (the request's arrival) and runs its response
/// on a task of its own; the status and text when it ends.
async fn call<S>(service: &mut S, id: u32) -> tokio::task::JoinHandle<(StatusCode, Option<String>)>
where
    S: Service<Request<u32>, Response = Response<String>>,
    S::Future: Send + 'static,
    S::Error: std::fmt::Debug,
{
    let future = service.ready().await.unwrap().call(Request::new(id));
    tokio::spawn(async move {
        let response = future.await.unwrap();
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        (status, retry_after)
    })
}

/// Lets the scheduled tasks run (the clock is paused: no time passes).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn at_most_max_requests_are_in_and_the_rest_get_503() {
    let layer = BulkheadLayer::builder("reports", 2).build().unwrap();
    let inner = Gated::new();
    let mut service = layer.layer(inner.clone());
    let first = call(&mut service, 1).await;
    let second = call(&mut service, 2).await;
    let refused = call(&mut service, 3).await.await.unwrap();
    assert_eq!(refused, (StatusCode::SERVICE_UNAVAILABLE, Some("1".into())));
    assert_eq!(layer.in_flight(), 2);
    assert_eq!(layer.refused(), 1);
    settle().await;
    assert_eq!(inner.calls(), [1, 2], "the refused one never reached it");

    // One answer: its permit is back at once.
    inner.open(1);
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    assert_eq!(layer.in_flight(), 1);
    let third = call(&mut service, 4).await;
    settle().await;
    assert_eq!(inner.calls(), [1, 2, 4]);

    // A client that goes away gives its permit back.
    second.abort();
    let _ = second.await;
    assert_eq!(layer.in_flight(), 1);
    inner.open(1);
    assert_eq!(third.await.unwrap().0, StatusCode::OK);
    assert_eq!(layer.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn waiters_get_in_in_the_order_of_their_calls_within_their_wait() {
    let layer = BulkheadLayer::builder("db", 1)
        .wait_up_to(Duration::from_secs(5), Tokio::new())
        .build()
        .unwrap();
    let inner = Gated::new();
    let mut service = layer.layer(inner.clone());
    let running = call(&mut service, 0).await;
    // Called in this order; their futures are first polled in another.
    let a = service.ready().await.unwrap().call(Request::new(1));
    let b = service.ready().await.unwrap().call(Request::new(2));
    let c = service.ready().await.unwrap().call(Request::new(3));
    assert_eq!(layer.waiting(), 3);
    let c = tokio::spawn(c);
    let b = tokio::spawn(b);
    let a = tokio::spawn(a);
    settle().await;
    assert_eq!(inner.calls(), [0]);

    for expected in [vec![0, 1], vec![0, 1, 2], vec![0, 1, 2, 3]] {
        inner.open(1);
        settle().await;
        assert_eq!(inner.calls(), expected, "in call order");
    }
    inner.open(1);
    for done in [a, b, c] {
        assert_eq!(done.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(running.await.unwrap().0, StatusCode::OK);
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_past_its_wait_gets_503_and_one_that_leaves_passes_its_turn() {
    let layer = BulkheadLayer::builder("db", 1)
        .wait_up_to(Duration::from_secs(5), Tokio::new())
        .build()
        .unwrap();
    let inner = Gated::new();
    let mut service = layer.layer(inner.clone());
    let running = call(&mut service, 0).await;
    let leaving = call(&mut service, 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let late = call(&mut service, 2).await;
    settle().await;
    leaving.abort();
    let _ = leaving.await;
    assert_eq!(layer.waiting(), 1, "the one that left is out of line");

    // Five seconds after its call, the waiter behind gets its 503.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (status, retry_after) = late.await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(layer.refused(), 1);
    assert_eq!(inner.calls(), [0], "neither waiter reached the service");

    inner.open(1);
    assert_eq!(running.await.unwrap().0, StatusCode::OK);
    assert_eq!((layer.in_flight(), layer.waiting()), (0, 0));
}

#[test]
fn a_bulkhead_that_lets_nothing_in_is_refused() {
    let err = BulkheadLayer::builder("x", 0).build().unwrap_err();
    assert_eq!(err, ConfigError::MaxConcurrent { value: 0 });
    assert!(
        err.to_string().starts_with("bulkhead max concurrent: 0"),
        "{err}"
    );
    let layer = BulkheadLayer::builder("x", 1).build().unwrap();
    assert!(layer.set_max(0).is_err());
    assert!(layer.set_max(3).is_ok());
}

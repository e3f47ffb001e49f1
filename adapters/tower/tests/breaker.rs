//! The circuit-breaker layer through `tower::ServiceExt::oneshot`, on a
//! clock the tests move by hand.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use common::Answer;
use guard_core::breaker::{BreakerConfig, CircuitBreaker, CountWindow, State};
use guard_std::ManualClock;
use guard_tower::CircuitBreakerLayer;
use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};

/// What the inner service does with the next call.
#[derive(Clone, Copy, Debug)]
enum Reply {
    Status(StatusCode),
    /// Takes this long (on the test clock), then answers 200.
    Slow(Duration),
    /// Fails with a service error.
    Error,
    /// Never answers.
    Hang,
}

/// An inner service answering as told, counting its calls.
#[derive(Clone)]
struct Inner {
    reply: Arc<Mutex<Reply>>,
    calls: Arc<Mutex<u32>>,
    clock: ManualClock,
}

impl Inner {
    fn new(clock: &ManualClock) -> Self {
        Inner {
            reply: Arc::new(Mutex::new(Reply::Status(StatusCode::OK))),
            calls: Arc::default(),
            clock: clock.clone(),
        }
    }

    fn set(&self, reply: Reply) {
        *self.reply.lock().unwrap() = reply;
    }

    fn calls(&self) -> u32 {
        *self.calls.lock().unwrap()
    }
}

impl Service<Request<String>> for Inner {
    type Response = Response<String>;
    type Error = &'static str;
    type Future = Pin<Box<dyn Future<Output = Result<Response<String>, &'static str>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        *self.calls.lock().unwrap() += 1;
        let reply = *self.reply.lock().unwrap();
        let clock = self.clock.clone();
        Box::pin(async move {
            let status = match reply {
                Reply::Status(status) => status,
                Reply::Slow(took) => {
                    clock.advance(took);
                    StatusCode::OK
                }
                Reply::Error => return Err("connection reset"),
                Reply::Hang => std::future::pending().await,
            };
            let mut response = Response::new(String::from("inner"));
            *response.status_mut() = status;
            Ok(response)
        })
    }
}

fn layer(config: BreakerConfig, clock: &ManualClock) -> CircuitBreakerLayer<CountWindow<4>> {
    let breaker = CircuitBreaker::new(config, CountWindow::<4>::new()).unwrap();
    CircuitBreakerLayer::builder("backend", breaker)
        .clock(clock.clone())
        .build()
}

/// The status of one call, or the inner service's error.
async fn call(
    layer: &CircuitBreakerLayer<CountWindow<4>>,
    inner: &Inner,
) -> Result<Answer, &'static str> {
    let response = layer
        .layer(inner.clone())
        .oneshot(Request::new(String::new()))
        .await?;
    Ok(Answer::read(response).await)
}

fn config() -> BreakerConfig {
    BreakerConfig::new()
        .with_minimum_calls(4)
        .with_failure_rate(50)
        .with_half_open_calls(2)
        .with_wait_in_open(Duration::from_secs(30))
        .with_slow_call_duration(Duration::from_secs(2))
        .with_slow_call_rate(75)
}

#[tokio::test]
async fn server_errors_open_the_breaker_which_answers_503_with_retry_after() {
    let clock = ManualClock::default();
    let (layer, inner) = (layer(config(), &clock), Inner::new(&clock));
    for reply in [StatusCode::OK, StatusCode::BAD_GATEWAY, StatusCode::OK] {
        inner.set(Reply::Status(reply));
        assert_eq!(call(&layer, &inner).await.unwrap().status, reply);
    }
    assert_eq!(
        layer.state(),
        State::Closed,
        "three calls: below the minimum"
    );
    inner.set(Reply::Error);
    assert_eq!(call(&layer, &inner).await.unwrap_err(), "connection reset");
    // Two failures of four: 50%.
    assert_eq!(layer.state(), State::Open);

    clock.advance(Duration::from_millis(10_500));
    let refused = call(&layer, &inner).await.unwrap();
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        refused.header("retry-after"),
        Some("20"),
        "19.5 s, rounded up"
    );
    assert!(
        refused.text.contains("circuit breaker backend is OPEN"),
        "{}",
        refused.text
    );
    assert_eq!(inner.calls(), 4, "a refused call never reaches the service");
    assert_eq!(layer.metrics().not_permitted, 1);
}

#[tokio::test]
async fn half_open_lets_its_trials_through_and_closes_when_they_pass() {
    let clock = ManualClock::default();
    let (layer, inner) = (layer(config(), &clock), Inner::new(&clock));
    inner.set(Reply::Status(StatusCode::INTERNAL_SERVER_ERROR));
    for _ in 0..4 {
        call(&layer, &inner).await.unwrap();
    }
    assert_eq!(layer.state(), State::Open);
    clock.advance(Duration::from_secs(30));

    // Two trials; a third call while they are out is refused.
    inner.set(Reply::Hang);
    let service = layer.layer(inner.clone());
    let first = service.clone().oneshot(Request::new(String::new()));
    let second = service.clone().oneshot(Request::new(String::new()));
    let mut first = Box::pin(first);
    let mut second = Box::pin(second);
    assert!(futures_poll(&mut first).is_none());
    assert!(futures_poll(&mut second).is_none());
    assert_eq!(layer.state(), State::HalfOpen);
    let refused = call(&layer, &inner).await.unwrap();
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.header("retry-after"), Some("1"));
    // A client that goes away hands its trial back.
    drop(first);
    drop(second);
    inner.set(Reply::Status(StatusCode::OK));
    assert_eq!(call(&layer, &inner).await.unwrap().status, StatusCode::OK);
    assert_eq!(layer.state(), State::HalfOpen);
    assert_eq!(call(&layer, &inner).await.unwrap().status, StatusCode::OK);
    assert_eq!(layer.state(), State::Closed);
}

#[tokio::test]
async fn failed_trials_open_it_again_and_slow_calls_count() {
    let clock = ManualClock::default();
    let (layer, inner) = (layer(config(), &clock), Inner::new(&clock));
    // Three slow calls of four: 75% slow, though none failed.
    // Slow: longer than the 2 s threshold.
    inner.set(Reply::Slow(Duration::from_millis(2_001)));
    for _ in 0..3 {
        assert_eq!(call(&layer, &inner).await.unwrap().status, StatusCode::OK);
    }
    inner.set(Reply::Status(StatusCode::OK));
    call(&layer, &inner).await.unwrap();
    assert_eq!(layer.state(), State::Open);
    assert_eq!(layer.metrics().tally.slow, 3);

    clock.advance(Duration::from_secs(30));
    inner.set(Reply::Status(StatusCode::SERVICE_UNAVAILABLE));
    call(&layer, &inner).await.unwrap();
    inner.set(Reply::Status(StatusCode::OK));
    call(&layer, &inner).await.unwrap();
    // One failed trial of two: 50%, open again for another 30 s.
    assert_eq!(layer.state(), State::Open);
    let refused = call(&layer, &inner).await.unwrap();
    assert_eq!(refused.header("retry-after"), Some("30"));
}

#[tokio::test]
async fn what_counts_as_a_failure_is_the_callers_choice() {
    let clock = ManualClock::default();
    let breaker = CircuitBreaker::new(config(), CountWindow::<4>::new()).unwrap();
    let layer = CircuitBreakerLayer::builder("backend", breaker)
        .clock(clock.clone())
        .failure_when(|status| status == StatusCode::TOO_MANY_REQUESTS)
        .build();
    let inner = Inner::new(&clock);
    inner.set(Reply::Status(StatusCode::INTERNAL_SERVER_ERROR));
    for _ in 0..4 {
        call(&layer, &inner).await.unwrap();
    }
    assert_eq!(layer.state(), State::Closed, "500s are not failures here");
    inner.set(Reply::Status(StatusCode::TOO_MANY_REQUESTS));
    for _ in 0..2 {
        call(&layer, &inner).await.unwrap();
    }
    assert_eq!(layer.state(), State::Open);
    // Forced moves go through the layer.
    layer.with_breaker(|b| b.disable());
    assert_eq!(layer.state(), State::Disabled);
    assert_eq!(
        call(&layer, &inner).await.unwrap().status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Polls `future` once; its output if it was ready.
fn futures_poll<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    match Pin::new(future).poll(&mut cx) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

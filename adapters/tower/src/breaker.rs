//! A circuit-breaker layer: guard-core's [`CircuitBreaker`] in front of a
//! service, answering `503` with `Retry-After` while it is open.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use guard_core::breaker::{
    CallWindow, CircuitBreaker, CountWindow, Metrics, NotPermitted, Permit, State, Transition,
};
use guard_std::metrics::{record_breaker_call, record_breaker_state, record_breaker_transition};
use guard_std::{Clock, SystemClock};
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::ResponseBody;
use crate::headers::{ceil_secs, write_retry_after};

/// Which responses count as failures.
type FailureFn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// What every service of one layer shares.
struct Shared<W> {
    name: String,
    breaker: Mutex<CircuitBreaker<W>>,
    clock: Box<dyn Clock>,
    is_failure: Box<FailureFn>,
}

impl<W> Shared<W> {
    fn breaker(&self) -> MutexGuard<'_, CircuitBreaker<W>> {
        // A panic elsewhere while holding the lock leaves a whole breaker:
        // every method completes its move before it returns.
        self.breaker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn moved(&self, transition: Transition) {
        tracing::info!(
            "circuit breaker {}: {} -> {}",
            self.name,
            transition.from,
            transition.to
        );
        record_breaker_transition(&self.name, transition);
    }
}

/// A tower [`Layer`] that puts a [`CircuitBreaker`] in front of a service
/// of `http` requests.
///
/// | the breaker | the request |
/// | --- | --- |
/// | closed, or half-open with a trial left | passed to the inner service; its outcome is recorded: an error, or a response [`failure_when`](CircuitBreakerLayerBuilder::failure_when) says is one (5xx by default), is a failure, and a call that took at least the slow-call duration is slow |
/// | open | `503 Service Unavailable` with `Retry-After`: the seconds until it half-opens, rounded up |
/// | half-open with every trial out, or forced open | `503` with `Retry-After: 1` |
///
/// A request whose response future is dropped before it completes (the
/// client went away) is not judged: its permission is handed back. Moves
/// are logged at `info` and counted (`guard_breaker_transitions_total`,
/// `guard_breaker_state`), and every call in `guard_breaker_calls_total`,
/// all by the breaker's name.
///
/// ```
/// use std::time::Duration;
///
/// use guard_core::breaker::{BreakerConfig, CircuitBreaker, CountWindow};
/// use guard_tower::CircuitBreakerLayer;
/// use http::{Request, Response, StatusCode};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// let config = BreakerConfig::new()
///     .with_minimum_calls(2)
///     .with_wait_in_open(Duration::from_secs(30));
/// let breaker = CircuitBreaker::new(config, CountWindow::<10>::new())?;
/// let layer = CircuitBreakerLayer::builder("payments", breaker).build();
/// let service = ServiceBuilder::new().layer(layer.clone()).service(service_fn(|_| async {
///     let mut failing = Response::new(String::from("down"));
///     *failing.status_mut() = StatusCode::BAD_GATEWAY;
///     Ok::<_, std::convert::Infallible>(failing)
/// }));
///
/// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
/// for _ in 0..2 {
///     let failed = service.clone().oneshot(Request::new(String::new())).await?;
///     assert_eq!(failed.status(), StatusCode::BAD_GATEWAY);
/// }
/// // Two failures in two calls: open.
/// let refused = service.clone().oneshot(Request::new(String::new())).await?;
/// assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
/// assert_eq!(refused.headers()["retry-after"], "30");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CircuitBreakerLayer<W = CountWindow<100>> {
    shared: Arc<Shared<W>>,
}

impl<W> Clone for CircuitBreakerLayer<W> {
    fn clone(&self) -> Self {
        CircuitBreakerLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<W> fmt::Debug for CircuitBreakerLayer<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerLayer")
            .field("name", &self.shared.name)
            .field("state", &self.shared.breaker().state())
            .finish_non_exhaustive()
    }
}

/// Builds a [`CircuitBreakerLayer`].
#[must_use = "a builder does nothing until built"]
pub struct CircuitBreakerLayerBuilder<W> {
    name: String,
    breaker: CircuitBreaker<W>,
    clock: Box<dyn Clock>,
    is_failure: Box<FailureFn>,
}

impl<W> fmt::Debug for CircuitBreakerLayerBuilder<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerLayerBuilder")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<W: CallWindow + Send + 'static> CircuitBreakerLayerBuilder<W> {
    /// The clock calls are timed and the breaker's waits read on; the
    /// operating system's monotonic clock by default.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Which response statuses are failures; server errors (5xx) by
    /// default. An error of the inner service is always one.
    pub fn failure_when(
        mut self,
        is_failure: impl Fn(StatusCode) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.is_failure = Box::new(is_failure);
        self
    }

    /// The layer.
    pub fn build(self) -> CircuitBreakerLayer<W> {
        record_breaker_state(&self.name, self.breaker.state());
        CircuitBreakerLayer {
            shared: Arc::new(Shared {
                name: self.name,
                breaker: Mutex::new(self.breaker),
                clock: self.clock,
                is_failure: self.is_failure,
            }),
        }
    }
}

impl<W: CallWindow + Send + 'static> CircuitBreakerLayer<W> {
    /// A builder for a layer named `name` (in logs and metrics) over
    /// `breaker`.
    pub fn builder(
        name: impl Into<String>,
        breaker: CircuitBreaker<W>,
    ) -> CircuitBreakerLayerBuilder<W> {
        CircuitBreakerLayerBuilder {
            name: name.into(),
            breaker,
            clock: Box::new(SystemClock::new()),
            is_failure: Box::new(|status| status.is_server_error()),
        }
    }

    /// The breaker's state as of its last reading.
    pub fn state(&self) -> State {
        self.shared.breaker().state()
    }

    /// What the breaker is judging, and its refusals, now.
    pub fn metrics(&self) -> Metrics {
        let now = self.shared.clock.now();
        self.shared.breaker().metrics(now)
    }

    /// Runs `f` on the breaker (to force it open, disable or close it);
    /// a move it makes is logged and counted.
    pub fn with_breaker<T>(&self, f: impl FnOnce(&mut CircuitBreaker<W>) -> T) -> T {
        let before = self.state();
        let out = f(&mut self.shared.breaker());
        let after = self.state();
        if before != after {
            self.shared.moved(Transition {
                from: before,
                to: after,
            });
        }
        out
    }
}

impl<S, W> Layer<S> for CircuitBreakerLayer<W> {
    type Service = CircuitBreakerService<S, W>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreakerService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service of a [`CircuitBreakerLayer`].
pub struct CircuitBreakerService<S, W = CountWindow<100>> {
    inner: S,
    shared: Arc<Shared<W>>,
}

impl<S: Clone, W> Clone for CircuitBreakerService<S, W> {
    fn clone(&self) -> Self {
        CircuitBreakerService {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, W> fmt::Debug for CircuitBreakerService<S, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerService")
            .field("inner", &self.inner)
            .field("name", &self.shared.name)
            .finish()
    }
}

/// The `503` of a call the breaker does not permit.
fn refusal(name: &str, refused: NotPermitted) -> Response<Bytes> {
    let secs = refused.retry_after.map_or(1, |wait| ceil_secs(wait).max(1));
    let mut response = Response::new(Bytes::from(format!(
        "503 Service Unavailable: circuit breaker {name} is {}; retry after {secs} s\n",
        refused.state
    )));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    write_retry_after(response.headers_mut(), secs);
    response
}

impl<S, W, ReqBody, ResBody> Service<Request<ReqBody>> for CircuitBreakerService<S, W>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    W: CallWindow + Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = BreakerFuture<S::Future, W>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let now = self.shared.clock.now();
        let acquired = {
            let mut breaker = self.shared.breaker();
            let before = breaker.state();
            let acquired = breaker.try_acquire(now);
            let after = breaker.state();
            drop(breaker);
            if before != after {
                self.shared.moved(Transition {
                    from: before,
                    to: after,
                });
            }
            acquired
        };
        match acquired {
            Ok(permit) => BreakerFuture {
                state: Call::Running {
                    future: self.inner.call(request),
                    judge: Some(Judge {
                        permit: Some(permit),
                        shared: Arc::clone(&self.shared),
                    }),
                },
            },
            Err(refused) => {
                record_breaker_call(&self.shared.name, "not_permitted", false);
                BreakerFuture {
                    state: Call::Refused {
                        response: Some(refusal(&self.shared.name, refused)),
                    },
                }
            }
        }
    }
}

/// Reports a permitted call's outcome; one dropped unreported hands its
/// permission back unjudged.
struct Judge<W: CallWindow> {
    permit: Option<Permit>,
    shared: Arc<Shared<W>>,
}

impl<W: CallWindow> Judge<W> {
    fn report(&mut self, failed: bool) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let now = self.shared.clock.now();
        let mut breaker = self.shared.breaker();
        let slow = breaker
            .config()
            .is_slow(now.saturating_duration_since(permit.started()));
        let moved = breaker.on_result(permit, now, failed);
        drop(breaker);
        let outcome = if failed { "failed" } else { "successful" };
        record_breaker_call(&self.shared.name, outcome, slow);
        if let Some(transition) = moved {
            self.shared.moved(transition);
        }
    }
}

impl<W: CallWindow> Drop for Judge<W> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.shared.breaker().on_ignored(permit);
            record_breaker_call(&self.shared.name, "ignored", false);
        }
    }
}

pin_project! {
    /// The future of a [`CircuitBreakerService`] call.
    pub struct BreakerFuture<F, W>
    where
        W: CallWindow,
    {
        #[pin]
        state: Call<F, W>,
    }
}

pin_project! {
    #[project = CallProj]
    enum Call<F, W>
    where
        W: CallWindow,
    {
        Running { #[pin] future: F, judge: Option<Judge<W>> },
        Refused { response: Option<Response<Bytes>> },
    }
}

impl<F, W, B, E> Future for BreakerFuture<F, W>
where
    F: Future<Output = Result<Response<B>, E>>,
    W: CallWindow,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            CallProj::Running { future, judge } => {
                let result = ready!(future.poll(cx));
                if let Some(mut judge) = judge.take() {
                    let failed = match &result {
                        Ok(response) => (judge.shared.is_failure)(response.status()),
                        Err(_) => true,
                    };
                    judge.report(failed);
                }
                Poll::Ready(result.map(|response| response.map(ResponseBody::inner)))
            }
            CallProj::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response.map(ResponseBody::text))),
                // Polled again after completion.
                None => Poll::Pending,
            },
        }
    }
}

//! A concurrency-limit layer: guard-core's [`Bulkhead`] in front of a
//! service, answering `503` with `Retry-After` when every permit is out,
//! or holding the request in arrival order for a bounded wait.

use std::fmt;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker, ready};
use std::time::{Duration, Instant};

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::bulkhead::{self, Bulkhead, Full, ZeroConcurrency};
use guard_std::BoxFuture;
use guard_std::run::Runtime;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::ConfigError;
use crate::headers::write_retry_after;

/// The most requests that wait for a permit at once; one more is answered
/// `503` at once.
pub const BULKHEAD_LINE: usize = 1_024;

type Permits = Bulkhead<CriticalSectionRawMutex, BULKHEAD_LINE>;

/// A permit of the layer's bulkhead, held by the response future.
pub type BulkheadPermit = bulkhead::Permit<Arc<Permits>, CriticalSectionRawMutex, BULKHEAD_LINE>;

/// A runtime's clock and timers, type-erased so the layer stays one type.
trait Timer: Send + Sync {
    fn now(&self) -> Instant;
    fn sleep_until(&self, at: Instant) -> BoxFuture<'static, ()>;
}

impl<R: Runtime> Timer for R {
    fn now(&self) -> Instant {
        Runtime::now(self)
    }

    fn sleep_until(&self, at: Instant) -> BoxFuture<'static, ()> {
        let runtime = self.clone();
        Box::pin(async move { Runtime::sleep_until(&runtime, at).await })
    }
}

/// The longest a request waits for a permit, on this runtime's clock.
struct Wait {
    max: Duration,
    timer: Box<dyn Timer>,
}

/// What every service of one layer shares.
struct Shared {
    name: String,
    permits: Arc<Permits>,
    wait: Option<Arc<Wait>>,
    refused: AtomicU64,
}

impl Shared {
    /// `503` for a request that found no permit (within its wait). Out of
    /// line: the admitting path stays small.
    #[cold]
    #[inline(never)]
    fn refusal<B: From<String>>(&self, full: Full, waited: Option<Duration>) -> Response<B> {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let text = match waited {
            None => format!(
                "503 Service Unavailable: bulkhead {} is full ({} calls in flight, {} waiting); \
                 retry after 1 s\n",
                self.name, full.max, full.waiting
            ),
            Some(wait) => format!(
                "503 Service Unavailable: bulkhead {} had no free call within {} ms; retry \
                 after 1 s\n",
                self.name,
                wait.as_millis()
            ),
        };
        let mut response = Response::new(B::from(text));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        write_retry_after(response.headers_mut(), 1);
        response
    }
}

/// A tower [`Layer`] that lets at most `max` requests into a service at
/// once (a bulkhead, Resilience4j's semaphore bulkhead), as tower's
/// `ConcurrencyLimitLayer` does, but answering instead of holding every
/// caller in `poll_ready` without bound.
///
/// | permits | the request |
/// | --- | --- |
/// | one free and nobody waiting | passed to the inner service; the permit is held until its response future completes or is dropped |
/// | none, no wait configured | `503 Service Unavailable` with `Retry-After: 1` |
/// | none, with [`wait_up_to`](BulkheadLayerBuilder::wait_up_to) | waits in arrival order (its arrival is its `Service::call`) up to that long, then passes as above or gets the `503`; more than [`BULKHEAD_LINE`] waiting: the `503` at once |
///
/// A request never passes one that waits (guard-core's arrival order),
/// and a waiter whose client goes away leaves the line, its permit (if it
/// was granted one) passing to the next.
///
/// ```
/// use guard_tower::BulkheadLayer;
/// use http::{Request, Response, StatusCode};
/// use tower::{Service, ServiceExt, service_fn};
///
/// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
/// let layer = BulkheadLayer::builder("reports", 1).build()?;
/// let hang = service_fn(|_: Request<String>| async {
///     std::future::pending::<()>().await;
///     Ok::<_, std::convert::Infallible>(Response::new(String::new()))
/// });
/// let mut service = tower::Layer::layer(&layer, hang);
/// let _running = service.ready().await?.call(Request::new(String::new()));
/// let refused = service.ready().await?.call(Request::new(String::new())).await?;
/// assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
/// assert_eq!(layer.in_flight(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct BulkheadLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for BulkheadLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadLayer")
            .field("name", &self.shared.name)
            .field("max", &self.shared.permits.max())
            .field("in_flight", &self.shared.permits.in_flight())
            .field("wait_up_to", &self.shared.wait.as_ref().map(|w| w.max))
            .finish()
    }
}

/// Builds a [`BulkheadLayer`].
#[must_use = "a builder does nothing until built"]
pub struct BulkheadLayerBuilder {
    name: String,
    max: u32,
    wait: Option<Wait>,
}

impl fmt::Debug for BulkheadLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadLayerBuilder")
            .field("name", &self.name)
            .field("max", &self.max)
            .field("wait_up_to", &self.wait.as_ref().map(|w| w.max))
            .finish()
    }
}

impl BulkheadLayerBuilder {
    /// Hold a request that finds no free permit up to `max` on `runtime`'s
    /// clock (`guard_tokio::Tokio`, `guard_smol::AsyncIo`), in arrival
    /// order, instead of answering `503` at once.
    pub fn wait_up_to<R: Runtime>(mut self, max: Duration, runtime: R) -> Self {
        self.wait = Some(Wait {
            max,
            timer: Box::new(runtime),
        });
        self
    }

    /// The layer, or the parameter it cannot work with.
    pub fn build(self) -> Result<BulkheadLayer, ConfigError> {
        let permits = Bulkhead::new(self.max)
            .map_err(|ZeroConcurrency| ConfigError::MaxConcurrent { value: self.max })?;
        if let Some(wait) = &self.wait
            && wait.max.is_zero()
        {
            return Err(ConfigError::WaitUpTo { value: wait.max });
        }
        Ok(BulkheadLayer {
            shared: Arc::new(Shared {
                name: self.name,
                permits: Arc::new(permits),
                wait: self.wait.map(Arc::new),
                refused: AtomicU64::new(0),
            }),
        })
    }
}

impl BulkheadLayer {
    /// A builder of a bulkhead named `name` (in its answers) letting
    /// `max` requests in at once; no waiting by default.
    pub fn builder(name: impl Into<String>, max: u32) -> BulkheadLayerBuilder {
        BulkheadLayerBuilder {
            name: name.into(),
            max,
            wait: None,
        }
    }

    /// Requests in the inner service now.
    pub fn in_flight(&self) -> u32 {
        self.shared.permits.in_flight()
    }

    /// Requests waiting for a permit now.
    pub fn waiting(&self) -> usize {
        self.shared.permits.waiting()
    }

    /// Requests answered `503` since the layer was built.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// Lets `max` requests in at once from now (see guard-core's
    /// `Bulkhead::set_max`).
    pub fn set_max(&self, max: u32) -> Result<(), ConfigError> {
        self.shared
            .permits
            .set_max(max)
            .map_err(|ZeroConcurrency| ConfigError::MaxConcurrent { value: max })
    }
}

impl<S> Layer<S> for BulkheadLayer {
    type Service = BulkheadService<S>;

    fn layer(&self, inner: S) -> BulkheadService<S> {
        BulkheadService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service of a [`BulkheadLayer`]. Readiness is the inner service's;
/// a request that waits takes a clone of the ready inner service into its
/// response future (hence `S: Clone`). Responses are the inner service's,
/// untouched; the layer's own `503` carries its text in the inner body
/// type (`ResBody: From<String>`: `String`, axum's `Body`, `Full<Bytes>`).
#[derive(Clone)]
pub struct BulkheadService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for BulkheadService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BulkheadService")
            .field("inner", &self.inner)
            .field("name", &self.shared.name)
            .finish()
    }
}

/// The place of a request in the bulkhead's line, taken in its call.
type Place = bulkhead::Acquire<Arc<Permits>, CriticalSectionRawMutex, BULKHEAD_LINE>;

/// Waits at `place` for a permit of `permits` until `deadline` on
/// `wait`'s clock; `Err` with what was full.
async fn permit_by(
    mut place: Place,
    permits: &Permits,
    wait: &Wait,
    deadline: Instant,
) -> Result<BulkheadPermit, Full> {
    let mut timer = wait.timer.sleep_until(deadline);
    let full = || Full {
        max: permits.max(),
        waiting: permits.waiting(),
    };
    poll_fn(|cx| {
        // The permit first: one granted at the deadline is taken.
        if let Poll::Ready(got) = Pin::new(&mut place).poll(cx) {
            return Poll::Ready(got.map_err(|_| full()));
        }
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(Err(full()))
    })
    .await
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BulkheadService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BulkheadFuture<S::Future, S::Error, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        if let Some(wait) = &self.shared.wait {
            let wait = Arc::clone(wait);
            return self.call_in_line(request, wait);
        }
        match Bulkhead::try_acquire(Arc::clone(&self.shared.permits)) {
            Ok(permit) => self.run(request, permit),
            Err(full) => BulkheadFuture::refused(self.shared.refusal(full, None)),
        }
    }
}

impl<S> BulkheadService<S> {
    /// A call with a wait: the request takes its place in line at its
    /// call, so the order does not depend on when its future is first
    /// polled (a permit granted before then waits for it).
    #[inline(never)]
    fn call_in_line<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
        wait: Arc<Wait>,
    ) -> BulkheadFuture<S::Future, S::Error, ResBody>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqBody: Send + 'static,
        ResBody: From<String> + Send + 'static,
    {
        let permits = &self.shared.permits;
        let mut place = Bulkhead::acquire(Arc::clone(permits));
        match Pin::new(&mut place).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Ok(permit)) => return self.run(request, permit),
            Poll::Ready(Err(_)) => {
                let full = Full {
                    max: permits.max(),
                    waiting: permits.waiting(),
                };
                return BulkheadFuture::refused(self.shared.refusal(full, None));
            }
            Poll::Pending => {}
        }
        let deadline = wait.timer.now() + wait.max;
        // Waits with the ready inner service; a clone stays for the next
        // call, which the caller polls ready first.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        BulkheadFuture {
            state: Call::Waiting {
                future: Box::pin(async move {
                    match permit_by(place, &shared.permits, &wait, deadline).await {
                        Ok(permit) => {
                            let response = inner.call(request).await;
                            drop(permit);
                            response
                        }
                        Err(full) => Ok(shared.refusal(full, Some(wait.max))),
                    }
                }),
            },
        }
    }
}

impl<S> BulkheadService<S> {
    /// Calls the inner service under `permit`.
    fn run<ReqBody, ResBody, E>(
        &mut self,
        request: Request<ReqBody>,
        permit: BulkheadPermit,
    ) -> BulkheadFuture<S::Future, E, ResBody>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        BulkheadFuture {
            state: Call::Running {
                future: self.inner.call(request),
                permit: Some(permit),
            },
        }
    }
}

type Waiting<B, E> = BoxFuture<'static, Result<Response<B>, E>>;

pin_project! {
    /// The future of a [`BulkheadService`] call: the inner response, the
    /// permit held until it completes, or the layer's `503`.
    pub struct BulkheadFuture<F, E, B> {
        #[pin]
        state: Call<F, E, B>,
    }
}

pin_project! {
    #[project = CallProj]
    enum Call<F, E, B> {
        Running { #[pin] future: F, permit: Option<BulkheadPermit> },
        Waiting { future: Waiting<B, E> },
        Refused { response: Option<Response<B>> },
    }
}

impl<F, E, B> BulkheadFuture<F, E, B> {
    fn refused(response: Response<B>) -> Self {
        BulkheadFuture {
            state: Call::Refused {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> Future for BulkheadFuture<F, E, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            CallProj::Running { future, permit } => {
                let result = ready!(future.poll(cx));
                // The call is over: its permit goes back now, not when the
                // future is dropped.
                drop(permit.take());
                Poll::Ready(result)
            }
            CallProj::Waiting { future } => future.as_mut().poll(cx),
            CallProj::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled again after completion.
                None => Poll::Pending,
            },
        }
    }
}

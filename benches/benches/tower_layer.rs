//! guard-tower's layer beside tower-governor's, per request through
//! `tower::Service::call`: the same inner service (an empty `200`, ready at
//! once), the same request (a `ConnectInfo<SocketAddr>` extension, keyed by
//! peer IP), a quota that never binds (a burst of 10^9, one more token per
//! nanosecond) on each crate's default clock (quanta for both). Each
//! future completes on its first poll, so it is polled once, with no
//! runtime. `inner_only` is the floor: the request built and the inner
//! service called without a layer; a layer's overhead is its row minus
//! that one.
//!
//! guard-tower always writes its two fields (`RateLimit-Policy`,
//! `RateLimit`); tower-governor is shown without headers and with
//! `use_headers` (`X-RateLimit-Limit`, `X-RateLimit-Remaining`).
//! `guard_tower_wait` is the same layer with `wait_up_to` (on async-io's
//! clock): nobody ever waits, so it measures what the option costs a
//! request decided at once (a look at the key's count of waiters).
//!
//! `concurrency_limit`: guard-tower's `BulkheadLayer` beside tower's
//! `ConcurrencyLimitLayer`, with room for every request.
//!
//! `cargo bench -p guard-benches --bench tower_layer`

use std::convert::Infallible;
use std::future::{Future, Ready, poll_fn, ready};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use guard_core::limit::{FullPolicy, Rate, TokenBucket};
use guard_std::ratelimit::MemoryLimiter;
use guard_tower::{BulkheadLayer, ClientIp, RateLimitLayer};
use http::{Request, Response, StatusCode};
use tower::limit::ConcurrencyLimitLayer;
use tower::{Layer, Service, service_fn};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

/// A burst no benchmark exhausts.
const BURST: u32 = 1_000_000_000;

/// Distinct client addresses in the many-keys rows.
const KEYS: usize = 10_000;

/// The output of a future that is ready on its first poll.
fn complete<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("an in-memory decision before a ready service completes at once"),
    }
}

/// One request through `service`: ready, called, its status.
fn through<S, B>(service: &mut S, peer: SocketAddr) -> StatusCode
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
{
    let mut request = Request::new(Body::empty());
    request.extensions_mut().insert(ConnectInfo(peer));
    complete(poll_fn(|cx| service.poll_ready(cx))).unwrap_or_else(|e| match e {});
    let response = complete(service.call(request)).unwrap_or_else(|e| match e {});
    let status = response.status();
    black_box(response);
    status
}

type Inner = tower::util::ServiceFn<fn(Request<Body>) -> Ready<Result<Response<Body>, Infallible>>>;

/// The inner service of every row: an empty `200`.
fn inner() -> Inner {
    fn ok(_: Request<Body>) -> Ready<Result<Response<Body>, Infallible>> {
        ready(Ok(Response::new(Body::empty())))
    }
    service_fn(ok as fn(_) -> _)
}

/// `count` client addresses, 10.0.0.1 onwards.
fn peers(count: usize) -> Vec<SocketAddr> {
    (1..=count)
        .map(|i| {
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | i)), 40_000)
        })
        .collect()
}

/// One row: `service` asked for `peers` in turn.
fn row<S, B>(g: &mut BenchmarkGroup<'_, WallTime>, name: &str, mut service: S, peers: &[SocketAddr])
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
{
    // Checked before timing: every row measures admissions.
    for &peer in peers.iter().take(3) {
        assert_eq!(through(&mut service, peer), StatusCode::OK, "{name}");
    }
    let mut next = 0;
    g.bench_function(name, |b| {
        b.iter(|| {
            let peer = peers[next];
            next = (next + 1) % peers.len();
            through(&mut service, black_box(peer))
        })
    });
}

fn guard_tower() -> RateLimitLayer {
    let bucket = TokenBucket::new(BURST, Rate::per(1, Duration::from_nanos(1))).unwrap();
    let limiter = MemoryLimiter::new(bucket, 2 * KEYS, FullPolicy::DenyNewKeys);
    RateLimitLayer::builder(Arc::new(limiter))
        .key(ClientIp::peer())
        .build()
        .unwrap()
}

/// [`guard_tower`] with `wait_up_to`.
fn guard_tower_wait() -> RateLimitLayer {
    let bucket = TokenBucket::new(BURST, Rate::per(1, Duration::from_nanos(1))).unwrap();
    let limiter = MemoryLimiter::new(bucket, 2 * KEYS, FullPolicy::DenyNewKeys);
    RateLimitLayer::builder(Arc::new(limiter))
        .key(ClientIp::peer())
        .wait_up_to(Duration::from_secs(1), guard_smol::AsyncIo)
        .build()
        .unwrap()
}

fn layers(c: &mut Criterion, group: &str, peers: &[SocketAddr]) {
    let mut g = c.benchmark_group(group);
    row(&mut g, "inner_only", inner(), peers);
    row(&mut g, "guard_tower", guard_tower().layer(inner()), peers);
    row(
        &mut g,
        "guard_tower_wait",
        guard_tower_wait().layer(inner()),
        peers,
    );

    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(BURST)
        .finish()
        .unwrap();
    row(
        &mut g,
        "tower_governor",
        GovernorLayer::new(config).layer(inner()),
        peers,
    );

    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(BURST)
        .use_headers()
        .finish()
        .unwrap();
    row(
        &mut g,
        "tower_governor_headers",
        GovernorLayer::new(config).layer(inner()),
        peers,
    );
    g.finish();
}

/// guard-tower's bulkhead beside tower's `ConcurrencyLimitLayer`, both
/// with room for every request (nothing waits): what taking and giving
/// back one permit costs a request.
fn concurrency_limit(c: &mut Criterion) {
    let peers = peers(1);
    let mut g = c.benchmark_group("concurrency_limit");
    row(&mut g, "inner_only", inner(), &peers);
    let bulkhead = BulkheadLayer::builder("bench", 1_000_000).build().unwrap();
    row(&mut g, "guard_bulkhead", bulkhead.layer(inner()), &peers);
    row(
        &mut g,
        "tower_concurrency_limit",
        ConcurrencyLimitLayer::new(1_000_000).layer(inner()),
        &peers,
    );
    g.finish();
}

fn one_key(c: &mut Criterion) {
    layers(c, "tower_layer_one_key", &peers(1));
}

fn many_keys(c: &mut Criterion) {
    layers(c, "tower_layer_many_keys", &peers(KEYS));
}

criterion_group!(benches, one_key, many_keys, concurrency_limit);
criterion_main!(benches);

//! The layer through `tower::ServiceExt::oneshot`, on limiters whose clock
//! the tests move by hand: admitted counts, refusals and every field value
//! are exact.

mod common;

use common::Answer;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use guard_core::limit::{
    Bandwidths, FixedWindow, FullPolicy, LeakyBucket, Rate, SlidingWindow, TokenBucket,
};
use guard_std::BackendError;
use guard_std::ManualClock;
use guard_std::ratelimit::{
    InvalidKey, LimitError, LimitFuture, MAX_KEY_LEN, MemoryLimiter, Quota, RateLimiter,
    ReconfigureError,
};
use guard_tower::{
    ClientIp, ConfigError, HeaderKey, MissingKey, OnBackendError, PathKey, RateLimitLayer,
    RateLimitLayerBuilder, key_fn,
};
use http::{Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};

/// A token bucket on a hand-moved clock, in memory.
fn bucket(capacity: u32, rate: Rate) -> (Arc<dyn RateLimiter>, ManualClock) {
    let clock = ManualClock::default();
    let bucket = TokenBucket::new(capacity, rate).unwrap();
    let limiter =
        MemoryLimiter::<_, _, 64>::with_clock(bucket, 64, FullPolicy::DenyNewKeys, clock.clone());
    (Arc::new(limiter), clock)
}

/// The inner service: `200 hello`, counting its calls.
#[derive(Clone, Default)]
struct Hello {
    calls: Arc<AtomicUsize>,
}

impl Hello {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<Request<String>> for Hello {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::new("hello".to_owned())))
    }
}

async fn send(layer: &RateLimitLayer, inner: &Hello, request: Request<String>) -> Answer {
    let response = layer.layer(inner.clone()).oneshot(request).await.unwrap();
    Answer::read(response).await
}

/// A request from `ip` (as axum's connect info records it).
fn from(ip: &str) -> Request<String> {
    let mut request = Request::new(String::new());
    let addr = SocketAddr::new(ip.parse().unwrap(), 40000);
    request.extensions_mut().insert(ConnectInfo(addr));
    request
}

fn with_header(name: &str, value: &str) -> Request<String> {
    Request::builder()
        .header(name, value)
        .body(String::new())
        .unwrap()
}

#[tokio::test]
async fn admits_the_burst_then_answers_429_with_exact_fields() {
    let (limiter, clock) = bucket(5, Rate::per_second(1));
    let layer = RateLimitLayer::builder(limiter).build().unwrap();
    let inner = Hello::default();

    for i in 0..5u32 {
        let a = send(&layer, &inner, from("192.0.2.1")).await;
        assert_eq!(a.status, StatusCode::OK, "request {i}");
        assert_eq!(a.text, "hello");
        assert_eq!(a.header("ratelimit-policy"), Some(r#""default";q=5;w=5"#));
        // r tokens left; full again after the spent ones refill, 1 s each.
        let expected = format!(r#""default";r={};t={}"#, 4 - i, i + 1);
        assert_eq!(a.header("ratelimit"), Some(expected.as_str()));
        assert_eq!(a.header("retry-after"), None);
    }
    let refused = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.header("ratelimit"), Some(r#""default";r=0;t=1"#));
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(r#""default";q=5;w=5"#)
    );
    assert_eq!(
        refused.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert!(refused.text.contains("retry after 1 s"), "{}", refused.text);
    assert_eq!(
        inner.calls(),
        5,
        "a refused request never reaches the inner service"
    );

    // One token back after a second: one more, then refused again.
    clock.advance(Duration::from_secs(1));
    let again = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.header("ratelimit"), Some(r#""default";r=0;t=5"#));
    let refused = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(inner.calls(), 6);
}

#[tokio::test]
async fn retry_after_rounds_up_and_is_never_zero() {
    // One token per 1.5 s.
    let (limiter, clock) = bucket(1, Rate::per(1, Duration::from_millis(1_500)));
    let layer = RateLimitLayer::builder(limiter).build().unwrap();
    let inner = Hello::default();
    assert_eq!(
        send(&layer, &inner, from("192.0.2.1")).await.status,
        StatusCode::OK
    );

    let refused = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(refused.header("retry-after"), Some("2"), "1.5 s rounds up");
    assert_eq!(refused.header("ratelimit"), Some(r#""default";r=0;t=2"#));
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(r#""default";q=1;w=2"#)
    );

    clock.advance(Duration::from_millis(1_499));
    let refused = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.header("retry-after"),
        Some("1"),
        "1 ms rounds up to 1 s"
    );

    clock.advance(Duration::from_millis(1));
    assert_eq!(
        send(&layer, &inner, from("192.0.2.1")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn the_policy_field_follows_the_limiter_quota() {
    let inner = Hello::default();
    let clock = ManualClock::default();

    let window = SlidingWindow::<8>::new(Duration::from_secs(10), 3).unwrap();
    let window =
        MemoryLimiter::<_, _, 64>::with_clock(window, 64, FullPolicy::DenyNewKeys, clock.clone());
    let layer = RateLimitLayer::builder(Arc::new(window)).build().unwrap();
    let a = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(a.header("ratelimit-policy"), Some(r#""default";q=3;w=10"#));
    // The window empties 10 s after its only admission.
    assert_eq!(a.header("ratelimit"), Some(r#""default";r=2;t=10"#));

    // Four units drained at two a second: empty again in 2 s.
    let leaky = LeakyBucket::new(4, Rate::per_second(2)).unwrap();
    let leaky =
        MemoryLimiter::<_, _, 64>::with_clock(leaky, 64, FullPolicy::DenyNewKeys, clock.clone());
    let layer = RateLimitLayer::builder(Arc::new(leaky)).build().unwrap();
    let a = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(a.header("ratelimit-policy"), Some(r#""default";q=4;w=2"#));

    // A quota replaced while serving shows on the next response.
    let (limiter, _clock) = bucket(5, Rate::per_second(1));
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .build()
        .unwrap();
    for _ in 0..2 {
        let a = send(&layer, &inner, from("192.0.2.1")).await;
        assert_eq!(a.header("ratelimit-policy"), Some(r#""default";q=5;w=5"#));
    }
    limiter
        .reconfigure(Quota::TokenBucket {
            capacity: 20,
            rate: Rate::per_second(2),
        })
        .unwrap();
    let a = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(a.header("ratelimit-policy"), Some(r#""default";q=20;w=10"#));
}

#[tokio::test]
async fn a_named_policy_is_an_escaped_sf_string_and_inner_fields_stay() {
    let (limiter, _clock) = bucket(2, Rate::per_second(1));
    let layer = RateLimitLayer::builder(limiter)
        .policy_name(r#"api "v1""#)
        .build()
        .unwrap();
    let inner = tower::service_fn(|_: Request<String>| async {
        let mut response = Response::new(String::new());
        response
            .headers_mut()
            .insert("ratelimit", r#""inner";r=7;t=1"#.parse().unwrap());
        Ok::<_, Infallible>(response)
    });
    let response = layer.layer(inner).oneshot(from("192.0.2.1")).await.unwrap();
    let fields: Vec<_> = response.headers().get_all("ratelimit").iter().collect();
    assert_eq!(fields, [r#""inner";r=7;t=1"#, r#""api \"v1\"";r=1;t=1"#]);
    assert_eq!(
        response.headers()["ratelimit-policy"],
        r#""api \"v1\"";q=2;w=2"#
    );
}

#[tokio::test]
async fn each_client_ip_has_its_own_quota() {
    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let layer = RateLimitLayer::builder(limiter)
        .key(ClientIp::peer())
        .build()
        .unwrap();
    let inner = Hello::default();
    assert_eq!(
        send(&layer, &inner, from("192.0.2.1")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, &inner, from("192.0.2.1")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&layer, &inner, from("192.0.2.2")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, &inner, from("2001:db8::1")).await.status,
        StatusCode::OK
    );

    // Behind one trusted proxy, the address it appended is the key.
    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let layer = RateLimitLayer::builder(limiter)
        .key(ClientIp::x_forwarded_for(1).unwrap())
        .build()
        .unwrap();
    let via_proxy = |client: &str| {
        let mut request = from("10.0.0.1");
        request
            .headers_mut()
            .insert("x-forwarded-for", client.parse().unwrap());
        request
    };
    assert_eq!(
        send(&layer, &inner, via_proxy("203.0.113.1")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, &inner, via_proxy("203.0.113.2")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, &inner, via_proxy("6.6.6.6, 203.0.113.1"))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS,
        "a client cannot pick its key by prepending an entry"
    );
}

#[tokio::test]
async fn a_request_without_connect_info_is_refused_naming_it() {
    let (limiter, _clock) = bucket(5, Rate::per_second(1));
    // `new`: every default, the client IP among them.
    let layer = RateLimitLayer::new(limiter);
    let inner = Hello::default();
    let a = send(&layer, &inner, Request::new(String::new())).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(a.text.contains("ConnectInfo<SocketAddr>"), "{}", a.text);
    assert_eq!(a.header("ratelimit"), None);
    assert_eq!(inner.calls(), 0);
}

#[tokio::test]
async fn header_keys_are_separate_and_a_missing_header_is_refused_or_shared() {
    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .key(HeaderKey::new("x-api-key").unwrap())
        .build()
        .unwrap();
    let inner = Hello::default();
    assert_eq!(
        send(&layer, &inner, with_header("x-api-key", "k1"))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, &inner, with_header("x-api-key", "k1"))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&layer, &inner, with_header("x-api-key", "k2"))
            .await
            .status,
        StatusCode::OK
    );

    let missing = send(&layer, &inner, Request::new(String::new())).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.text,
        "400 Bad Request: the rate limit needs the x-api-key header, which this request does \
         not have\n"
    );

    // Keyless requests together under one key.
    let layer = RateLimitLayer::builder(limiter)
        .key(HeaderKey::new("x-api-key").unwrap())
        .on_missing_key(MissingKey::Shared("anonymous".into()))
        .build()
        .unwrap();
    assert_eq!(
        send(&layer, &inner, Request::new(String::new()))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, &inner, Request::new(String::new()))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&layer, &inner, with_header("x-api-key", "anonymous"))
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS,
        "the shared key is a key like any other"
    );
}

#[tokio::test]
async fn path_keys_and_closure_keys() {
    let path = |p: &str| Request::builder().uri(p).body(String::new()).unwrap();
    let inner = Hello::default();

    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let layer = RateLimitLayer::builder(limiter)
        .key(PathKey)
        .build()
        .unwrap();
    assert_eq!(
        send(&layer, &inner, path("/a?x=1")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, &inner, path("/a?x=2")).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the query is not part of the key"
    );
    assert_eq!(
        send(&layer, &inner, path("/b")).await.status,
        StatusCode::OK
    );

    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let tenant = key_fn("a tenant in the path", |request| {
        let segment = request
            .uri
            .path()
            .trim_start_matches('/')
            .split('/')
            .next()?;
        (!segment.is_empty()).then(|| segment.to_owned())
    });
    let layer = RateLimitLayer::builder(limiter)
        .key(tenant)
        .build()
        .unwrap();
    assert_eq!(
        send(&layer, &inner, path("/acme/orders")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        send(&layer, &inner, path("/acme/users")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&layer, &inner, path("/initech/users")).await.status,
        StatusCode::OK
    );
    let none = send(&layer, &inner, path("/")).await;
    assert_eq!(none.status, StatusCode::BAD_REQUEST);
    assert!(none.text.contains("a tenant in the path"), "{}", none.text);
}

#[tokio::test]
async fn costs_are_counted_and_a_cost_above_the_quota_is_413() {
    let (limiter, _clock) = bucket(5, Rate::per_second(1));
    let layer = RateLimitLayer::builder(limiter)
        .cost(|request| {
            request
                .headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .legacy_headers(true)
        .build()
        .unwrap();
    let inner = Hello::default();
    let costing = |cost: &str| {
        let mut request = from("192.0.2.1");
        request
            .headers_mut()
            .insert("x-cost", cost.parse().unwrap());
        request
    };

    let a = send(&layer, &inner, costing("3")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("ratelimit"), Some(r#""default";r=2;t=3"#));
    let free = send(&layer, &inner, costing("0")).await;
    assert_eq!(free.status, StatusCode::OK);
    assert_eq!(
        free.header("ratelimit"),
        Some(r#""default";r=2;t=3"#),
        "cost 0 counts nothing"
    );

    // Three more than the two left: refused whole, one token short.
    let refused = send(&layer, &inner, costing("3")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.header("ratelimit"), Some(r#""default";r=2;t=1"#));

    let too_big = send(&layer, &inner, costing("6")).await;
    assert_eq!(too_big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        too_big.text,
        "413 Content Too Large: this request costs 6 units, more than the whole quota of 5 of \
         policy \"default\": it can never be admitted\n"
    );
    assert_eq!(too_big.header("retry-after"), None, "no wait admits it");
    assert_eq!(
        too_big.header("ratelimit-policy"),
        Some(r#""default";q=5;w=5"#)
    );
    assert_eq!(too_big.header("x-ratelimit-limit"), Some("5"));
    assert_eq!(too_big.header("ratelimit"), None);
    assert_eq!(inner.calls(), 2);

    // What was left is untouched by the refusals.
    assert_eq!(
        send(&layer, &inner, costing("2")).await.header("ratelimit"),
        Some(r#""default";r=0;t=5"#)
    );
}

/// A quota of bytes an hour: the cost is the declared length, the quota
/// comes back whole at the next boundary, and the fields say when.
#[tokio::test]
async fn a_fixed_window_meters_bytes_and_resets_at_its_boundary() {
    let clock = ManualClock::default();
    let hour = FixedWindow::new(Duration::from_secs(3_600), 1_000).unwrap();
    let limiter =
        MemoryLimiter::<_, _, 64>::with_clock(hour, 64, FullPolicy::DenyNewKeys, clock.clone());
    let layer = RateLimitLayer::builder(Arc::new(limiter))
        .cost(|request| {
            request
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(u32::MAX)
        })
        .build()
        .unwrap();
    let inner = Hello::default();
    let sized = |bytes: usize| {
        let mut request = from("192.0.2.1");
        request
            .headers_mut()
            .insert(http::header::CONTENT_LENGTH, bytes.into());
        *request.body_mut() = "x".repeat(bytes);
        request
    };
    // 40 minutes into the first hour.
    clock.advance(Duration::from_secs(2_400));
    let a = send(&layer, &inner, sized(600)).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.header("ratelimit-policy"),
        Some(r#""default";q=1000;w=3600"#)
    );
    assert_eq!(a.header("ratelimit"), Some(r#""default";r=400;t=1200"#));
    let refused = send(&layer, &inner, sized(500)).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("1200"));
    // At the boundary the whole quota is back at once.
    clock.advance(Duration::from_secs(1_200));
    let a = send(&layer, &inner, sized(1_000)).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("ratelimit"), Some(r#""default";r=0;t=3600"#));
    assert_eq!(inner.calls(), 2);
}

#[tokio::test]
async fn legacy_fields_are_written_only_when_asked() {
    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let inner = Hello::default();
    let off = RateLimitLayer::builder(Arc::clone(&limiter))
        .build()
        .unwrap();
    let a = send(&off, &inner, from("192.0.2.1")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        a.headers
            .keys()
            .all(|k| !k.as_str().starts_with("x-ratelimit"))
    );

    let on = RateLimitLayer::builder(limiter)
        .legacy_headers(true)
        .build()
        .unwrap();
    let a = send(&on, &inner, from("192.0.2.2")).await;
    assert_eq!(a.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(a.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(a.header("x-ratelimit-reset"), Some("1"));
    let refused = send(&on, &inner, from("192.0.2.2")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(refused.header("x-ratelimit-reset"), Some("1"));
}

/// A limiter whose backend is down: every decision is a backend error.
struct Down;

impl RateLimiter for Down {
    fn check_n<'a>(&'a self, _: &'a str, _: u32) -> LimitFuture<'a> {
        let error = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "redis down");
        LimitFuture::Ready(Some(Err(LimitError::Backend(BackendError::new(error)))))
    }

    fn quota(&self) -> Quota {
        Quota::TokenBucket {
            capacity: 5,
            rate: Rate::per_second(1),
        }
    }

    fn reconfigure(&self, _: Quota) -> Result<(), ReconfigureError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_failed_backend_fails_closed_by_default() {
    let inner = Hello::default();
    let layer = RateLimitLayer::builder(Arc::new(Down)).build().unwrap();
    let a = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.header("retry-after"), Some("1"));
    assert_eq!(a.header("ratelimit"), None);
    assert!(a.text.contains("retry after 1 s"), "{}", a.text);
    assert!(
        !a.text.contains("redis down"),
        "the backend's error stays in the log"
    );
    assert_eq!(inner.calls(), 0);

    let layer = RateLimitLayer::builder(Arc::new(Down))
        .on_backend_error(OnBackendError::FailClosed {
            retry_after: Duration::from_millis(2_500),
        })
        .build()
        .unwrap();
    let a = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.header("retry-after"), Some("3"));
}

#[tokio::test]
async fn a_failed_backend_fails_open_when_asked() {
    let inner = Hello::default();
    let layer = RateLimitLayer::builder(Arc::new(Down))
        .on_backend_error(OnBackendError::FailOpen)
        .build()
        .unwrap();
    for _ in 0..10 {
        let a = send(&layer, &inner, from("192.0.2.1")).await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.text, "hello");
        assert_eq!(a.header("ratelimit"), None, "no decision, no fields");
        assert_eq!(a.header("ratelimit-policy"), None);
    }
    assert_eq!(inner.calls(), 10);
}

/// A limiter whose own rule refuses the key `bad` (as guard-redis's
/// refuses an empty or over-long one); other keys find it down.
struct RefusesBad;

impl RateLimiter for RefusesBad {
    fn check_n<'a>(&'a self, key: &'a str, cost: u32) -> LimitFuture<'a> {
        if key == "bad" {
            return LimitFuture::Ready(Some(Err(LimitError::InvalidKey(InvalidKey::Empty))));
        }
        Down.check_n(key, cost)
    }

    fn quota(&self) -> Quota {
        Down.quota()
    }

    fn reconfigure(&self, _: Quota) -> Result<(), ReconfigureError> {
        Ok(())
    }
}

/// A key is the client's input: one no limiter takes is answered 400,
/// never passed unlimited by the fail-open policy meant for a backend that
/// failed.
#[tokio::test]
async fn a_key_no_limiter_takes_is_400_even_when_failing_open() {
    let inner = Hello::default();
    let down = RateLimitLayer::builder(Arc::new(RefusesBad))
        .key(HeaderKey::new("x-api-key").unwrap())
        .on_backend_error(OnBackendError::FailOpen)
        .build()
        .unwrap();
    let long = "k".repeat(MAX_KEY_LEN + 1);
    for key in [long.as_str(), "bad"] {
        let a = send(&down, &inner, with_header("x-api-key", key)).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{key:.16}");
        assert!(a.text.contains("cannot be a key"), "{}", a.text);
        assert!(
            !a.text.contains("kkkk"),
            "the key is not echoed: {}",
            a.text
        );
    }
    assert_eq!(inner.calls(), 0);
    // An honest key beside them: the backend is down, fail-open admits.
    let a = send(&down, &inner, with_header("x-api-key", "k1")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(inner.calls(), 1);
}

/// A limiter that waits for its "backend" (one `Pending` before each
/// decision), like a Redis one: the decision is made in the response
/// future. Counts the decisions it was polled to make.
struct Remote {
    inner: Arc<dyn RateLimiter>,
    decided: AtomicUsize,
}

/// `Pending` once (waking at once), then ready.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

impl RateLimiter for Remote {
    fn check_n<'a>(&'a self, key: &'a str, cost: u32) -> LimitFuture<'a> {
        LimitFuture::Pending(Box::pin(async move {
            YieldOnce(false).await;
            self.decided.fetch_add(1, Ordering::SeqCst);
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

#[tokio::test]
async fn a_limiter_that_waits_decides_in_the_response_future() {
    let (memory, _clock) = bucket(2, Rate::per_second(1));
    let remote = Arc::new(Remote {
        inner: memory,
        decided: AtomicUsize::new(0),
    });
    let layer = RateLimitLayer::builder(Arc::clone(&remote) as Arc<dyn RateLimiter>)
        .build()
        .unwrap();
    let inner = Hello::default();
    let a = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.header("ratelimit"), Some(r#""default";r=1;t=1"#));
    let a = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(a.header("ratelimit"), Some(r#""default";r=0;t=2"#));
    let refused = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(inner.calls(), 2);
    assert_eq!(
        remote.decided.load(Ordering::SeqCst),
        3,
        "one decision per request: the future dropped in `call` did nothing"
    );

    // And it is spawnable: the response future is `Send`.
    let service = layer.layer(inner.clone());
    let spawned = tokio::spawn(service.oneshot(from("192.0.2.9")));
    assert_eq!(spawned.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// A service that is not ready until told.
#[derive(Clone)]
struct Gate {
    open: Arc<std::sync::atomic::AtomicBool>,
}

impl Service<Request<String>> for Gate {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.open.load(Ordering::SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        std::future::ready(Ok(Response::new(String::new())))
    }
}

#[test]
fn readiness_is_the_inner_services() {
    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let layer = RateLimitLayer::builder(limiter).build().unwrap();
    let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut service = layer.layer(Gate { open: open.clone() });
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(service.poll_ready(&mut cx).is_pending());
    open.store(true, Ordering::SeqCst);
    assert!(matches!(service.poll_ready(&mut cx), Poll::Ready(Ok(()))));
}

#[test]
fn bad_parameters_are_errors_naming_them() {
    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let builder = || RateLimitLayer::builder(Arc::clone(&limiter));

    let err = builder().policy_name("d\u{e9}faut").build().unwrap_err();
    assert!(matches!(&err, ConfigError::PolicyName { value, .. } if value == "d\u{e9}faut"));
    let message = err.to_string();
    assert!(
        message.starts_with("policy name: \"d\u{e9}faut\""),
        "{message}"
    );
    assert!(message.contains("printable ASCII"), "{message}");
    assert!(matches!(
        builder().policy_name("").build(),
        Err(ConfigError::PolicyName { .. })
    ));

    let err = builder()
        .on_backend_error(OnBackendError::FailClosed {
            retry_after: Duration::ZERO,
        })
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        ConfigError::BackendRetryAfter {
            value: Duration::ZERO
        }
    );
    assert!(
        err.to_string().starts_with("backend retry-after: 0ns"),
        "{err}"
    );

    let err = HeaderKey::new("x-api key").unwrap_err();
    assert_eq!(err.to_string().split(':').next(), Some("key header"));
    assert!(err.to_string().contains("\"x-api key\""), "{err}");

    // Every option at once still builds.
    let _: RateLimitLayerBuilder = builder()
        .key(PathKey)
        .cost(|_| 2)
        .policy_name("p")
        .on_missing_key(MissingKey::Refuse)
        .on_backend_error(OnBackendError::FailOpen)
        .legacy_headers(true);
}

/// The statuses of `requests`, sent in turn.
async fn statuses(
    layer: &RateLimitLayer,
    inner: &Hello,
    requests: impl IntoIterator<Item = Request<String>>,
) -> Vec<StatusCode> {
    let mut out = Vec::new();
    for request in requests {
        out.push(send(layer, inner, request).await.status);
    }
    out
}

const OK: StatusCode = StatusCode::OK;
const TOO_MANY: StatusCode = StatusCode::TOO_MANY_REQUESTS;

/// Addresses in one IPv6 /64 are one client: a host given a /64 cannot
/// take a fresh quota with every address of it.
#[tokio::test]
async fn ipv6_clients_are_keyed_by_their_slash_64_unless_told_otherwise() {
    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .build()
        .unwrap();
    let inner = Hello::default();
    let sent = [
        "2001:db8:1:2::1",
        "2001:db8:1:2:ffff:ffff:ffff:fffe",
        "2001:db8:1:3::1",
        // An IPv4-mapped address is its IPv4 client.
        "192.0.2.9",
        "::ffff:192.0.2.9",
    ];
    assert_eq!(
        statuses(&layer, &inner, sent.map(from)).await,
        [OK, TOO_MANY, OK, OK, TOO_MANY]
    );
    let keys: Vec<String> = ["2001:db8:1:2::1"]
        .iter()
        .map(|ip| {
            let (parts, _) = from(ip).into_parts();
            guard_tower::KeyExtractor::extract(&ClientIp::peer(), &parts)
                .unwrap()
                .into_owned()
        })
        .collect();
    assert_eq!(keys, ["2001:db8:1:2::/64"]);

    // Each address alone, with 128 bits.
    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let layer = RateLimitLayer::builder(limiter)
        .key(ClientIp::peer().with_ipv6_prefix(128).unwrap())
        .build()
        .unwrap();
    for ip in ["2001:db8:1:2::1", "2001:db8:1:2::2"] {
        assert_eq!(send(&layer, &inner, from(ip)).await.status, StatusCode::OK);
    }
    let (parts, _) = from("2001:db8:1:2::1").into_parts();
    let key = ClientIp::peer().with_ipv6_prefix(48).unwrap();
    assert_eq!(
        guard_tower::KeyExtractor::extract(&key, &parts)
            .unwrap()
            .as_str(),
        "2001:db8:1::/48"
    );
    for bits in [0, 129] {
        assert_eq!(
            ClientIp::peer().with_ipv6_prefix(bits),
            Err(ConfigError::Ipv6Prefix { value: bits })
        );
    }
}

#[tokio::test]
async fn an_allowlisted_key_or_network_bypasses_the_limiter_and_costs_nothing() {
    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let allow = guard_tower::AllowList::new()
        .network("10.0.0.0/8")
        .unwrap()
        .network("2001:db8:42::/48")
        .unwrap()
        .network("192.0.2.7")
        .unwrap();
    let layer = RateLimitLayer::builder(Arc::clone(&limiter))
        .allow(allow)
        .build()
        .unwrap();
    let inner = Hello::default();
    for ip in [
        "10.1.2.3",
        "10.1.2.3",
        "2001:db8:42:1::5",
        "192.0.2.7",
        "192.0.2.7",
    ] {
        let a = send(&layer, &inner, from(ip)).await;
        assert_eq!(a.status, StatusCode::OK, "{ip}");
        assert_eq!(a.header("ratelimit"), None, "{ip}: not decided");
        assert_eq!(a.header("ratelimit-policy"), None, "{ip}");
    }
    assert_eq!(layer.allowed(), 5);
    // Nothing was counted against them: the same limiter without the list
    // admits each once.
    let plain = RateLimitLayer::builder(Arc::clone(&limiter))
        .build()
        .unwrap();
    assert_eq!(statuses(&plain, &inner, [from("10.1.2.3")]).await, [OK]);
    // Others are limited as before.
    let others = ["192.0.2.8", "192.0.2.8"].map(from);
    assert_eq!(statuses(&layer, &inner, others).await, [OK, TOO_MANY]);

    // By key, whatever the extractor.
    let (limiter, _clock) = bucket(1, Rate::per_second(1));
    let layer = RateLimitLayer::builder(limiter)
        .key(HeaderKey::new("x-api-key").unwrap())
        .allow(guard_tower::AllowList::new().key("internal"))
        .build()
        .unwrap();
    for _ in 0..3 {
        let a = send(&layer, &inner, with_header("x-api-key", "internal")).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    let limited = [(); 2].map(|()| with_header("x-api-key", "k1"));
    assert_eq!(statuses(&layer, &inner, limited).await, [OK, TOO_MANY]);

    for bad in ["10.0.0.1/8", "10.0.0.0/33", "ten", "", "2001:db8::1/32"] {
        let refused = guard_tower::AllowList::new().network(bad).unwrap_err();
        assert!(
            matches!(&refused, ConfigError::AllowedNetwork { value, .. } if value == bad),
            "{bad}: {refused:?}"
        );
        assert!(refused.to_string().contains(bad), "{refused}");
    }
}

/// A dry run decides and counts as enforcing would, writes the fields,
/// and lets every request through, counting those it would refuse.
#[tokio::test]
async fn a_dry_run_lets_every_request_through_with_the_fields_and_counts_the_refusals() {
    let (limiter, _clock) = bucket(2, Rate::per_second(1));
    let layer = RateLimitLayer::builder(limiter)
        .cost(|request| if request.uri.path() == "/big" { 3 } else { 1 })
        .dry_run(true)
        .build()
        .unwrap();
    let inner = Hello::default();
    for i in 0..2 {
        let a = send(&layer, &inner, from("192.0.2.1")).await;
        assert_eq!(a.status, StatusCode::OK, "{i}");
    }
    let over = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(over.status, StatusCode::OK);
    assert_eq!(over.text, "hello");
    assert_eq!(over.header("ratelimit"), Some(r#""default";r=0;t=1"#));
    assert_eq!(
        over.header("ratelimit-policy"),
        Some(r#""default";q=2;w=2"#)
    );
    assert_eq!(over.header("retry-after"), None);
    assert_eq!(layer.dry_run_refusals(), 1);

    let mut big = from("192.0.2.2");
    *big.uri_mut() = "/big".parse().unwrap();
    assert_eq!(send(&layer, &inner, big).await.status, StatusCode::OK);
    // No key at all.
    assert_eq!(
        send(&layer, &inner, Request::new(String::new()))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(layer.dry_run_refusals(), 3);
    assert_eq!(inner.calls(), 5, "every request reached the inner service");

    // A failed backend, fail-closed.
    let down = RateLimitLayer::builder(Arc::new(Down))
        .dry_run(true)
        .build()
        .unwrap();
    assert_eq!(
        send(&down, &inner, from("192.0.2.1")).await.status,
        StatusCode::OK
    );
    assert_eq!(down.dry_run_refusals(), 1);

    let (limiter, _clock) = bucket(2, Rate::per_second(1));
    let both = RateLimitLayer::builder(limiter)
        .dry_run(true)
        .wait_up_to(Duration::from_secs(1), guard_tokio::Tokio::new())
        .build();
    assert_eq!(both.unwrap_err(), ConfigError::DryRunWithWait);
}

/// 4 a second and 6 a minute, in memory on a hand-moved clock.
fn second_and_minute() -> (Arc<dyn RateLimiter>, ManualClock) {
    let clock = ManualClock::default();
    let policy = Bandwidths::new([
        TokenBucket::new(4, Rate::per_second(4)).unwrap(),
        TokenBucket::new(6, Rate::per(6, Duration::from_secs(60))).unwrap(),
    ]);
    let limiter =
        MemoryLimiter::<_, _, 64>::with_clock(policy, 64, FullPolicy::DenyNewKeys, clock.clone());
    (Arc::new(limiter), clock)
}

#[tokio::test]
async fn several_bandwidths_write_an_entry_each_and_admit_all_or_nothing() {
    let (limiter, clock) = second_and_minute();
    let layer = RateLimitLayer::builder(limiter)
        .bandwidth_names(["second", "minute"])
        .legacy_headers(true)
        .build()
        .unwrap();
    let inner = Hello::default();
    let policy = r#""second";q=4;w=1, "minute";q=6;w=60"#;
    for i in 0..4u32 {
        let a = send(&layer, &inner, from("192.0.2.1")).await;
        assert_eq!(a.status, StatusCode::OK, "request {i}");
        assert_eq!(a.header("ratelimit-policy"), Some(policy));
        // A token back every 250 ms in the first, every 10 s in the second.
        let expected = format!(
            r#""second";r={};t=1, "minute";r={};t={}"#,
            3 - i,
            5 - i,
            10 * (i + 1)
        );
        assert_eq!(a.header("ratelimit"), Some(expected.as_str()));
    }
    // The second's bandwidth refuses; the minute's is not charged.
    let refused = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(
        refused.header("ratelimit"),
        Some(r#""second";r=0;t=1, "minute";r=2;t=40"#)
    );
    // The tightest bandwidth's in the legacy fields.
    assert_eq!(refused.header("x-ratelimit-limit"), Some("4"));
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));

    clock.advance(Duration::from_secs(1));
    for _ in 0..2 {
        let a = send(&layer, &inner, from("192.0.2.1")).await;
        assert_eq!(a.status, StatusCode::OK);
    }
    // Now the minute's refuses (its next token 9 s away); the second's
    // keeps its own reset.
    let refused = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("9"));
    assert_eq!(
        refused.header("ratelimit"),
        Some(r#""second";r=2;t=1, "minute";r=0;t=9"#)
    );
    assert_eq!(refused.header("ratelimit-policy"), Some(policy));
    assert_eq!(inner.calls(), 6);

    // A cost above a bandwidth's quota is 413, with every policy entry.
    let layer = RateLimitLayer::builder(second_and_minute().0)
        .cost(|_| 5)
        .build()
        .unwrap();
    let too_much = send(&layer, &inner, from("192.0.2.1")).await;
    assert_eq!(too_much.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        too_much.header("ratelimit-policy"),
        Some(r#""default-0";q=4;w=1, "default-1";q=6;w=60"#),
        "named after the policy by default"
    );
}

#[test]
fn bandwidth_names_must_match_the_bandwidths() {
    let (several, _clock) = second_and_minute();
    let err = RateLimitLayer::builder(Arc::clone(&several))
        .bandwidth_names(["second"])
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        ConfigError::BandwidthNames {
            given: 1,
            bandwidths: 2
        }
    );
    assert!(
        err.to_string().starts_with("bandwidth names: 1 given"),
        "{err}"
    );
    let (one, _clock) = bucket(1, Rate::per_second(1));
    assert_eq!(
        RateLimitLayer::builder(one)
            .bandwidth_names(["a", "b"])
            .build()
            .unwrap_err(),
        ConfigError::BandwidthNames {
            given: 2,
            bandwidths: 1
        }
    );
    assert!(matches!(
        RateLimitLayer::builder(Arc::clone(&several))
            .bandwidth_names(["s\u{e9}c", "m"])
            .build(),
        Err(ConfigError::PolicyName { .. })
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _entered = rt.enter();
    assert_eq!(
        RateLimitLayer::builder(several)
            .wait_up_to(Duration::from_secs(1), guard_tokio::Tokio::new())
            .build()
            .unwrap_err(),
        ConfigError::WaitWithBandwidths
    );
}

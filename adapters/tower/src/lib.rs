//! guard-tower: a tower [`Layer`](tower_layer::Layer) that rate-limits HTTP
//! requests with any guard [`RateLimiter`](guard_std::ratelimit::RateLimiter)
//! (guard-std's in-memory `MemoryLimiter`, guard-redis's limiters), for
//! axum, hyper, tonic or anything else built on tower and `http`.
//!
//! Each request is keyed ([`ClientIp`] by default, or [`HeaderKey`],
//! [`PathKey`], a closure with [`key_fn`]), costs 1 or what
//! [`cost`](RateLimitLayerBuilder::cost) says, and is decided before the
//! inner service sees it:
//!
//! | decision | answer |
//! | --- | --- |
//! | admitted | the inner response, with `RateLimit-Policy` and `RateLimit` added |
//! | refused | `429 Too Many Requests`, `Retry-After` (whole seconds, rounded up, at least 1) and both fields |
//! | cost above the whole quota | `413 Content Too Large` with `RateLimit-Policy`: no wait would admit it, so it is not a `429` a client would retry |
//! | no key | `400 Bad Request` naming what is missing ([`MissingKey::Refuse`], the default), or one shared key ([`MissingKey::Shared`]) |
//! | refused, with [`wait_up_to`](RateLimitLayerBuilder::wait_up_to) | held in its key's line until admitted (then as admitted), or `429` once no admission can come within the wait (see [below](#waiting-instead-of-refusing)) |
//! | backend failure | `503 Service Unavailable` with `Retry-After: 1` ([`OnBackendError::FailClosed`], the default), or the inner service unlimited ([`OnBackendError::FailOpen`]); logged either way |
//!
//! ```
//! use std::sync::Arc;
//!
//! use guard_core::limit::{FullPolicy, Rate, TokenBucket};
//! use guard_std::ratelimit::MemoryLimiter;
//! use guard_tower::{HeaderKey, RateLimitLayer};
//! use http::{Request, Response, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! // Each API key: bursts of 5, refilled at 1 a second; 10,000 keys at most.
//! let bucket = TokenBucket::new(5, Rate::per_second(1))?;
//! let limiter = MemoryLimiter::new(bucket, 10_000, FullPolicy::DenyNewKeys);
//! let layer = RateLimitLayer::builder(Arc::new(limiter))
//!     .key(HeaderKey::new("x-api-key")?)
//!     .build()?;
//! let service = ServiceBuilder::new().layer(layer).service(service_fn(|_| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(String::from("hello")))
//! }));
//!
//! # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
//! let request = || Request::builder().header("x-api-key", "k1").body(String::new());
//! for _ in 0..5 {
//!     let admitted = service.clone().oneshot(request()?).await?;
//!     assert_eq!(admitted.status(), StatusCode::OK);
//!     assert_eq!(admitted.headers()["ratelimit-policy"], r#""default";q=5;w=5"#);
//! }
//! let refused = service.clone().oneshot(request()?).await?;
//! assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(refused.headers()["retry-after"], "1");
//! assert_eq!(refused.headers()["ratelimit"], r#""default";r=0;t=1"#);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The header fields
//!
//! The fields follow draft-ietf-httpapi-ratelimit-headers, revision 11
//! (structured fields, the policy named by an sf-string):
//!
//! ```text
//! RateLimit-Policy: "default";q=5;w=5
//! RateLimit: "default";r=2;t=3
//! ```
//!
//! - the name is [`policy_name`](RateLimitLayerBuilder::policy_name)
//!   (`"default"` unless set);
//! - `q` is the limiter's quota: a bucket's capacity, a window's limit;
//! - `w` is the seconds those `q` units are spread over: for a token or
//!   leaky bucket the time an emptied bucket takes to refill (capacity
//!   times the refill interval), for a sliding window its width. Rounded
//!   up to whole seconds, at least 1 (the draft has no sub-second window),
//!   so a policy faster than a second advertises fewer requests a second
//!   than it admits, never more;
//! - `r` is what the key could still spend now (the decision's
//!   `remaining`);
//! - `t` is, on an admitted response, the seconds until the key is back
//!   to a full quota (the decision's `reset_after`, rounded up); on a `429`
//!   it equals `Retry-After`, as the draft asks that `Retry-After` not
//!   point earlier than the end of the effective window.
//!
//! The quota is read from the limiter for every response, so a
//! [`reconfigure`](guard_std::ratelimit::RateLimiter::reconfigure) shows at
//! once; `RateLimit-Policy` is formatted once per quota and reused while
//! the limiter reports the same one. Both fields are appended, so the fields of an inner layer with
//! another policy name stay. With
//! [`legacy_headers`](RateLimitLayerBuilder::legacy_headers) the layer
//! also writes `X-RateLimit-Limit` (`q`), `X-RateLimit-Remaining` (`r`)
//! and `X-RateLimit-Reset` (`t`, seconds from now, not a timestamp).
//!
//! # Limiters that wait for a backend
//!
//! An in-memory limiter decides inside `call`, and an admitted request
//! goes straight to the inner service. A limiter whose decision waits for
//! a backend (Redis) is asked again from the response future, which owns
//! the key: its first future is dropped unpolled, which costs nothing for
//! limiters that do their work when polled (guard's do). The response
//! future is `Send` either way.
//!
//! # Waiting instead of refusing
//!
//! [`wait_up_to(max, runtime)`](RateLimitLayerBuilder::wait_up_to) holds a
//! refused request until the limiter admits it, at most `max` from its
//! arrival, with guard-std's
//! [`WaitingLimiter`](guard_std::run::WaitingLimiter) on `runtime`'s clock
//! and timers (`guard_tokio::Tokio`, `guard_smol::AsyncIo`):
//!
//! ```
//! # use std::sync::Arc;
//! # use std::time::Duration;
//! # use guard_core::limit::{FullPolicy, Rate, TokenBucket};
//! # use guard_std::ratelimit::MemoryLimiter;
//! # use guard_tower::RateLimitLayer;
//! # let limiter = MemoryLimiter::new(TokenBucket::new(5, Rate::per_second(1))?, 10_000, FullPolicy::DenyNewKeys);
//! let layer = RateLimitLayer::builder(Arc::new(limiter))
//!     .wait_up_to(Duration::from_secs(2), guard_tokio::Tokio::new())
//!     .build()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - A request is decided at once, as without waiting, while none of the
//!   layer's requests on its key waits: no line, timer or allocation in
//!   the common case. Refused, it joins its key's line if the refusal asks
//!   for no more than `max`; otherwise it is answered `429` at once.
//! - While a key has waiters, every new request on it joins the line
//!   behind them instead of being decided first: waiters are admitted in
//!   arrival order, and a unit freed for a waiter is not taken by a
//!   request that arrived later (which, with a steady stream of arrivals,
//!   would starve the waiters until their deadline).
//! - A request's arrival is its `Service::call`: it takes its place in
//!   line there, so the order does not depend on the order its response
//!   future and the others are first polled in. With a limiter that waits
//!   for its backend, a request holds its place from its call while the
//!   limiter decides (later arrivals still ask meanwhile); refused, it
//!   waits at that place, behind the earlier arrivals.
//! - Admitted: the inner service is called with the fields of the
//!   admitting decision. A waiter whose turn comes when the limiter asks
//!   for more than is left of its wait is answered `429` then, with that
//!   refusal's `Retry-After` and fields; at its deadline at the latest
//!   (behind a slow backend), with the `Retry-After` of its first refusal,
//!   or 1 s if it had none.
//! - More than [`LINE_CAPACITY`](guard_std::run::LINE_CAPACITY) waiters on
//!   a key: `429` at once, saying so. A cost above the quota stays `413`;
//!   a backend failure follows [`OnBackendError`].
//! - A response future dropped while in line (the client went away),
//!   polled or not, leaves the line, and the next waiter's turn comes at
//!   once. A waiter's deadline bounds its wait behind earlier arrivals
//!   too, also behind one whose future is not polled yet.
//!
//! Deadlines and sleeps are on `runtime`'s clock, so under
//! `tokio::time::pause` (with the limiter on the same clock,
//! `MemoryLimiter::with_clock(.., RuntimeClock::new(Tokio::new()))`) a
//! test of waits finishes at once.
// docs.rs (nightly, `--cfg docsrs`) marks each feature-gated item with
// the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod allow;
mod body;
mod breaker;
mod bulkhead;
mod error;
mod extract;
mod headers;
mod layer;
mod wait;

pub use allow::AllowList;
pub use body::ResponseBody;
pub use breaker::{
    BreakerFuture, CircuitBreakerLayer, CircuitBreakerLayerBuilder, CircuitBreakerService,
};
pub use bulkhead::{
    BULKHEAD_LINE, BulkheadFuture, BulkheadLayer, BulkheadLayerBuilder, BulkheadPermit,
    BulkheadService,
};
pub use error::ConfigError;
pub use extract::{
    ClientIp, DEFAULT_IPV6_PREFIX, HeaderKey, Key, KeyExtractor, KeyFn, PathKey, key_fn,
};
pub use headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
pub use layer::{
    DEFAULT_BACKEND_RETRY_AFTER, DEFAULT_POLICY_NAME, MissingKey, OnBackendError, RateLimitLayer,
    RateLimitLayerBuilder, RateLimitService, ResponseFuture,
};

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
//! once. Both fields are appended, so the fields of an inner layer with
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
//! # Not yet available
//!
//! Waiting instead of refusing (hold a request until the limiter would
//! admit it, up to a bound) is not in this release. It will be a builder
//! option, `wait(max: Duration)`, added without changing anything here.

mod body;
mod error;
mod extract;
mod headers;
mod layer;

pub use body::ResponseBody;
pub use error::ConfigError;
pub use extract::{ClientIp, HeaderKey, Key, KeyExtractor, KeyFn, PathKey, key_fn};
pub use headers::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
pub use layer::{
    DEFAULT_BACKEND_RETRY_AFTER, DEFAULT_POLICY_NAME, MissingKey, OnBackendError, RateLimitLayer,
    RateLimitLayerBuilder, RateLimitService, ResponseFuture,
};

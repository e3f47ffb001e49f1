//! The example's application: its limiter and router. The loopback test
//! (`tests/axum_server.rs`) includes this file, so it serves exactly this
//! router.

use std::sync::Arc;

use axum::Router;
use axum::extract::Path;
use axum::routing::get;
use guard_core::limit::{FullPolicy, Rate, TokenBucket};
use guard_std::ratelimit::{MemoryLimiter, RateLimiter};
use guard_tower::{ClientIp, ConfigError, RateLimitLayer};

/// Requests a client may send at once.
pub const BURST: u32 = 5;

/// Requests a second a client gets back after its burst.
pub const PER_SECOND: u32 = 1;

/// Clients tracked at once; a new one beyond is refused until an idle
/// one's bucket is full again.
pub const CLIENTS: usize = 10_000;

/// The bucket every client gets. Checked when compiled: a refused
/// parameter fails the build, never a run.
const BUCKET: TokenBucket = match TokenBucket::new(BURST, Rate::per_second(PER_SECOND)) {
    Ok(bucket) => bucket,
    Err(_) => panic!("a burst of 5 at 1 a second is a valid bucket"),
};

/// An in-memory token bucket per client IP.
pub fn limiter() -> Arc<dyn RateLimiter> {
    Arc::new(MemoryLimiter::new(BUCKET, CLIENTS, FullPolicy::DenyNewKeys))
}

/// `/` and `/hello/{name}`, rate-limited by client IP with `limiter`.
/// Serve it with `into_make_service_with_connect_info::<SocketAddr>()`:
/// the client IP is the peer address that records.
pub fn router(limiter: Arc<dyn RateLimiter>) -> Result<Router, ConfigError> {
    let layer = RateLimitLayer::builder(limiter)
        .key(ClientIp::peer())
        .build()?;
    Ok(Router::new()
        .route("/", get(index))
        .route("/hello/{name}", get(hello))
        .layer(layer))
}

async fn index() -> &'static str {
    "guard-tower example: try /hello/{name}\n"
}

async fn hello(Path(name): Path<String>) -> String {
    format!("Hello, {name}!\n")
}

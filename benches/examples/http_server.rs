//! One axum server, rate-limited per client IP by guard-tower or by
//! tower-governor with the same non-binding quota (both answering with
//! their rate-limit header fields), for a load generator to compare the
//! two layers end to end over loopback (`scripts/http-bench.sh`).
//!
//! `cargo run --release -p guard-benches --example http_server -- guard|governor|none PORT`

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use guard_core::limit::{FullPolicy, Rate, TokenBucket};
use guard_std::ratelimit::MemoryLimiter;
use guard_tower::{ClientIp, RateLimitLayer};
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

/// A burst no load generator reaches: the decision is measured, never a 429.
const BURST: u32 = 1_000_000_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let layer = args.next().unwrap_or_else(|| "guard".to_owned());
    let port: u16 = args.next().as_deref().unwrap_or("3000").parse()?;
    let app = Router::new().route("/hello/{name}", get(|| async { "hello" }));
    let app = match layer.as_str() {
        "guard" => {
            let bucket = TokenBucket::new(BURST, Rate::per(1, Duration::from_nanos(1)))?;
            let limiter = MemoryLimiter::new(bucket, 10_000, FullPolicy::DenyNewKeys);
            app.layer(
                RateLimitLayer::builder(Arc::new(limiter))
                    .key(ClientIp::peer())
                    .build()?,
            )
        }
        "governor" => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(BURST)
                .use_headers()
                .finish()
                .ok_or("tower-governor configuration")?;
            app.layer(GovernorLayer::new(config))
        }
        "none" => app,
        other => return Err(format!("layer {other:?}: expected guard, governor or none").into()),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        println!("{layer} on http://{}", listener.local_addr()?);
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await?;
        Ok(())
    })
}

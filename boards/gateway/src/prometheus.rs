//! Metrics and health over HTTP: `GET /metrics` (Prometheus text),
//! `GET /healthz` (the process answers), `GET /readyz` (the replica has
//! connected and its locker answered) and `GET /status` (what it holds,
//! as JSON: [`crate::status`]); any other path is 404, any other method
//! 405. Nothing served changes state.
//!
//! Served by hyper's HTTP/1 server on smol, on a thread of its own, and
//! bounded so that nothing a client does can take what the lock backend
//! needs:
//! - at most [`MAX_CONNECTIONS`] connections are open at once: the next
//!   one is not even accepted (it waits in the kernel's backlog), so a
//!   flood of idle clients cannot exhaust the process's descriptors;
//! - a request head must arrive within [`HEAD_TIMEOUT`], and a connection
//!   lives at most [`CONNECTION_TIMEOUT`];
//! - an accept error (descriptors exhausted elsewhere) backs off, from
//!   10 ms doubling to 1 s, and is logged at most once per
//!   [`guard_std::THROTTLE_INTERVAL`] with the count of the ones not
//!   logged.

use crate::readiness::Readiness;
use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use async_io::Async;
use async_lock::Semaphore;
use futures_lite::future;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use smol_hyper::rt::{FuturesIo, SmolTimer};

use guard_std::Throttle;

/// How long a client may take to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one connection may stay open.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 64;

/// Installs the Prometheus recorder for this process and serves it on
/// `address` from a background thread; `/readyz` answers 200 while
/// `ready` says so, else 503 with what the replica waits for. Returns the
/// bound address.
pub fn serve(
    address: SocketAddr,
    ready: Arc<Readiness>,
) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    // The `guard_*_seconds` families as histograms (a summary's quantiles
    // cannot be summed across replicas).
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            guard_std::observe::SECONDS_BUCKETS,
        )?
        .install_recorder()?;
    let listener = Async::<TcpListener>::bind(address)?;
    let bound = listener.get_ref().local_addr()?;
    thread::Builder::new()
        .name("prometheus".into())
        .spawn(move || smol::block_on(accept(listener, handle, ready)))?;
    Ok(bound)
}

async fn accept(listener: Async<TcpListener>, handle: PrometheusHandle, ready: Arc<Readiness>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let errors = Throttle::new();
    let mut backoff = Duration::from_millis(10);
    loop {
        // A slot first: beyond the cap, connections are not accepted at
        // all, so they hold no descriptor of this process.
        let slot = slots.acquire_arc().await;
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                backoff = Duration::from_millis(10);
                stream
            }
            Err(e) => {
                if let Some(unlogged) = errors.admit() {
                    tracing::warn!(
                        "metrics listener: {e} ({unlogged} more not logged); backing off {backoff:?}"
                    );
                }
                drop(slot);
                async_io::Timer::after(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let (handle, ready) = (handle.clone(), ready.clone());
        smol::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request| {
                let response = respond(&request, &handle, &ready);
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(SmolTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .keep_alive(false)
                .serve_connection(FuturesIo::new(stream), service);
            let late = async {
                async_io::Timer::after(CONNECTION_TIMEOUT).await;
                Ok(())
            };
            if let Err(e) = future::or(connection, late).await {
                tracing::debug!("metrics request: {e}");
            }
        })
        .detach();
    }
}

fn respond<B>(
    request: &Request<B>,
    handle: &PrometheusHandle,
    ready: &Readiness,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = if request.method() != Method::GET {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".to_owned(),
        )
    } else {
        match request.uri().path() {
            "/metrics" => (StatusCode::OK, "text/plain; version=0.0.4", handle.render()),
            "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
            "/status" => (
                StatusCode::OK,
                "application/json",
                crate::status::render(ready),
            ),
            "/readyz" => match ready.check() {
                Ok(()) => (StatusCode::OK, "text/plain", "ready\n".to_owned()),
                Err(waiting) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("not ready: {waiting}\n"),
                ),
            },
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found\n".to_owned(),
            ),
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if status == StatusCode::METHOD_NOT_ALLOWED {
        // A 405 names the methods the resource takes (RFC 9110 15.5.6).
        response.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET"),
        );
    }
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A method other than GET is 405 with `Allow: GET` (RFC 9110 15.5.6),
    /// on every path; nothing served changes state.
    #[test]
    fn another_method_is_refused_naming_the_one_allowed() {
        let handle = PrometheusBuilder::new().build_recorder().handle();
        let ready = Readiness::new();
        for method in [Method::HEAD, Method::POST, Method::DELETE] {
            for path in ["/status", "/metrics", "/nowhere"] {
                let request = Request::builder()
                    .method(method.clone())
                    .uri(path)
                    .body(())
                    .unwrap();
                let response = respond(&request, &handle, &ready);
                assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
                assert_eq!(
                    response.headers().get(hyper::header::ALLOW),
                    Some(&hyper::header::HeaderValue::from_static("GET")),
                    "{method} {path}"
                );
            }
        }
    }
}

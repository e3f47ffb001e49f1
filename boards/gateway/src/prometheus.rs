//! Metrics and health over HTTP, served on async-io: `GET /metrics`
//! (Prometheus text), `GET /healthz` (the process answers) and
//! `GET /readyz` (the replica has connected and its locker answered);
//! any other path is 404.
//!
//! The `metrics` facade records into the exporter's recorder; a small
//! HTTP listener renders it (no separate runtime needed). A request head
//! must arrive within [`HEAD_TIMEOUT`].

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use async_io::Async;
use futures_lite::{AsyncReadExt, AsyncWriteExt, future};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// How long a client may take to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder for this process and serves it on
/// `address` from a background thread; `/readyz` answers 200 while
/// `ready` is set. Returns the bound address.
pub fn serve(
    address: SocketAddr,
    ready: Arc<AtomicBool>,
) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    let listener = Async::<TcpListener>::bind(address)?;
    let bound = listener.get_ref().local_addr()?;
    thread::Builder::new()
        .name("prometheus".into())
        .spawn(move || smol::block_on(accept(listener, handle, ready)))?;
    Ok(bound)
}

async fn accept(listener: Async<TcpListener>, handle: PrometheusHandle, ready: Arc<AtomicBool>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let (handle, ready) = (handle.clone(), ready.clone());
                smol::spawn(async move {
                    let answer = respond(stream, &handle, &ready);
                    let late = async {
                        async_io::Timer::after(HEAD_TIMEOUT).await;
                        Err(std::io::ErrorKind::TimedOut.into())
                    };
                    if let Err(e) = future::or(answer, late).await {
                        log::debug!("metrics request: {e}");
                    }
                })
                .detach();
            }
            Err(e) => {
                log::warn!("metrics listener: {e}");
                // Out of descriptors or similar: do not spin on it.
                async_io::Timer::after(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn respond(
    mut stream: Async<std::net::TcpStream>,
    handle: &PrometheusHandle,
    ready: &AtomicBool,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut words = std::str::from_utf8(line).unwrap_or("").split(' ');
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, content_type, body) = match path {
        _ if method != "GET" && method != "HEAD" => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_owned(),
        ),
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", handle.render()),
        "/healthz" => ("200 OK", "text/plain", "ok\n".to_owned()),
        "/readyz" if ready.load(Ordering::Acquire) => {
            ("200 OK", "text/plain", "ready\n".to_owned())
        }
        "/readyz" => (
            "503 Service Unavailable",
            "text/plain",
            "not ready: connecting\n".to_owned(),
        ),
        _ => ("404 Not Found", "text/plain", "not found\n".to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.flush().await
}

//! Prometheus text at `http://<address>/metrics`, served on async-io.
//!
//! The `metrics` facade records into the exporter's recorder; a small
//! HTTP listener renders it (no separate runtime needed).

use std::net::{SocketAddr, TcpListener};
use std::thread;

use async_io::Async;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Installs the Prometheus recorder for this process and serves it on
/// `address` from a background thread. Returns the bound address.
pub fn serve(address: SocketAddr) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    let listener = Async::<TcpListener>::bind(address)?;
    let bound = listener.get_ref().local_addr()?;
    thread::Builder::new()
        .name("prometheus".into())
        .spawn(move || smol::block_on(accept(listener, handle)))?;
    Ok(bound)
}

async fn accept(listener: Async<TcpListener>, handle: PrometheusHandle) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let handle = handle.clone();
                smol::spawn(async move {
                    if let Err(e) = respond(stream, &handle).await {
                        log::debug!("metrics request: {e}");
                    }
                })
                .detach();
            }
            Err(e) => log::warn!("metrics listener: {e}"),
        }
    }
}

async fn respond(
    mut stream: Async<std::net::TcpStream>,
    handle: &PrometheusHandle,
) -> std::io::Result<()> {
    // Read the request head; every path answers with the metrics.
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let body = handle.render();
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.flush().await
}

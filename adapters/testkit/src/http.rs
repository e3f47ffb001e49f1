//! A plain HTTP/1.1 GET and the reading of a Prometheus text sample: what
//! the tests of a process's `/metrics`, `/healthz` and `/readyz` need,
//! with no HTTP client.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A GET of `path` on 127.0.0.1:`port`, within 5 s to connect and 10 s
/// to read: the status line and the body.
pub fn get(port: u16, path: &str) -> std::io::Result<(String, String)> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok((
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    ))
}

/// The value of the first sample of `series` (a metric name with its
/// labels, as Prometheus prints them) in `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

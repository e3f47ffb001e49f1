//! A plain HTTP/1.1 request and the reading of a Prometheus text sample:
//! what the tests of a process's `/metrics`, `/healthz`, `/readyz` and
//! its own routes need, with no HTTP client.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A GET of `path` on 127.0.0.1:`port`, within 5 s to connect and 10 s
/// to read: the status line and the body.
pub fn get(port: u16, path: &str) -> std::io::Result<(String, String)> {
    let answer = request(port, "GET", path, "")?;
    Ok((answer.status_line, answer.body))
}

/// An HTTP/1.1 reply: its status line, header lines and body.
#[derive(Clone, Debug, Default)]
pub struct Reply {
    /// `HTTP/1.1 200 OK`.
    pub status_line: String,
    /// The header lines, as sent.
    pub headers: Vec<String>,
    /// The body (not de-chunked).
    pub body: String,
}

impl Reply {
    /// The status code, 0 if the status line has none.
    pub fn status(&self) -> u16 {
        self.status_line
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or(0)
    }

    /// The value of header `name` (any case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find_map(|line| {
            let (field, value) = line.split_once(':')?;
            field.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// `method` `path` on 127.0.0.1:`port` with `body`, within 5 s to connect
/// and 10 s to read.
pub fn request(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<Reply> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let mut lines = head.lines();
    Ok(Reply {
        status_line: lines.next().unwrap_or_default().to_owned(),
        headers: lines.map(str::to_owned).collect(),
        body: body.to_owned(),
    })
}

/// The value of the first sample of `series` (a metric name with its
/// labels, as Prometheus prints them) in `text`.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

//! A connection that the request drives itself.
//!
//! A multiplexed connection hands every request to a driver task and the
//! reply back through a channel: two task hops per request, which on two
//! cores cost a tenth of a loopback round trip and kept one caller below
//! 0.9 of `redis-benchmark` (benches/RESULTS.md, "where a decision's time
//! goes"). A [`Direct`] connection is written and read by the request's own
//! future, as `redis-benchmark` does, so one caller waits only for the
//! server. It serves one request at a time; [`DirectPool`] keeps it between
//! requests and the standalone connection falls back to its multiplexed
//! connections while it is busy, so concurrent callers still pipeline.
//!
//! Guarantees:
//! - A connection goes back to the pool only after a whole reply was read:
//!   a request cancelled or timed out mid-flight, or one that met an IO or
//!   protocol error, discards it (its stream may hold a late reply).
//! - An idle connection whose server closed it is discarded before use, so
//!   a restarted server costs no failed request.
//! - Plain `redis://` over TCP with RESP2 only; TLS, Unix sockets and
//!   RESP3 keep to the multiplexed connections.
//! - It runs on the caller's runtime (tokio's inside a tokio runtime with
//!   the `tokio` feature, else async-io's), as redis-rs's own tasks do.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_io::Async;
use futures_lite::{AsyncReadExt as _, AsyncWriteExt as _};
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ProtocolVersion, RedisError, RedisFuture, RedisResult,
    Value,
};

/// Direct connections kept per standalone server. One serves a single
/// caller at full speed; more callers pipeline better over the
/// multiplexed connections.
pub const DIRECT_CONNECTIONS: usize = 1;

/// After a failed attempt to open a direct connection, requests use the
/// multiplexed connections for this long before trying again, so that a
/// server that refuses or hangs is not dialled on every request.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// Nesting limit of a reply: our replies nest two deep (SCAN); a deeper one
/// is refused rather than followed down the stack.
const MAX_DEPTH: usize = 16;

/// One TCP connection, written and read by the request that holds it.
/// A TCP stream on the runtime it was opened on (see `rt`).
enum Stream {
    AsyncIo(Async<TcpStream>),
    #[cfg(feature = "tokio")]
    Tokio(tokio::net::TcpStream),
}

impl Stream {
    /// Connects to `host:port` on the caller's runtime, without Nagle's
    /// delay (requests are single writes).
    async fn connect(host: &str, port: u16) -> std::io::Result<Stream> {
        #[cfg(feature = "tokio")]
        if guard_std::run::on_tokio() {
            let stream = tokio::net::TcpStream::connect((host, port)).await?;
            stream.set_nodelay(true)?;
            return Ok(Stream::Tokio(stream));
        }
        let mut last = None;
        for addr in async_net::resolve((host, port)).await? {
            match Async::<TcpStream>::connect(addr).await {
                Ok(stream) => {
                    stream.get_ref().set_nodelay(true)?;
                    return Ok(Stream::AsyncIo(stream));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            std::io::Error::new(ErrorKind::NotFound, "the host resolved to no address")
        }))
    }

    /// Whether it was opened on tokio.
    fn on_tokio(&self) -> bool {
        match self {
            Stream::AsyncIo(_) => false,
            #[cfg(feature = "tokio")]
            Stream::Tokio(_) => true,
        }
    }

    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::AsyncIo(s) => s.write_all(bytes).await,
            #[cfg(feature = "tokio")]
            Stream::Tokio(s) => tokio::io::AsyncWriteExt::write_all(s, bytes).await,
        }
    }

    async fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::AsyncIo(s) => s.read(buf).await,
            #[cfg(feature = "tokio")]
            Stream::Tokio(s) => tokio::io::AsyncReadExt::read(s, buf).await,
        }
    }

    /// Whether the server has closed it (or sent something unasked): a
    /// non-blocking peek, no round trip.
    fn is_stale(&self) -> bool {
        let mut byte = [0u8; 1];
        match self {
            Stream::AsyncIo(s) => match s.get_ref().peek(&mut byte) {
                Err(e) => e.kind() != ErrorKind::WouldBlock,
                // 0: closed; anything else: bytes nobody asked for.
                Ok(_) => true,
            },
            #[cfg(feature = "tokio")]
            Stream::Tokio(s) => {
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                let mut buf = tokio::io::ReadBuf::new(&mut byte);
                // Pending: nothing to read, the healthy case.
                s.poll_peek(&mut cx, &mut buf).is_ready()
            }
        }
    }
}

pub(crate) struct Direct {
    stream: Stream,
    buf: Vec<u8>,
    db: i64,
    /// Set from writing a request until its whole reply is read: a
    /// connection dropped in between may hold a late reply.
    in_flight: bool,
}

/// A RESP2 protocol violation, or a reply too deeply nested.
fn protocol(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        ErrorKind::InvalidData,
        format!("redis reply: {what}"),
    ))
}

impl Direct {
    /// Opens a connection to `host:port`, then authenticates and selects
    /// the database as `info`'s URL says.
    async fn open(host: &str, port: u16, info: &ConnectionInfo) -> RedisResult<Direct> {
        let settings = info.redis_settings();
        let mut conn = Direct {
            stream: Stream::connect(host, port).await?,
            buf: Vec::with_capacity(512),
            db: settings.db(),
            in_flight: false,
        };
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            conn.round_trip(&auth.get_packed_command())
                .await?
                .extract_error()?;
        }
        if settings.db() != 0 {
            conn.round_trip(&redis::cmd("SELECT").arg(settings.db()).get_packed_command())
                .await?
                .extract_error()?;
        }
        Ok(conn)
    }

    /// Whether the server has closed this idle connection.
    fn is_stale(&self) -> bool {
        self.stream.is_stale()
    }

    /// Writes one packed request and reads its whole reply.
    async fn round_trip(&mut self, packed: &[u8]) -> RedisResult<Value> {
        self.in_flight = true;
        self.stream.write_all(packed).await?;
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        loop {
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::from(ErrorKind::UnexpectedEof).into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = reply_end(&self.buf, 0, 0)? {
                if end != self.buf.len() {
                    return Err(protocol("more bytes than the one reply asked for"));
                }
                let value = redis::Parser::new().parse_value(&self.buf[..end])?;
                self.in_flight = false;
                return Ok(value);
            }
        }
    }
}

impl redis::aio::ConnectionLike for Direct {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move { self.round_trip(&cmd.get_packed_command()).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a redis::Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        // Pipelines go through the multiplexed connections (`query` and
        // `invoke` take single commands); refusing keeps this one simple.
        Box::pin(async { Err(protocol("pipelines are not sent over a direct connection")) })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

/// Where the RESP2 reply starting at `at` ends, if `buf` holds all of it.
fn reply_end(buf: &[u8], at: usize, depth: usize) -> RedisResult<Option<usize>> {
    if depth > MAX_DEPTH {
        return Err(protocol("nested deeper than any command of ours replies"));
    }
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(cr) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = &buf[at + 1..at + cr];
    let after = at + cr + 2;
    let length = || -> RedisResult<i64> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol("a length that is not a number"))
    };
    match kind {
        b'+' | b'-' | b':' => Ok(Some(after)),
        b'$' => match usize::try_from(length()?) {
            // -1: a null bulk string.
            Err(_) => Ok(Some(after)),
            Ok(n) => {
                let end = after.saturating_add(n).saturating_add(2);
                Ok((buf.len() >= end).then_some(end))
            }
        },
        b'*' => {
            let mut pos = after;
            // -1: a null array.
            for _ in 0..length()?.max(0) {
                match reply_end(buf, pos, depth + 1)? {
                    Some(end) => pos = end,
                    None => return Ok(None),
                }
            }
            Ok(Some(pos))
        }
        _ => Err(protocol("a type byte RESP2 does not have")),
    }
}

/// Idle direct connections to one server, and how many exist.
pub(crate) struct DirectPool {
    host: String,
    port: u16,
    info: ConnectionInfo,
    idle: Mutex<Vec<Direct>>,
    /// Connections open or being opened: idle plus leased.
    live: AtomicUsize,
    /// No new connection is opened before this instant (after a failure).
    reopen_at: Mutex<Option<Instant>>,
    /// A connection was dropped (the server closed it, or a request cut
    /// off or failed on it) since one was last opened.
    dropped: AtomicBool,
    /// A connection was opened after one was dropped, and nobody has
    /// asked yet (see [`take_reopened`](Self::take_reopened)).
    reopened: AtomicBool,
}

impl DirectPool {
    /// A pool for the server `info` names, which opens connections on
    /// demand; `None` unless the server is reached over plain TCP with RESP2.
    pub(crate) fn new(info: &ConnectionInfo) -> Option<Self> {
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        if info.redis_settings().protocol() != ProtocolVersion::RESP2 {
            return None;
        }
        Some(DirectPool {
            host: host.clone(),
            port: *port,
            info: info.clone(),
            idle: Mutex::new(Vec::with_capacity(DIRECT_CONNECTIONS)),
            live: AtomicUsize::new(0),
            reopen_at: Mutex::new(None),
            dropped: AtomicBool::new(false),
            reopened: AtomicBool::new(false),
        })
    }

    /// An idle connection, or a new one if fewer than
    /// [`DIRECT_CONNECTIONS`] exist; `None` when all are busy or opening
    /// failed (the caller uses a multiplexed connection instead).
    pub(crate) async fn lease(&self) -> Option<Lease<'_>> {
        loop {
            let conn = self
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            match conn {
                Some(conn) if conn.is_stale() => self.discard(conn),
                // Opened on the other runtime (a connection used from both):
                // kept for its own, this request goes multiplexed.
                Some(conn) if conn.stream.on_tokio() != guard_std::run::on_tokio() => {
                    self.idle
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(conn);
                    return None;
                }
                Some(conn) => {
                    return Some(Lease {
                        pool: self,
                        conn: Some(conn),
                    });
                }
                None => break,
            }
        }
        let waiting = self
            .reopen_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| Instant::now() < at);
        if waiting {
            return None;
        }
        // Counted before opening, so that concurrent callers open no more
        // than DIRECT_CONNECTIONS between them.
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < DIRECT_CONNECTIONS).then_some(n + 1)
            })
            .ok()?;
        let opening = Opening { pool: self };
        let opened = Direct::open(&self.host, self.port, &self.info).await;
        std::mem::forget(opening);
        match opened {
            Ok(conn) => {
                if self.dropped.swap(false, Ordering::AcqRel) {
                    self.reopened.store(true, Ordering::Release);
                }
                Some(Lease {
                    pool: self,
                    conn: Some(conn),
                })
            }
            Err(e) => {
                tracing::debug!(
                    "redis: no direct connection to {}:{}: {e}",
                    self.host,
                    self.port
                );
                self.live.fetch_sub(1, Ordering::AcqRel);
                *self
                    .reopen_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + REOPEN_AFTER);
                None
            }
        }
    }

    fn discard(&self, conn: Direct) {
        drop(conn);
        self.dropped.store(true, Ordering::Release);
        self.live.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether a connection was opened again after one was dropped, once:
    /// the server was gone and is back, so the multiplexed connections,
    /// which requests use only while this one is busy, may still hold
    /// sockets of the server that went (see `Pool::lease`).
    pub(crate) fn take_reopened(&self) -> bool {
        self.reopened.swap(false, Ordering::AcqRel)
    }
}

/// Gives the count back if opening is cancelled (the request timed out or
/// was dropped while connecting).
struct Opening<'a> {
    pool: &'a DirectPool,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.pool.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection held by one request; back to the pool on drop if its last
/// reply was read whole, else closed.
pub(crate) struct Lease<'a> {
    pool: &'a DirectPool,
    conn: Option<Direct>,
}

impl Lease<'_> {
    /// The connection, for one request at a time.
    pub(crate) fn conn(&mut self) -> &mut Direct {
        // `conn` is Some until drop.
        self.conn
            .as_mut()
            .expect("a lease holds its connection until dropped")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if conn.in_flight {
            self.pool.discard(conn);
        } else {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_ends_only_when_all_of_it_is_there() {
        let whole = b"*5\r\n:1\r\n:10\r\n:9\r\n:-1\r\n$3\r\nabc\r\n";
        assert_eq!(reply_end(whole, 0, 0).unwrap(), Some(whole.len()));
        for cut in 0..whole.len() {
            assert_eq!(
                reply_end(&whole[..cut], 0, 0).unwrap(),
                None,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn nulls_errors_and_nested_arrays_are_framed() {
        for reply in [
            &b"$-1\r\n"[..],
            b"*-1\r\n",
            b"-NOSCRIPT No matching script\r\n",
            b"+OK\r\n",
            b"*2\r\n$1\r\n0\r\n*2\r\n$1\r\na\r\n$0\r\n\r\n",
        ] {
            assert_eq!(reply_end(reply, 0, 0).unwrap(), Some(reply.len()));
        }
    }

    #[test]
    fn a_malformed_reply_is_an_error_naming_what_is_wrong() {
        let unknown = reply_end(b"?1\r\n", 0, 0).unwrap_err().to_string();
        assert!(unknown.contains("type byte"), "{unknown}");
        let length = reply_end(b"$x\r\n", 0, 0).unwrap_err().to_string();
        assert!(length.contains("not a number"), "{length}");
        let deep = b"*1\r\n".repeat(MAX_DEPTH + 2);
        let nested = reply_end(&deep, 0, 0).unwrap_err().to_string();
        assert!(nested.contains("nested"), "{nested}");
    }
}

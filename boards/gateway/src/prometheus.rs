//! Metrics and health over HTTP: `GET /metrics` (Prometheus text),
//! `GET /healthz` (the process answers), `GET /readyz` (the replica has
//! connected and its locker answered) and `GET /status` (what it holds,
//! as JSON: [`crate::status`]); any other path is 404, any other method
//! 405. Nothing served changes state.
//!
//! Served by hyper's HTTP/1 server on smol, on a thread of its own, and
//! bounded so that nothing a client does can take what the lock backend
//! needs, nor keep a probe waiting:
//! - at most [`MAX_CONNECTIONS`] connections are open at once, so a flood
//!   of idle clients cannot exhaust the process's descriptors; every
//!   connection is accepted at once, and one beyond the bound closes the
//!   oldest still waiting for its request head (or, if none waits, the
//!   oldest), so idle or slow clients never make a probe wait behind
//!   them: a new connection is served as soon as its head arrives;
//! - one peer (an address, an IPv6 address's /64) holds at most
//!   [`MAX_IDLE_PER_PEER`] connections waiting for their heads: its next
//!   one closes its own oldest first;
//! - a request head must arrive within [`HEAD_TIMEOUT`], and a connection
//!   lives at most [`CONNECTION_TIMEOUT`];
//! - an accept error (descriptors exhausted elsewhere) backs off, from
//!   10 ms doubling to 1 s, and is logged at most once per
//!   [`guard_std::THROTTLE_INTERVAL`] with the count of the ones not
//!   logged.

use crate::readiness::Readiness;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use async_io::Async;
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
/// Connections open at once; a new one beyond closes an older one.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections of one peer address that may wait for their request heads
/// at once; a new one beyond closes the peer's oldest.
pub const MAX_IDLE_PER_PEER: usize = 8;

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

/// One open connection: whom it is from, whether its request head
/// arrived, and the task serving it (dropped to close it).
struct Open {
    id: u64,
    peer: IpAddr,
    head: Arc<AtomicBool>,
    task: Option<smol::Task<()>>,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Connections {
    next_id: u64,
    open: VecDeque<Open>,
}

impl Connections {
    /// Makes room for a connection from `peer` and records it: the ids of
    /// the connection and the tasks to drop (the connections it closes).
    fn admit(&mut self, peer: IpAddr, head: Arc<AtomicBool>) -> (u64, Vec<smol::Task<()>>) {
        let waiting = |o: &Open| !o.head.load(Ordering::Acquire) && o.task.is_some();
        let mut closed = Vec::new();
        let peer_waiting = self
            .open
            .iter()
            .filter(|o| o.peer == peer && waiting(o))
            .count();
        if peer_waiting >= MAX_IDLE_PER_PEER
            && let Some(i) = self.open.iter().position(|o| o.peer == peer && waiting(o))
        {
            closed.extend(self.open.remove(i).and_then(|o| o.task));
        }
        while self.open.len() >= MAX_CONNECTIONS {
            let oldest = self.open.iter().position(waiting).or_else(|| {
                // None waits: the oldest one being served had its chance.
                self.open.iter().position(|o| o.task.is_some())
            });
            match oldest.and_then(|i| self.open.remove(i)) {
                Some(o) => closed.extend(o.task),
                None => break,
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.open.push_back(Open {
            id,
            peer,
            head,
            task: None,
        });
        (id, closed)
    }

    /// Hands connection `id` its task; gives the task back when the
    /// connection is no longer recorded (it already ended).
    fn serving(&mut self, id: u64, task: smol::Task<()>) -> Option<smol::Task<()>> {
        match self.open.iter_mut().find(|o| o.id == id) {
            Some(open) => {
                open.task = Some(task);
                None
            }
            None => Some(task),
        }
    }

    /// Forgets connection `id`, which ended: its task, if recorded.
    fn ended(&mut self, id: u64) -> Option<smol::Task<()>> {
        let i = self.open.iter().position(|o| o.id == id)?;
        self.open.remove(i).and_then(|o| o.task)
    }
}

async fn accept(listener: Async<TcpListener>, handle: PrometheusHandle, ready: Arc<Readiness>) {
    let connections = Arc::new(Mutex::new(Connections::default()));
    let errors = Throttle::new();
    let mut backoff = Duration::from_millis(10);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                backoff = Duration::from_millis(10);
                accepted
            }
            Err(e) => {
                if let Some(unlogged) = errors.admit() {
                    tracing::warn!(
                        "metrics listener: {e} ({unlogged} more not logged); backing off {backoff:?}"
                    );
                }
                async_io::Timer::after(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let head = Arc::new(AtomicBool::new(false));
        let (id, closed) = lock(&connections).admit(peer_of(peer.ip()), head.clone());
        // Outside the lock, and waited for: a cancelled task's socket is
        // closed only once its future is dropped, and accepting on before
        // then would hold more descriptors than the bound.
        for task in closed {
            task.cancel().await;
        }
        let (handle, ready, open) = (handle.clone(), ready.clone(), connections.clone());
        let task = smol::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                head.store(true, Ordering::Release);
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
            // Its own handle, detached: dropping it here would cancel
            // this very task.
            if let Some(task) = lock(&open).ended(id) {
                task.detach();
            }
        });
        if let Some(task) = lock(&connections).serving(id, task) {
            task.detach();
        }
    }
}

/// Whom a connection counts against: its address, or an IPv6 one's /64
/// (a host is usually given a whole /64, and could take a new address
/// for every connection).
fn peer_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(
            u128::from(v6) & !u128::from(u64::MAX),
        )),
        v4 => v4,
    }
}

fn lock(connections: &Mutex<Connections>) -> std::sync::MutexGuard<'_, Connections> {
    connections.lock().unwrap_or_else(PoisonError::into_inner)
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

    /// Admits a connection from `peer` as the accept loop does, its task
    /// one that never ends; its head's flag.
    fn admit(table: &mut Connections, peer: &str) -> Arc<AtomicBool> {
        let head = Arc::new(AtomicBool::new(false));
        let (id, closed) = table.admit(peer_of(peer.parse().unwrap()), head.clone());
        drop(closed);
        assert!(table.serving(id, smol::spawn(future::pending())).is_none());
        head
    }

    fn open_ids(table: &Connections) -> Vec<u64> {
        table.open.iter().map(|o| o.id).collect()
    }

    #[test]
    fn a_new_connection_always_gets_in_and_the_oldest_waiting_one_makes_room() {
        let mut table = Connections::default();
        for i in 0..1_000 {
            admit(&mut table, &format!("10.0.{}.{}", i / 250, i % 250));
            assert!(table.open.len() <= MAX_CONNECTIONS);
        }
        // The 64 newest are open, in order.
        assert_eq!(open_ids(&table), (936..1_000).collect::<Vec<u64>>());
        // One whose head arrived outlives the waiting ones beside it.
        let mut table = Connections::default();
        admit(&mut table, "10.1.0.1").store(true, Ordering::Release);
        for i in 0..200 {
            admit(&mut table, &format!("10.2.0.{i}"));
        }
        assert_eq!(table.open.front().map(|o| o.id), Some(0));
        // When none waits, the oldest served one makes room.
        let mut table = Connections::default();
        for i in 0..=MAX_CONNECTIONS {
            admit(&mut table, &format!("10.3.0.{i}")).store(true, Ordering::Release);
        }
        assert_eq!(table.open.front().map(|o| o.id), Some(1));
    }

    #[test]
    fn one_peer_or_one_ipv6_network_waits_on_at_most_eight() {
        let mut table = Connections::default();
        admit(&mut table, "192.0.2.1");
        for i in 0..100u32 {
            // Every address of one /64, and one IPv4 peer's mapped address.
            admit(&mut table, &format!("2001:db8:1:2::{i:x}"));
            admit(&mut table, "::ffff:198.51.100.7");
        }
        let from = |peer: &str| {
            let peer = peer_of(peer.parse().unwrap());
            table.open.iter().filter(|o| o.peer == peer).count()
        };
        assert_eq!(from("2001:db8:1:2::ffff"), MAX_IDLE_PER_PEER);
        assert_eq!(from("198.51.100.7"), MAX_IDLE_PER_PEER);
        assert_eq!(from("192.0.2.1"), 1, "another peer's connection stays");
    }

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

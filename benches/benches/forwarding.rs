//! Messages per second from a Redis Stream to a local HTTP receiver, each
//! entry POSTed once, in one run:
//!
//! - `direct`: the plain forwarding loop, no queue: `StreamConsumer`
//!   (the gateway's batch of 10) hands each entry to `HttpSink` and
//!   acknowledges it once the receiver answered 2xx;
//! - `queued, sync 100 ms`: the same consumer hands each entry to a
//!   `QueuedSink` (guard-std's `DiskQueue`, synced every 100 ms, the
//!   gateway's default), acknowledged once written, and `forward` POSTs
//!   the queue's entries with the same `HttpSink`;
//! - `queued, sync every write`: the same with an `fdatasync` before
//!   each acknowledgement;
//! - `drain after an outage`: the queue filled while the receiver was
//!   "down" (no forwarding), then drained: the rate of `forward` alone;
//! - `HTTP alone`: the same `HttpSink` POSTing in a loop, no stream, no
//!   queue: what the sink carries to this receiver on this machine (the
//!   ceiling of the sides above).
//!
//! Each side runs with one request in flight (in order, the default) and
//! with `IN_FLIGHT` (`HttpSink::with_in_flight`, the forwarding window
//! and the consumer's concurrency alike).
//!
//! Rates from the consumer's start to the receiver's last request. The
//! receiver is a blocking HTTP/1.1 responder on a thread of its own
//! (200, no body, keep-alive). The goal is the issue's: queued at least
//! 0.8 of direct, and at least 20,000 messages a second with sync every
//! 100 ms. Each side runs in turn, three rounds, each keeping its best.
//!
//! `cargo bench -p guard-benches --bench forwarding [-- MESSAGES]`
//! (default 50,000); `--test` runs a short smoke pass. Starts its own
//! `redis-server`; the queues live in a temporary directory (the
//! machine's disk, not a tmpfs).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use futures_lite::future;
use guard_core::retry::{Classifier, RetryPolicy};
use guard_endpoints::redis::StreamConsumer;
use guard_endpoints::sink::http::HttpSink;
use guard_endpoints::sink::queued::{QueuedSink, WhenFull, forward};
use guard_endpoints::sink::{MessageSink, Outgoing};
use guard_redis::{RedisConnection, Topology};
use guard_std::disk_queue::{DiskQueue, QueueSettings, SyncPolicy};
use guard_testkit::RedisServer;

/// A local HTTP/1.1 receiver answering 200 to every request: the count
/// of requests it has read whole.
struct Receiver {
    port: u16,
    received: Arc<AtomicU64>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let received = Arc::new(AtomicU64::new(0));
        let count = received.clone();
        thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let count = count.clone();
                thread::spawn(move || serve(stream, &count));
            }
        });
        Receiver { port, received }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

fn serve(stream: TcpStream, count: &AtomicU64) {
    let _ = stream.set_nodelay(true);
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        let mut length = 0usize;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        count.fetch_add(1, Ordering::Relaxed);
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

/// Adds `n` entries to `stream`, pipelined in chunks.
fn fill(server: &RedisServer, stream: &str, n: u64) {
    let mut conn = redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .expect("connect");
    for chunk in 0..n.div_ceil(1_000) {
        let mut pipe = redis::pipe();
        for i in chunk * 1_000..((chunk + 1) * 1_000).min(n) {
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("payload")
                .arg(format!("{{\"reading\":{i},\"device\":\"d{}\"}}", i % 100))
                .ignore();
        }
        let () = pipe.query(&mut conn).expect("XADD");
    }
}

/// Waits until `receiver` has read `n` more requests than `from`.
async fn reached(receiver: &Receiver, from: u64, n: u64) {
    while receiver.received() < from + n {
        async_io::Timer::after(Duration::from_millis(1)).await;
    }
}

/// Requests in flight on the windowed sides.
const IN_FLIGHT: usize = 8;

/// Consumes `stream`, each entry sent through `sink` with its entry's
/// id as the key, `concurrency` at once, until `done`; `beside` runs
/// along (a queue's forwarding). The time it took.
fn consume(
    conn: &RedisConnection,
    stream: &str,
    sink: Arc<dyn MessageSink>,
    concurrency: usize,
    done: impl Future<Output = ()>,
    beside: impl Future<Output = ()>,
) -> Duration {
    let consumer = StreamConsumer::new(conn.clone(), stream, "bench", "consumer-1")
        .and_then(|c| c.with_batch(guard_endpoints::redis::DEFAULT_BATCH.max(concurrency)))
        .and_then(|c| c.with_concurrency(concurrency))
        .expect("consumer");
    let (handle, control) = guard_smol::control();
    let started = Instant::now();
    smol::block_on(async {
        let stop = async {
            done.await;
            handle.stop();
        };
        let consume = consumer.run(control, Classifier::retry_all(), |message| {
            let sink = sink.clone();
            async move {
                let payload = message.field("payload").unwrap_or_default().to_vec();
                let id = format!("{stream}:{}", message.id);
                let outgoing = Outgoing {
                    id: &id,
                    origin: stream,
                    fence: None,
                    payload: &payload,
                };
                sink.send(&outgoing).await.map_err(|e| e.to_string())
            }
        });
        future::or(
            async {
                future::zip(consume, stop).await;
            },
            async {
                beside.await;
                future::pending::<()>().await
            },
        )
        .await;
    });
    started.elapsed()
}

/// [`consume`] until the receiver has `n` more requests: entries per
/// second.
fn forwarded_rate(
    conn: &RedisConnection,
    stream: &str,
    n: u64,
    (sink, concurrency): (Arc<dyn MessageSink>, usize),
    receiver: &Receiver,
    beside: impl Future<Output = ()>,
) -> f64 {
    let from = receiver.received();
    let took = consume(
        conn,
        stream,
        sink,
        concurrency,
        reached(receiver, from, n),
        beside,
    );
    n as f64 / took.as_secs_f64()
}

fn http_sink(receiver: &Receiver, in_flight: usize) -> Arc<HttpSink> {
    Arc::new(
        HttpSink::new(&format!("http://127.0.0.1:{}/in", receiver.port))
            .and_then(|s| s.with_in_flight(in_flight))
            .expect("sink"),
    )
}

fn queue(sync: SyncPolicy) -> (tempfile::TempDir, Arc<QueuedSink>) {
    let dir = tempfile::tempdir().expect("dir");
    let settings = QueueSettings::new(1 << 30, sync).expect("settings");
    let (queue, _) = DiskQueue::open(dir.path(), settings).expect("queue");
    (
        dir,
        Arc::new(QueuedSink::new(
            "bench",
            queue,
            WhenFull::Wait(Duration::from_secs(1)),
        )),
    )
}

/// What a side measures.
#[derive(Clone, Copy, PartialEq)]
enum Way {
    Direct,
    Queued(SyncPolicy),
    Drain,
    HttpAlone,
}

/// One side of the comparison.
struct Side {
    name: String,
    way: Way,
    in_flight: usize,
    best: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let smoke = args.iter().any(|a| a == "--test");
    let n: u64 = if smoke {
        300
    } else {
        args.iter().find_map(|a| a.parse().ok()).unwrap_or(50_000)
    };
    let rounds = if smoke { 1 } else { 3 };
    let server = RedisServer::start().expect("redis-server");
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_secs(5),
    ))
    .expect("connect");
    let receiver = Receiver::start();
    let policy = RetryPolicy::new();
    let ways = [
        ("direct (no queue)", Way::Direct),
        (
            "queued, sync every 100 ms",
            Way::Queued(SyncPolicy::Every(Duration::from_millis(100))),
        ),
        (
            "queued, sync every write",
            Way::Queued(SyncPolicy::EveryWrite),
        ),
        ("drain after an outage", Way::Drain),
        ("HTTP alone (the ceiling)", Way::HttpAlone),
    ];
    let mut sides: Vec<Side> = [1, IN_FLIGHT]
        .into_iter()
        .flat_map(|in_flight| {
            ways.iter().map(move |&(name, way)| Side {
                name: format!("{name}, {in_flight} in flight"),
                way,
                in_flight,
                best: 0.0,
            })
        })
        .collect();
    let mut run = 0;
    for _ in 0..rounds {
        for side in &mut sides {
            run += 1;
            let stream = format!("forward-{run}");
            // Every write synced is slow on a disk: a tenth of the count.
            let count = if side.way == Way::Queued(SyncPolicy::EveryWrite) {
                (n / 10).max(100)
            } else {
                n
            };
            fill(&server, &stream, count);
            let sink = http_sink(&receiver, side.in_flight);
            let window = NonZeroUsize::new(side.in_flight).expect("at least one");
            let rate = match side.way {
                Way::Direct => forwarded_rate(
                    &conn,
                    &stream,
                    count,
                    (sink, side.in_flight),
                    &receiver,
                    future::pending(),
                ),
                Way::Queued(sync) => {
                    let (_dir, queued) = queue(sync);
                    let drained = queued.clone();
                    forwarded_rate(
                        &conn,
                        &stream,
                        count,
                        (queued, side.in_flight),
                        &receiver,
                        async move { forward(&drained, &*sink, &policy, window, |_| true).await },
                    )
                }
                Way::HttpAlone => http_alone(&*sink, count, side.in_flight, &receiver),
                Way::Drain => {
                    // The outage: everything queued, nothing forwarded,
                    // then the drain alone.
                    let (_dir, queued) = queue(SyncPolicy::Every(Duration::from_millis(100)));
                    drain_rate(
                        &conn,
                        &stream,
                        count,
                        &queued,
                        (&*sink, window),
                        &policy,
                        &receiver,
                    )
                }
            };
            side.best = side.best.max(rate);
        }
    }
    println!(
        "forwarding a Redis Stream to a local HTTP receiver, {n} entries (every write: {}):",
        (n / 10).max(100)
    );
    println!("{:<42} {:>12} {:>10}", "side", "entries/s", "of direct");
    for group in sides.chunks(ways.len()) {
        let direct = group[0].best;
        for side in group {
            println!(
                "{:<42} {:>12.0} {:>10.2}",
                side.name,
                side.best,
                side.best / direct
            );
        }
    }
    if !smoke {
        for group in sides.chunks(ways.len()) {
            let (direct, queued) = (group[0].best, group[1].best);
            println!(
                "goal, {} in flight: queued >= 0.8 of direct ({}), >= 20,000/s ({})",
                group[0].in_flight,
                if queued >= 0.8 * direct {
                    "met"
                } else {
                    "NOT met"
                },
                if queued >= 20_000.0 { "met" } else { "NOT met" }
            );
        }
    }
}

/// `n` POSTs through the sink, `in_flight` loops at once, no stream, no
/// queue: what the sink carries to this receiver on this machine.
fn http_alone(sink: &dyn MessageSink, n: u64, in_flight: usize, receiver: &Receiver) -> f64 {
    let from = receiver.received();
    let payload = b"{\"reading\":1,\"device\":\"d1\"}";
    let next = AtomicU64::new(0);
    let started = Instant::now();
    let post_loop = || async {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            let id = format!("alone:{i}");
            let outgoing = Outgoing {
                id: &id,
                origin: "alone",
                fence: None,
                payload,
            };
            sink.send(&outgoing).await.expect("sent");
        }
    };
    smol::block_on(async {
        futures_util::future::join_all((0..in_flight).map(|_| post_loop())).await;
        reached(receiver, from, n).await;
    });
    n as f64 / started.elapsed().as_secs_f64()
}

/// Queues `stream`'s `n` entries with no forwarding (the receiver down),
/// then times the drain alone: entries per second.
fn drain_rate(
    conn: &RedisConnection,
    stream: &str,
    n: u64,
    queued: &Arc<QueuedSink>,
    (sink, window): (&dyn MessageSink, NonZeroUsize),
    policy: &RetryPolicy,
    receiver: &Receiver,
) -> f64 {
    let filled = async {
        while queued.queue().stats().pending < n {
            async_io::Timer::after(Duration::from_millis(1)).await;
        }
    };
    consume(conn, stream, queued.clone(), 1, filled, future::pending());
    let from = receiver.received();
    let started = Instant::now();
    smol::block_on(future::or(
        async {
            forward(queued, sink, policy, window, |_| true).await;
        },
        reached(receiver, from, n),
    ));
    n as f64 / started.elapsed().as_secs_f64()
}

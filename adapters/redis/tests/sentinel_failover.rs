//! A sentinel connection follows a failover while the old master still
//! answers: after `SENTINEL FAILOVER`, writes acknowledged by the old
//! master (which its resync then wipes) stop within [`FOLLOW_BOUND`] of
//! the replica's promotion, and later writes land on the new master; on
//! async-io and (with the `tokio` feature) on tokio, whose tasks then run
//! the watch.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use guard_redis::{RedisConnection, Topology};
use guard_testkit::{RedisSentinel, SENTINEL_SERVICE, thread_names};

/// How long after the promotion a write may still be acknowledged by the
/// old master: Sentinel confirms a promotion by its once-a-second `INFO`
/// of the promoted replica, then announces `+switch-master`; the rest is
/// headroom for a loaded machine.
const FOLLOW_BOUND: Duration = Duration::from_secs(2);

/// The writer keeps going this long after the promotion, so that a client
/// that does not follow is caught writing to the old master.
const WATCH_AFTER_PROMOTION: Duration = Duration::from_secs(4);

const WRITE_EVERY: Duration = Duration::from_millis(20);

/// What drives the connection's futures.
#[derive(Clone)]
enum Runtime {
    AsyncIo,
    #[cfg(feature = "tokio")]
    Tokio(Arc<tokio::runtime::Runtime>),
}

impl Runtime {
    fn block_on<F: Future>(&self, future: F) -> F::Output {
        match self {
            Runtime::AsyncIo => smol::block_on(future),
            #[cfg(feature = "tokio")]
            Runtime::Tokio(rt) => rt.block_on(future),
        }
    }
}

fn key(i: u64) -> String {
    format!("guard:test:follow:{i}")
}

/// Asks the sentinel to fail over, retrying while it has not yet vetted
/// the replica (`NOGOODSLAVE`).
fn fail_over(sentinel: &RedisSentinel) {
    let client = redis::Client::open(sentinel.sentinel_url()).expect("sentinel URL");
    let start = Instant::now();
    loop {
        let reply: redis::RedisResult<String> = client.get_connection().and_then(|mut c| {
            redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(SENTINEL_SERVICE)
                .query(&mut c)
        });
        match reply {
            Ok(_) => return,
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "SENTINEL FAILOVER still refused after 30 s: {e}"
                );
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// When `server` first reports itself master, polled every 2 ms (on a new
/// connection after an error: the promotion closes its clients').
fn promoted_at(server: &redis::Client) -> Instant {
    let start = Instant::now();
    let mut conn = None;
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the replica was not promoted within 30 s"
        );
        if conn.is_none() {
            conn = server.get_connection().ok();
        }
        if let Some(c) = conn.as_mut() {
            match redis::cmd("ROLE").query::<Vec<redis::Value>>(c) {
                Ok(role) => {
                    if matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
                        return Instant::now();
                    }
                }
                Err(_) => conn = None,
            }
        }
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn writes_follow_a_sentinel_failover_within_the_bound() {
    follows_a_failover(&Runtime::AsyncIo);
    // The watch ends with the connection (dropped with the writer).
    let start = Instant::now();
    while thread_names().iter().any(|n| n == "guard-sentinel") {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the sentinel watch thread outlived its connection"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(feature = "tokio")]
#[test]
fn writes_follow_a_sentinel_failover_within_the_bound_on_tokio() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    follows_a_failover(&Runtime::Tokio(Arc::new(rt)));
}

fn follows_a_failover(runtime: &Runtime) {
    let sentinel = RedisSentinel::start_with_replica().expect("redis sentinel with a replica");
    let conn = runtime
        .block_on(RedisConnection::connect(
            Topology::Sentinel {
                sentinels: vec![sentinel.sentinel_url()],
                service: SENTINEL_SERVICE.into(),
            },
            Duration::from_secs(1),
        ))
        .expect("connect through the sentinel");
    if matches!(runtime, Runtime::AsyncIo) {
        assert!(
            thread_names().iter().any(|n| n == "guard-sentinel"),
            "outside tokio the watch runs on a thread of its own"
        );
    }
    let replica = redis::Client::open(sentinel.replica().expect("a replica").url()).unwrap();

    // Writes a unique key every WRITE_EVERY; records when each was
    // acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let runtime = runtime.clone();
        thread::spawn(move || {
            let mut acked = Vec::new();
            let mut failed = 0u32;
            let mut i = 0u64;
            while !stop.load(Ordering::Acquire) {
                let set = redis::cmd("SET")
                    .arg(key(i))
                    .arg(i)
                    .arg("PX")
                    .arg(120_000)
                    .clone();
                match runtime.block_on(conn.query::<()>(&set)) {
                    Ok(()) => acked.push((i, Instant::now())),
                    Err(_) => failed += 1,
                }
                i += 1;
                thread::sleep(WRITE_EVERY);
            }
            (acked, failed)
        })
    };

    thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    fail_over(&sentinel);
    let promoted = promoted_at(&replica);
    thread::sleep(WATCH_AFTER_PROMOTION);
    stop.store(true, Ordering::Release);
    let (acked, failed) = writer.join().expect("the writer thread");

    // A write acknowledged but absent from the new master was taken by the
    // old one.
    let mut on_new = replica.get_connection().expect("connect to the new master");
    let mut lost_after_promotion: Option<Duration> = None;
    let mut landed_after_promotion = 0usize;
    for (i, at) in &acked {
        let exists: bool = redis::cmd("EXISTS")
            .arg(key(*i))
            .query(&mut on_new)
            .expect("EXISTS on the new master");
        if exists {
            landed_after_promotion += usize::from(*at > promoted);
        } else if let Some(late) = at.checked_duration_since(promoted) {
            lost_after_promotion = Some(lost_after_promotion.map_or(late, |l| l.max(late)));
        }
    }
    eprintln!(
        "promoted {:?} after SENTINEL FAILOVER; last write the old master acknowledged: {} after the promotion; {} writes acknowledged ({} on the new master after the promotion), {failed} failed",
        promoted - asked,
        lost_after_promotion.map_or("none".to_owned(), |l| format!("{l:?}")),
        acked.len(),
        landed_after_promotion,
    );
    assert!(
        lost_after_promotion.is_none_or(|late| late <= FOLLOW_BOUND),
        "the old master acknowledged a write {lost_after_promotion:?} after the promotion (bound {FOLLOW_BOUND:?})"
    );
    assert!(
        landed_after_promotion > 0,
        "no write reached the new master within {WATCH_AFTER_PROMOTION:?} of the promotion"
    );
}

/// A stand-in sentinel that takes subscriptions and answers every
/// command but `PING`, as a sentinel cut off without a closed connection
/// would after the subscription; counts the `SUBSCRIBE`s it got.
fn silent_sentinel() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    let subscribes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = subscribes.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let counted = counted.clone();
            thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
                let mut writer = stream.try_clone().expect("clone the stream");
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                // One request: `*<n>` then n bulk strings.
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    let n: usize = line.trim().trim_start_matches('*').parse().unwrap_or(0);
                    let mut args = Vec::with_capacity(n);
                    for _ in 0..n {
                        line.clear();
                        let _ = reader.read_line(&mut line);
                        line.clear();
                        let _ = reader.read_line(&mut line);
                        args.push(line.trim().to_ascii_uppercase());
                    }
                    line.clear();
                    let reply = match args.first().map(String::as_str) {
                        Some("PING") => continue,
                        Some("SUBSCRIBE") => {
                            counted.fetch_add(1, Ordering::AcqRel);
                            "*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n".to_owned()
                        }
                        _ => "+OK\r\n".to_owned(),
                    };
                    if writer.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, subscribes)
}

/// `total_connections_received` of a server's `INFO stats`.
fn connections_received(url: &str) -> u64 {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect to the sentinel");
    let info: String = redis::cmd("INFO").arg("stats").query(&mut conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_connections_received in INFO stats")
}

#[test]
fn a_sentinel_that_leaves_a_ping_unanswered_is_subscribed_to_again() {
    let sentinel = RedisSentinel::start().expect("redis sentinel");
    let (silent, subscribes) = silent_sentinel();
    let timeout = Duration::from_millis(500);
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Sentinel {
            sentinels: vec![sentinel.sentinel_url(), silent],
            service: SENTINEL_SERVICE.into(),
        },
        timeout,
    ))
    .expect("connect through the sentinels");
    let start = Instant::now();
    while subscribes.load(Ordering::Acquire) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no new subscription within 5 s of one whose PING went unanswered"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // The sentinel that answers keeps its one subscription: between two
    // INFOs (a connection each) no other connection reached it.
    let before = connections_received(&sentinel.sentinel_url());
    thread::sleep(Duration::from_secs(3));
    let after = connections_received(&sentinel.sentinel_url());
    assert_eq!(
        after,
        before + 1,
        "connections to the answering sentinel while idle"
    );
    let pong: String = smol::block_on(conn.query(&redis::cmd("PING"))).expect("PING the master");
    assert_eq!(pong, "PONG");
}

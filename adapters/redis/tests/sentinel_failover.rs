//! A sentinel connection follows a failover while the old master still
//! answers: after `SENTINEL FAILOVER`, writes acknowledged by the old
//! master (which its resync then wipes) stop within [`FOLLOW_BOUND`] of
//! the replica's promotion, and later writes land on the new master.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use guard_redis::{RedisConnection, Topology};
use guard_testkit::{RedisSentinel, SENTINEL_SERVICE};

/// How long after the promotion a write may still be acknowledged by the
/// old master: Sentinel confirms a promotion by its once-a-second `INFO`
/// of the promoted replica, then announces `+switch-master`; the rest is
/// headroom for a loaded machine.
const FOLLOW_BOUND: Duration = Duration::from_secs(2);

/// The writer keeps going this long after the promotion, so that a client
/// that does not follow is caught writing to the old master.
const WATCH_AFTER_PROMOTION: Duration = Duration::from_secs(4);

const WRITE_EVERY: Duration = Duration::from_millis(20);

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
    let sentinel = RedisSentinel::start_with_replica().expect("redis sentinel with a replica");
    let conn = smol::block_on(RedisConnection::connect(
        Topology::Sentinel {
            sentinels: vec![sentinel.sentinel_url()],
            service: SENTINEL_SERVICE.into(),
        },
        Duration::from_secs(1),
    ))
    .expect("connect through the sentinel");
    let replica = redis::Client::open(sentinel.replica().expect("a replica").url()).unwrap();

    // Writes a unique key every WRITE_EVERY; records when each was
    // acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
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
                match smol::block_on(conn.query::<()>(&set)) {
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

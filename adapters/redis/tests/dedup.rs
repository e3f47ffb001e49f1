#![recursion_limit = "256"]
//! Redis deduplicators: semantics, and atomicity across concurrent
//! clients (each with its own connection, as separate processes).

use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use guard_core::dedup::BloomParams;
use guard_core::time::Instant;
use guard_redis::{
    Clock, RedisBloomDeduplicator, RedisConnection, RedisSetDeduplicator,
    RedisWindowedDeduplicator, Topology,
};
use guard_testkit::RedisServer;

fn connect(server: &RedisServer) -> RedisConnection {
    smol::block_on(RedisConnection::connect(
        Topology::Standalone { url: server.url() },
        Duration::from_secs(2),
    ))
    .expect("connect")
}

fn at(ms: u64) -> Clock {
    Clock::Caller(Instant::from_millis(ms))
}

#[test]
fn the_set_remembers_from_first_sight_for_its_ttl() {
    let server = RedisServer::start().expect("redis-server");
    let forever = RedisSetDeduplicator::new(connect(&server), "guard:dd", "forever", None).unwrap();
    smol::block_on(async {
        assert!(!forever.check_and_mark("x", at(1_000)).await.unwrap());
        assert!(
            forever
                .check_and_mark("x", at(1_000_000_000))
                .await
                .unwrap()
        );
        assert!(forever.is_duplicate("x", at(2_000)).await.unwrap());
        assert_eq!(forever.unique_count(at(2_000)).await.unwrap(), 1);
    });
    let hour = RedisSetDeduplicator::new(
        connect(&server),
        "guard:dd",
        "hour",
        Some(Duration::from_secs(3_600)),
    )
    .unwrap();
    smol::block_on(async {
        assert!(!hour.check_and_mark("x", at(0)).await.unwrap());
        // A sighting inside the TTL does not extend it (first sight counts).
        assert!(hour.check_and_mark("x", at(3_599_000)).await.unwrap());
        assert!(
            !hour.check_and_mark("x", at(3_600_000)).await.unwrap(),
            "forgotten an hour after first sight"
        );
        hour.clear().await.unwrap();
        assert_eq!(hour.unique_count(at(3_600_000)).await.unwrap(), 0);
    });
}

#[test]
fn the_windowed_deduplicator_refreshes_on_sight_with_an_open_boundary() {
    let server = RedisServer::start().expect("redis-server");
    let d = RedisWindowedDeduplicator::new(
        connect(&server),
        "guard:dd",
        "win",
        Duration::from_secs(30),
    )
    .unwrap();
    smol::block_on(async {
        assert!(!d.check_and_mark("a", at(0)).await.unwrap());
        assert!(d.check_and_mark("a", at(20_000)).await.unwrap());
        assert!(
            d.is_duplicate("a", at(49_999)).await.unwrap(),
            "the window restarted at 20 s"
        );
        assert!(
            !d.is_duplicate("a", at(50_000)).await.unwrap(),
            "exactly window old: not a duplicate"
        );
        // A backwards clock does not move last-seen back.
        assert!(d.check_and_mark("a", at(10_000)).await.unwrap());
        assert!(d.is_duplicate("a", at(49_999)).await.unwrap());
    });
    let ttl: i64 = server
        .command(&format!("PTTL {}", d.redis_key()))
        .unwrap()
        .trim_start_matches(':')
        .trim()
        .parse()
        .unwrap();
    assert!(
        (29_000..=91_000).contains(&ttl),
        "backstop TTL {ttl} ms lies in [29 s, 91 s] for a 30 s window"
    );
}

#[test]
fn an_item_expires_while_traffic_on_others_continues() {
    let server = RedisServer::start().expect("redis-server");
    let d = RedisWindowedDeduplicator::new(
        connect(&server),
        "guard:dd",
        "traffic",
        Duration::from_millis(300),
    )
    .unwrap();
    smol::block_on(async {
        d.mark_as_seen("A", at(0)).await.unwrap();
        for i in 1..=70u64 {
            d.mark_as_seen(&format!("k{}", i % 7), at(i * 10))
                .await
                .unwrap();
        }
        assert!(!d.is_duplicate("A", at(700)).await.unwrap(), "A expired");
        assert!(d.unique_count(at(700)).await.unwrap() <= 8);
    });
}

#[test]
fn the_bloom_filter_has_no_false_negatives_and_a_shared_count() {
    let server = RedisServer::start().expect("redis-server");
    let params = BloomParams::for_capacity(1_000, 0.01).unwrap();
    let a = RedisBloomDeduplicator::new(connect(&server), "guard:bf", "orders", params).unwrap();
    let b = RedisBloomDeduplicator::new(connect(&server), "guard:bf", "orders", params).unwrap();
    smol::block_on(async {
        let mut new = 0;
        for i in 0..500 {
            new += usize::from(
                !a.check_and_mark(format!("order-{i}").as_bytes())
                    .await
                    .unwrap(),
            );
        }
        assert!(
            new >= 490,
            "{new} of 500 distinct orders were new (the rest: false positives)"
        );
        for i in 0..500 {
            assert!(
                b.is_duplicate(format!("order-{i}").as_bytes())
                    .await
                    .unwrap(),
                "another process sees it"
            );
        }
        let count = b.unique_count().await.unwrap();
        assert!((490..=500).contains(&count), "{count}");
        let false_positives = {
            let mut n = 0;
            for i in 0..2_000 {
                n += usize::from(
                    a.is_duplicate(format!("other-{i}").as_bytes())
                        .await
                        .unwrap(),
                );
            }
            n
        };
        assert!(
            false_positives < 60,
            "{false_positives} false positives in 2,000"
        );
        a.clear().await.unwrap();
        assert!(!b.is_duplicate(b"order-1").await.unwrap());
        assert_eq!(b.unique_count().await.unwrap(), 0);
    });
    assert!(RedisBloomDeduplicator::new(connect(&server), "p", "{bad}", params).is_err());
    assert!(RedisSetDeduplicator::new(connect(&server), "p", "", None).is_err());
    assert!(RedisWindowedDeduplicator::new(connect(&server), "p", "w", Duration::ZERO).is_err());
}

/// Eight clients race over the same 200 elements: exactly one of them sees
/// each element as new.
#[test]
fn check_and_mark_is_atomic_across_eight_clients() {
    let server = RedisServer::start().expect("redis-server");
    let params = BloomParams::for_capacity(10_000, 0.001).unwrap();
    let start = Barrier::new(8);
    let news: Vec<[usize; 3]> = thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let conn = connect(&server);
                let start = &start;
                s.spawn(move || {
                    let set = RedisSetDeduplicator::new(conn.clone(), "race", "set", None).unwrap();
                    let win = RedisWindowedDeduplicator::new(
                        conn.clone(),
                        "race",
                        "win",
                        Duration::from_secs(60),
                    )
                    .unwrap();
                    let bloom = RedisBloomDeduplicator::new(conn, "race", "bloom", params).unwrap();
                    start.wait();
                    smol::block_on(async {
                        let mut new = [0; 3];
                        for i in 0..200 {
                            let item = format!("e{i}");
                            new[0] += usize::from(
                                !set.check_and_mark(&item, Clock::Server).await.unwrap(),
                            );
                            new[1] += usize::from(
                                !win.check_and_mark(&item, Clock::Server).await.unwrap(),
                            );
                            new[2] +=
                                usize::from(!bloom.check_and_mark(item.as_bytes()).await.unwrap());
                        }
                        new
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (kind, i) in [("set", 0), ("windowed", 1), ("bloom", 2)] {
        let total: usize = news.iter().map(|n| n[i]).sum();
        assert_eq!(
            total, 200,
            "{kind}: exactly one client saw each element as new"
        );
    }
}

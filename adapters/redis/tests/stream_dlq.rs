//! The stream dead-letter queue against a real server and a cluster.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use guard_redis::{DeadLetter, RedisConnection, ReplayOutcome, Retention, StreamDlq, Topology};
use guard_testkit::{RedisCluster, RedisServer};

fn connect(topology: Topology) -> RedisConnection {
    smol::block_on(RedisConnection::connect(topology, Duration::from_secs(2))).expect("connect")
}

fn letter<'a>(payload: &'a [u8], origin: Option<&'a str>) -> DeadLetter<'a> {
    DeadLetter {
        payload,
        error: "handler failed",
        attempts: 4,
        origin_stream: origin,
        origin_id: Some("1-1"),
        fields: &[],
    }
}

#[test]
fn send_range_size_delete_and_purge() {
    let server = RedisServer::start().expect("redis-server");
    let dlq = StreamDlq::new(connect(Topology::Standalone { url: server.url() }));
    smol::block_on(async {
        let first = dlq
            .send("orders", &letter(b"\x00binary\xff", None))
            .await
            .unwrap();
        let second = dlq
            .send(
                "orders",
                &DeadLetter {
                    payload: b"p2",
                    error: "",
                    attempts: 1,
                    origin_stream: None,
                    origin_id: None,
                    fields: &[],
                },
            )
            .await
            .unwrap();
        assert_eq!(dlq.size("orders").await.unwrap(), 2);
        let entries = dlq.range("orders", "-", 10).await.unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].id, first);
        assert_eq!(entries[0].payload, b"\x00binary\xff", "binary-safe");
        assert_eq!(
            (entries[0].error.as_str(), entries[0].attempts),
            ("handler failed", 4)
        );
        assert_eq!(entries[0].origin_id.as_deref(), Some("1-1"));
        assert!(entries[0].failed_at_ms > 1_700_000_000_000);
        assert_eq!(entries[1].error, "Unknown error");
        assert_eq!(entries[1].origin_id, None, "absent fields are not written");
        assert!(dlq.range("orders", "-", 0).await.unwrap().is_empty());
        assert!(dlq.delete("orders", &second).await.unwrap());
        assert!(!dlq.delete("orders", &second).await.unwrap());
        assert_eq!(dlq.size("orders").await.unwrap(), 1);
        assert_eq!(dlq.purge("orders").await.unwrap(), 1);
        assert_eq!(dlq.size("orders").await.unwrap(), 0);
    });
    assert!(dlq.stream_key("").is_err());
    assert!(dlq.stream_key("a{b}").is_err());
    assert_eq!(
        dlq.stream_key("a:b").unwrap(),
        "stream:topic:{a:b}:dlq",
        "colons in topics are kept"
    );
}

#[test]
fn list_topics_scans_only_dead_letter_streams() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let dlq = StreamDlq::new(conn.clone());
    smol::block_on(async {
        for topic in ["orders", "payments", "a:b"] {
            dlq.send(topic, &letter(b"x", None)).await.unwrap();
        }
        // Decoys: a partition stream, a control key ending in :dlq, another prefix.
        let _: String = conn
            .query(
                redis::cmd("XADD")
                    .arg("stream:topic:{orders}:p:0")
                    .arg("*")
                    .arg("f")
                    .arg("v"),
            )
            .await
            .unwrap();
        let _: String = conn
            .query(redis::cmd("SET").arg("stream:topic:{lease}:dlq").arg("v"))
            .await
            .unwrap();
        let other = StreamDlq::new(conn.clone()).with_prefix("other").unwrap();
        other.send("orders", &letter(b"x", None)).await.unwrap();
        assert_eq!(
            dlq.list_topics().await.unwrap(),
            ["a:b", "orders", "payments"]
        );
        assert_eq!(other.list_topics().await.unwrap(), ["orders"]);
    });
}

#[test]
fn replay_to_the_origin_stream_delivers_once() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let dlq = StreamDlq::new(conn.clone());
    let origin = "stream:topic:{orders}:p:0";
    smol::block_on(async {
        let id = dlq
            .send("orders", &letter(b"order-7", Some(origin)))
            .await
            .unwrap();
        let replayed = dlq.replay_to_origin("orders", &id).await.unwrap();
        assert!(
            matches!(replayed, ReplayOutcome::Replayed(Some(_))),
            "{replayed:?}"
        );
        assert_eq!(
            dlq.replay_to_origin("orders", &id).await.unwrap(),
            ReplayOutcome::AlreadyReplayed
        );
        let len: u64 = conn.query(redis::cmd("XLEN").arg(origin)).await.unwrap();
        assert_eq!(len, 1, "delivered once");
        assert!(dlq.is_replayed("orders", &id).await.unwrap());
        assert_eq!(
            dlq.replay_to_origin("orders", "9-9").await.unwrap(),
            ReplayOutcome::Missing
        );
        let no_origin = dlq.send("orders", &letter(b"x", None)).await.unwrap();
        assert_eq!(
            dlq.replay_to_origin("orders", &no_origin).await.unwrap(),
            ReplayOutcome::NoOrigin
        );
    });
}

#[test]
fn replay_to_a_handler_delivers_once_even_when_two_replay_at_once() {
    let server = RedisServer::start().expect("redis-server");
    let dlq = StreamDlq::new(connect(Topology::Standalone { url: server.url() }));
    let id = smol::block_on(dlq.send("orders", &letter(b"order-9", None))).unwrap();
    // A failing handler leaves the entry replayable.
    let failed = smol::block_on(
        dlq.replay_with("orders", &id, |_| async { Err::<(), _>("downstream down") }),
    )
    .unwrap();
    assert_eq!(failed, Err("downstream down"));
    let delivered = AtomicUsize::new(0);
    thread::scope(|s| {
        for _ in 0..2 {
            let conn = connect(Topology::Standalone { url: server.url() });
            let (id, delivered) = (&id, &delivered);
            s.spawn(move || {
                let dlq = StreamDlq::new(conn);
                for _ in 0..3 {
                    let _ = smol::block_on(dlq.replay_with("orders", id, |entry| async move {
                        assert_eq!(entry.payload, b"order-9");
                        delivered.fetch_add(1, Ordering::SeqCst);
                        async_io::Timer::after(Duration::from_millis(50)).await;
                        Ok::<(), ()>(())
                    }));
                }
            });
        }
    });
    assert_eq!(
        delivered.load(Ordering::SeqCst),
        1,
        "delivered exactly once"
    );
    assert_eq!(
        smol::block_on(dlq.replay_with("orders", &id, |_| async { Ok::<(), ()>(()) })).unwrap(),
        Ok(ReplayOutcome::AlreadyReplayed)
    );
}

#[test]
fn retention_by_length_and_by_age() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    let by_len = StreamDlq::new(conn.clone()).with_retention(Retention::MaxLen(3));
    smol::block_on(async {
        let mut ids = vec![];
        for i in 0..5u8 {
            ids.push(
                by_len
                    .send("t", &letter(&[i], Some("stream:topic:{t}:p:0")))
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(by_len.size("t").await.unwrap(), 3);
        let kept: Vec<_> = by_len
            .range("t", "-", 10)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.payload[0])
            .collect();
        assert_eq!(kept, [2, 3, 4], "the oldest go first");
    });
    let by_age = StreamDlq::new(conn)
        .with_prefix("aged")
        .unwrap()
        .with_retention(Retention::MaxAge(Duration::from_millis(200)));
    smol::block_on(async {
        by_age.send("t", &letter(b"old", None)).await.unwrap();
        async_io::Timer::after(Duration::from_millis(300)).await;
        by_age.send("t", &letter(b"new", None)).await.unwrap();
        let kept: Vec<_> = by_age
            .range("t", "-", 10)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.payload)
            .collect();
        assert_eq!(kept, [b"new".to_vec()]);
    });
}

#[test]
fn a_cluster_keeps_each_topic_in_one_slot_and_lists_every_master() {
    let cluster = RedisCluster::start().expect("redis cluster");
    let dlq = StreamDlq::new(connect(Topology::Cluster {
        nodes: cluster.urls(),
    }));
    let topics: Vec<String> = (0..12).map(|i| format!("topic{i}")).collect();
    smol::block_on(async {
        for topic in &topics {
            let origin = format!("stream:topic:{{{topic}}}:p:0");
            let id = dlq.send(topic, &letter(b"x", Some(&origin))).await.unwrap();
            assert!(matches!(
                dlq.replay_to_origin(topic, &id).await.unwrap(),
                ReplayOutcome::Replayed(_)
            ));
        }
        let mut listed = dlq.list_topics().await.unwrap();
        listed.sort();
        let mut expected = topics.clone();
        expected.sort();
        assert_eq!(listed, expected, "topics on all three masters");
    });
}

#[test]
fn replay_to_origin_crosses_cluster_slots_once_even_after_a_crash_between_its_steps() {
    let cluster = RedisCluster::start().expect("redis cluster");
    let conn = connect(Topology::Cluster {
        nodes: cluster.urls(),
    });
    let dlq = StreamDlq::new(conn.clone());
    smol::block_on(async {
        for i in 0..12 {
            // The normal case: the origin stream has no `{topic}` tag, so
            // it lives in another slot than the topic's keys.
            let (topic, origin) = ("failed-readings", format!("readings-{i}"));
            let id = dlq
                .send(topic, &letter(format!("r{i}").as_bytes(), Some(&origin)))
                .await
                .unwrap();
            let replayed = dlq.replay_to_origin(topic, &id).await.unwrap();
            assert!(
                matches!(replayed, ReplayOutcome::Replayed(Some(_))),
                "{origin}: {replayed:?}"
            );
            assert_eq!(
                dlq.replay_to_origin(topic, &id).await.unwrap(),
                ReplayOutcome::AlreadyReplayed
            );
            // A replay that died after appending and before recording:
            // the record is gone, the append is not repeated.
            let replayed_key = format!("{}:replayed", dlq.stream_key(topic).unwrap());
            let _: u64 = conn
                .query(redis::cmd("ZREM").arg(&replayed_key).arg(&id))
                .await
                .unwrap();
            assert!(!dlq.is_replayed(topic, &id).await.unwrap());
            assert_eq!(
                dlq.replay_to_origin(topic, &id).await.unwrap(),
                ReplayOutcome::AlreadyReplayed
            );
            assert!(dlq.is_replayed(topic, &id).await.unwrap(), "recorded now");
            let len: u64 = conn.query(redis::cmd("XLEN").arg(&origin)).await.unwrap();
            assert_eq!(len, 1, "{origin}: appended once");
        }
    });
}

#[test]
fn a_handler_replay_drops_only_its_own_claim_and_says_when_it_outlived_its_lease() {
    let server = RedisServer::start().expect("redis-server");
    let conn = connect(Topology::Standalone { url: server.url() });
    // A replays with a short lease; B and C with a long one.
    let dlq = StreamDlq::new(conn.clone()).with_replay_lease(Duration::from_millis(100));
    let patient = StreamDlq::new(conn).with_replay_lease(Duration::from_secs(5));
    let id = smol::block_on(dlq.send("orders", &letter(b"o", None))).unwrap();
    let sleep = |ms| async_io::Timer::after(Duration::from_millis(ms));
    smol::block_on(async {
        // A's handler outlives its lease and fails; B claims meanwhile.
        let a = dlq.replay_with("orders", &id, |_| async {
            sleep(300).await;
            Err::<(), _>("downstream down")
        });
        let b = async {
            sleep(150).await;
            patient
                .replay_with("orders", &id, |_| async {
                    sleep(400).await;
                    Ok::<(), &str>(())
                })
                .await
        };
        // After A failed, B's claim must still stand.
        let c = async {
            sleep(350).await;
            patient
                .replay_with("orders", &id, |_| async { Ok::<(), &str>(()) })
                .await
        };
        let (a, (b, c)) = futures_lite::future::zip(a, futures_lite::future::zip(b, c)).await;
        assert_eq!(a.unwrap(), Err("downstream down"));
        assert_eq!(
            c.unwrap(),
            Ok(ReplayOutcome::InProgress),
            "A's failure dropped B's claim"
        );
        assert_eq!(b.unwrap(), Ok(ReplayOutcome::Replayed(None)));
    });
    // A handler that outlives its lease is told so.
    let id = smol::block_on(dlq.send("orders", &letter(b"p", None))).unwrap();
    let late = smol::block_on(dlq.replay_with("orders", &id, |_| async {
        sleep(200).await;
        Ok::<(), ()>(())
    }));
    assert_eq!(late.unwrap(), Ok(ReplayOutcome::ReplayedAfterLease));
}

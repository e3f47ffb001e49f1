//! The binlog reader on a private MariaDB server (rows logged to its
//! binlog) started by each test on a free loopback port.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use async_compat::Compat;
use guard_core::guard::ActiveConfig;
use guard_core::lock::Ttl;
use guard_core::retry::{Classifier, Jitter, RetryPolicy};
use guard_endpoints::Parameter;
use guard_endpoints::mysql::{
    BinlogError, BinlogPosition, BinlogReader, BinlogStats, ChangeKind, CheckpointError,
};
use guard_smol::{RunHandle, control};
use guard_std::{GuardConfig, LocalLocker, SharedLocker};
use guard_testkit::mariadb::MariaDb;
use guard_testkit::{FaultyLocker, RenewFault};

/// Order id → (reader, fence) of each time it was handled.
type Seen = Arc<Mutex<BTreeMap<u32, Vec<(usize, u64)>>>>;

const TTL: Duration = Duration::from_millis(900);

fn wait_until(limit: Duration, done: impl FnMut() -> bool) -> bool {
    guard_testkit::wait_until("condition", limit, done).is_ok()
}

fn server() -> MariaDb {
    let server = MariaDb::start().expect("mariadbd");
    server
        .execute(
            "CREATE DATABASE app; CREATE TABLE app.orders (id INT PRIMARY KEY, item VARCHAR(32))",
        )
        .unwrap();
    server
}

fn reader(server: &MariaDb, config: &GuardConfig) -> BinlogReader {
    reader_at(&server.url("app"), config)
}

fn reader_at(url: &str, config: &GuardConfig) -> BinlogReader {
    let scope = config.scope("endpoint/binlog").unwrap();
    BinlogReader::new(url, "orders-cdc", config, &scope)
        .unwrap()
        .with_guard_settings(
            ActiveConfig::new()
                .with_ttl(Ttl::new(TTL).unwrap())
                .with_interval(TTL / 3),
        )
        .unwrap()
        .with_retry(RetryPolicy::fixed_delay(2, Duration::from_millis(10)))
        .unwrap()
}

/// Inserts orders `range`, each in a transaction of its own.
fn insert(server: &MariaDb, range: std::ops::Range<u32>, item: &str) {
    let sql: String = range
        .map(|id| format!("INSERT INTO app.orders VALUES ({id}, '{item}');"))
        .collect();
    server.execute(&sql).unwrap();
}

/// Runs `reader` as replica `id`; its handler records each insert and
/// fails on items named `poison`.
fn run(
    reader: BinlogReader,
    id: usize,
    seen: &Seen,
) -> (RunHandle, thread::JoinHandle<BinlogStats>) {
    let seen = seen.clone();
    let (handle, ctl) = control();
    let thread = thread::spawn(move || {
        smol::block_on(reader.run(ctl, Classifier::retry_all(), move |change| {
            let result = (|| {
                if change.kind != ChangeKind::Insert {
                    return Ok(());
                }
                let after = change.after.as_ref().ok_or("an insert without a row")?;
                let order: u32 = String::from_utf8_lossy(after[0].as_deref().unwrap_or_default())
                    .parse()
                    .map_err(|_| "not an id")?;
                seen.lock()
                    .unwrap()
                    .entry(order)
                    .or_default()
                    .push((id, change.fence));
                if after[1].as_deref() == Some(b"poison") {
                    return Err("cannot handle a poisoned order");
                }
                Ok(())
            })();
            std::future::ready(result)
        }))
    });
    (handle, thread)
}

fn stop(replica: (RunHandle, thread::JoinHandle<BinlogStats>)) -> BinlogStats {
    replica.0.stop();
    replica.1.join().unwrap()
}

/// Waits until some reader holds the checkpoint (it is reading).
fn wait_for_reader(server: &MariaDb) {
    assert!(
        wait_until(Duration::from_secs(10), || {
            server
                .execute("SELECT fence FROM app.guard_binlog_checkpoints WHERE name = 'orders-cdc'")
                .is_ok_and(|out| out.trim().parse::<u64>().is_ok_and(|f| f > 0))
        }),
        "no reader claimed the checkpoint"
    );
}

fn handled(seen: &Seen, range: std::ops::Range<u32>) -> bool {
    let seen = seen.lock().unwrap();
    range.clone().all(|id| seen.contains_key(&id))
}

#[test]
fn three_readers_one_leads_and_a_standby_resumes_from_the_checkpoint() {
    let server = server();
    let seen: Seen = Arc::default();
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let mut replicas: Vec<_> = (0..3)
        .map(|id| Some(run(reader(&server, &config), id, &seen)))
        .collect();
    wait_for_reader(&server);
    insert(&server, 0..50, "a");
    assert!(wait_until(Duration::from_secs(10), || handled(
        &seen,
        0..50
    )));
    let leaders: Vec<usize> = {
        let seen = seen.lock().unwrap();
        assert!(seen.values().all(|h| h.len() == 1), "{seen:?}");
        let mut ids: Vec<usize> = seen.values().map(|h| h[0].0).collect();
        ids.dedup();
        ids
    };
    assert_eq!(leaders.len(), 1, "one reader handles: {leaders:?}");
    let leader = leaders[0];
    let first_fence = seen.lock().unwrap()[&0][0].1;

    stop(replicas[leader].take().unwrap());
    insert(&server, 50..100, "b");
    assert!(wait_until(Duration::from_secs(10), || handled(
        &seen,
        50..100
    )));
    let seen = seen.lock().unwrap();
    // A checkpoint after every transaction: a takeover hands again at most
    // the one transaction the old leader was in.
    let twice: Vec<_> = seen.iter().filter(|(_, h)| h.len() > 1).collect();
    assert!(
        twice.len() <= 1,
        "handled again after the takeover: {twice:?}"
    );
    let (next, next_fence) = seen[&99][0];
    assert_ne!(next, leader);
    assert!(next_fence > first_fence);
    drop(seen);
    for replica in replicas.into_iter().flatten() {
        stop(replica);
    }
}

#[test]
fn a_reader_past_its_renew_deadline_hands_nothing_over() {
    for (renew, expect_all) in [(RenewFault::NeverAnswers, false), (RenewFault::None, true)] {
        let server = server();
        let config = FaultyLocker::new(LocalLocker::new(), renew, false).config();
        let reader = reader(&server, &config);
        let calls = Arc::new(Mutex::new(Vec::<(u32, u64)>::new()));
        let recorded = calls.clone();
        let (handle, ctl) = control();
        let thread = thread::spawn(move || {
            smol::block_on(reader.run(ctl, Classifier::retry_all(), move |change| {
                let id: u32 = String::from_utf8_lossy(
                    change.after.expect("an insert")[0]
                        .as_deref()
                        .unwrap_or_default(),
                )
                .parse()
                .expect("an order id");
                let first = recorded.lock().unwrap().is_empty();
                recorded.lock().unwrap().push((id, change.fence));
                if first {
                    // The replica stalls for twice the lease while
                    // changes arrive on its stream.
                    thread::sleep(TTL * 2);
                }
                std::future::ready(Ok::<(), String>(()))
            }))
        });
        wait_for_reader(&server);
        // One transaction of eleven rows: the first stalls the replica,
        // the other ten are decoded and waiting when it wakes.
        let values: Vec<String> = (0..11).map(|id| format!("({id}, 'a')")).collect();
        server
            .execute(&format!(
                "INSERT INTO app.orders VALUES {}",
                values.join(",")
            ))
            .unwrap();
        assert!(wait_until(Duration::from_secs(5), || !calls
            .lock()
            .unwrap()
            .is_empty()));
        thread::sleep(TTL * 3);
        handle.stop();
        let stats = thread.join().unwrap();
        // Under the lease the stall began in: once it has been given up,
        // the replica may lead again and read the transaction again under
        // a new fence, which is not late.
        let calls = calls.lock().unwrap().clone();
        let stalled_under = calls[0].1;
        let late = calls
            .iter()
            .filter(|(id, fence)| *id > 0 && *fence == stalled_under)
            .count();
        if expect_all {
            assert_eq!(late, 10, "{stats:?}");
        } else {
            assert_eq!(late, 0, "handled past the renew deadline: {stats:?}");
            assert_eq!(stats.refused_late, 1, "{stats:?}");
        }
    }
}

#[test]
fn a_checkpoint_under_an_older_fence_is_refused() {
    let server = server();
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let reader = reader(&server, &config);
    let checkpoints = reader.checkpoints().clone();
    let url = server.url("app");
    futures_lite::future::block_on(Compat::new(async {
        let mut conn = mysql_async::Conn::new(
            mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(&url).unwrap())
                .client_found_rows(true),
        )
        .await
        .unwrap();
        checkpoints.create(&mut conn).await.unwrap();
        let lease = "redis guard:active:cdc";
        assert_eq!(
            checkpoints.claim(&mut conn, "cdc", lease, 5).await.unwrap(),
            None
        );
        let at = |pos| BinlogPosition {
            file: "binlog.000001".into(),
            pos,
        };
        checkpoints
            .save(&mut conn, "cdc", &at(100), lease, 7)
            .await
            .unwrap();
        // The same position again is not a refusal.
        checkpoints
            .save(&mut conn, "cdc", &at(100), lease, 7)
            .await
            .unwrap();
        let stale = checkpoints.save(&mut conn, "cdc", &at(200), lease, 6).await;
        assert!(
            matches!(stale, Err(CheckpointError::Stale { fence: 6 })),
            "{stale:?}"
        );
        let stale = checkpoints.claim(&mut conn, "cdc", lease, 6).await;
        assert!(
            matches!(stale, Err(CheckpointError::Stale { .. })),
            "{stale:?}"
        );
        assert_eq!(
            checkpoints.claim(&mut conn, "cdc", lease, 8).await.unwrap(),
            Some(at(100))
        );
    }));

    // A leading reader whose checkpoint a newer fence took over (a
    // leader it does not know of) stops at its next checkpoint and cannot
    // lead again under its older fences.
    let seen: Seen = Arc::default();
    let leader = run(reader, 0, &seen);
    wait_for_reader(&server);
    insert(&server, 0..1, "a");
    assert!(wait_until(Duration::from_secs(5), || handled(&seen, 0..1)));
    server
        .execute("UPDATE app.guard_binlog_checkpoints SET fence = fence + 1000 WHERE name = 'orders-cdc'")
        .unwrap();
    insert(&server, 1..3, "b");
    thread::sleep(Duration::from_millis(1_500));
    let stats = stop(leader);
    assert_eq!(stats.checkpoints_refused, 1, "{stats:?}");
    // It handed over the change before the refused checkpoint, and
    // nothing after it.
    assert!(!handled(&seen, 2..3), "{:?}", seen.lock().unwrap());
}

#[test]
fn a_checkpoint_changes_lease_on_a_claim_and_refuses_the_old_lease_s_saves() {
    let server = server();
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let checkpoints = reader(&server, &config).checkpoints().clone();
    let url = server.url("app");
    futures_lite::future::block_on(Compat::new(async {
        let mut conn = mysql_async::Conn::new(
            mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(&url).unwrap())
                .client_found_rows(true),
        )
        .await
        .unwrap();
        checkpoints.create(&mut conn).await.unwrap();
        let at = |pos| BinlogPosition {
            file: "binlog.000001".into(),
            pos,
        };
        // Redis's fences are microseconds since the epoch.
        let (redis, old) = ("redis guard:active:cdc", 1_700_000_000_000_000);
        assert_eq!(
            checkpoints
                .claim(&mut conn, "cdc", redis, old)
                .await
                .unwrap(),
            None
        );
        checkpoints
            .save(&mut conn, "cdc", &at(100), redis, old)
            .await
            .unwrap();
        // Moved to PostgreSQL, whose fences count from 1: taken over,
        // where the Redis reader left off.
        let postgres = "postgres:locks guard:active:cdc";
        assert_eq!(
            checkpoints
                .claim(&mut conn, "cdc", postgres, 3)
                .await
                .unwrap(),
            Some(at(100))
        );
        // A Redis reader that did not see the move, even with a newer
        // fence of its own, no longer saves.
        let stale = checkpoints
            .save(&mut conn, "cdc", &at(150), redis, old + 1)
            .await;
        assert!(
            matches!(stale, Err(CheckpointError::Stale { .. })),
            "{stale:?}"
        );
        // Within the new lease, fences order the readers again.
        checkpoints
            .save(&mut conn, "cdc", &at(200), postgres, 3)
            .await
            .unwrap();
        let stale = checkpoints
            .save(&mut conn, "cdc", &at(250), postgres, 2)
            .await;
        assert!(
            matches!(stale, Err(CheckpointError::Stale { fence: 2 })),
            "{stale:?}"
        );
        let stale = checkpoints.claim(&mut conn, "cdc", postgres, 2).await;
        assert!(
            matches!(stale, Err(CheckpointError::Stale { .. })),
            "{stale:?}"
        );
        assert_eq!(
            checkpoints
                .claim(&mut conn, "cdc", postgres, 4)
                .await
                .unwrap(),
            Some(at(200))
        );
    }));
}

#[test]
fn a_poisoned_change_is_dead_lettered_with_its_origin() {
    let server = server();
    let seen: Seen = Arc::default();
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let replica = run(reader(&server, &config), 0, &seen);
    wait_for_reader(&server);
    insert(&server, 7..8, "poison");
    insert(&server, 8..10, "fine");
    assert!(wait_until(Duration::from_secs(10), || handled(
        &seen,
        7..10
    )));
    assert_eq!(seen.lock().unwrap()[&7].len(), 3, "1 call + 2 retries");
    let letters = server
        .execute(
            "SELECT reader, file, pos > 0, row_index, db, tbl, kind, row_values, attempts, error \
             FROM app.guard_binlog_dead_letters",
        )
        .unwrap();
    let fields: Vec<&str> = letters.trim().split('\t').collect();
    assert_eq!(
        &fields[..9],
        &[
            "orders-cdc",
            "binlog.000001",
            "1",
            "0",
            "app",
            "orders",
            "insert",
            r#"["7","poison"]"#,
            "3"
        ],
        "{letters}"
    );
    assert!(
        fields[9].contains("cannot handle a poisoned order"),
        "{letters}"
    );
    let stats = stop(replica);
    assert_eq!(stats.dead_lettered, 1, "{stats:?}");
}

#[test]
fn checkpoints_are_taken_at_transaction_ends_only() {
    let server = server();
    let seen: Seen = Arc::default();
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let replica = run(reader(&server, &config), 0, &seen);
    wait_for_reader(&server);
    // Five transactions of three statements each: MariaDB logs a stand-in
    // query event (`# Dummy event ...`) for every statement's annotation.
    let transactions: String = (0..5)
        .map(|t| {
            let rows: String = (0..3)
                .map(|r| format!("INSERT INTO app.orders VALUES ({}, 'a');", t * 3 + r))
                .collect();
            format!("BEGIN;{rows}COMMIT;")
        })
        .collect();
    server.execute(&transactions).unwrap();
    assert!(wait_until(Duration::from_secs(10), || handled(
        &seen,
        0..15
    )));
    thread::sleep(Duration::from_millis(300));
    let stats = stop(replica);
    assert_eq!(stats.checkpoints, 5, "one a transaction: {stats:?}");
}

#[test]
fn the_reader_resumes_from_its_checkpoint_after_the_server_restarts() {
    let mut server = server();
    let seen: Seen = Arc::default();
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let replica = run(reader(&server, &config), 0, &seen);
    wait_for_reader(&server);
    insert(&server, 0..10, "a");
    assert!(wait_until(Duration::from_secs(10), || handled(
        &seen,
        0..10
    )));
    server.restart().expect("restart");
    insert(&server, 10..20, "b");
    assert!(
        wait_until(Duration::from_secs(20), || handled(&seen, 10..20)),
        "{:?}",
        seen.lock().unwrap().keys().collect::<Vec<_>>()
    );
    // Resumed from the checkpoint, not from the start: the documented
    // bound is the transaction in progress at the restart. Each insert is
    // a transaction of its own, and row 8's checkpoint is saved before row
    // 9 is read, so only row 9 (handled, its checkpoint perhaps not yet
    // saved when the server went down) may be handled again, once.
    let seen = seen.lock().unwrap();
    let twice: Vec<_> = seen.iter().filter(|(_, h)| h.len() > 1).collect();
    assert!(
        twice.iter().all(|(id, h)| **id == 9 && h.len() == 2),
        "handled again after the restart, beyond the transaction in progress: {twice:?}"
    );
    drop(seen);
    stop(replica);
}

#[test]
fn bad_parameters_are_refused_naming_the_parameter_the_value_and_the_rule() {
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let scope = config.scope("endpoint/binlog").unwrap();
    let invalid = |e: BinlogError| match e {
        BinlogError::InvalidInput(guard_endpoints::InvalidInput {
            parameter,
            value,
            rule,
            ..
        }) => (parameter, value, rule),
        other => panic!("{other}"),
    };
    let (parameter, value, _) =
        invalid(BinlogReader::new("postgres://x", "cdc", &config, &scope).unwrap_err());
    assert_eq!(
        (parameter, value.as_str()),
        (Parameter::ServerUrl, "postgres://x")
    );
    let (_, _, rule) =
        invalid(BinlogReader::new("mysql://root@h:3306", "cdc", &config, &scope).unwrap_err());
    assert!(rule.contains("must name a database"), "{rule}");
    let reader = BinlogReader::new("mysql://root@h:3306/app", "cdc", &config, &scope).unwrap();
    let (parameter, value, _) =
        invalid(reader.with_checkpoint_table("a; drop table x").unwrap_err());
    assert_eq!(
        (parameter, value.as_str()),
        (Parameter::Table, "a; drop table x")
    );
    let reader = BinlogReader::new("mysql://root@h:3306/app", "cdc", &config, &scope).unwrap();
    let (parameter, _, _) = invalid(
        reader
            .with_retry(RetryPolicy::new().with_jitter(Jitter::Full))
            .unwrap_err(),
    );
    assert_eq!(parameter, Parameter::RetryPolicy);
    let reader = BinlogReader::new("mysql://root@h:3306/app", "cdc", &config, &scope).unwrap();
    let (parameter, _, _) = invalid(reader.with_checkpoint_every(0).unwrap_err());
    assert_eq!(parameter, Parameter::Checkpoint);
    for bad in ["", "a\nb"] {
        let reader = BinlogReader::new("mysql://root@h:3306/app", "cdc", &config, &scope).unwrap();
        let (parameter, _, _) = invalid(reader.with_lock_service(bad).unwrap_err());
        assert_eq!(parameter, Parameter::LockService);
    }
    let reader = BinlogReader::new("mysql://root@h:3306/app", "cdc", &config, &scope).unwrap();
    let (parameter, _, rule) = invalid(reader.with_request_timeout(Duration::ZERO).unwrap_err());
    assert_eq!(parameter, Parameter::RequestTimeout);
    assert!(rule.contains("more than zero"), "{rule}");
    for bad in [Duration::ZERO, Duration::from_secs(3_601)] {
        let reader = BinlogReader::new("mysql://root@h:3306/app", "cdc", &config, &scope).unwrap();
        let (parameter, _, _) = invalid(reader.with_heartbeat(bad).unwrap_err());
        assert_eq!(parameter, Parameter::Heartbeat);
    }
    let reader = BinlogReader::new("mysql://root@h:3306/app", "cdc", &config, &scope)
        .unwrap()
        .with_heartbeat(Duration::from_millis(500))
        .unwrap();
    assert_eq!(reader.read_timeout(), Duration::from_millis(1_500));
}

#[test]
fn a_password_never_shows_in_a_refused_url_or_the_reader_s_debug() {
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let scope = config.scope("endpoint/binlog").unwrap();
    for url in [
        // No database.
        "mysql://root:TopSecret42@db.example:3306",
        // Not a MySQL URL.
        "postgres://root:TopSecret42@db.example:3306/app",
        // A password with a raw '/' (the authority seems to end inside it).
        "mysql://root:Top/Secret42@db.example:3306",
    ] {
        let err = BinlogReader::new(url, "cdc", &config, &scope).unwrap_err();
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains("Secret42"), "{text}");
            assert!(text.contains("root:***@db.example:3306"), "{text}");
        }
    }
    let reader = BinlogReader::new(
        "mysql://root:TopSecret42@db.example:3306/app",
        "cdc",
        &config,
        &scope,
    )
    .unwrap();
    let debug = format!("{reader:?}");
    assert!(!debug.contains("TopSecret42"), "{debug}");
    assert!(debug.contains("root:***@db.example:3306/app"), "{debug}");
}

#[test]
fn a_checkpoint_fenced_by_another_lock_service_is_taken_over() {
    let server = server();
    // A checkpoint row of the schema without a lease column, kept
    // by a reader whose locker's fences are microseconds since the epoch
    // (Redis's), at the start of the first binlog.
    server
        .execute(
            "CREATE TABLE app.guard_binlog_checkpoints (name VARCHAR(191) PRIMARY KEY, \
             file VARCHAR(255) NOT NULL, pos BIGINT UNSIGNED NOT NULL, fence BIGINT UNSIGNED NOT NULL); \
             INSERT INTO app.guard_binlog_checkpoints VALUES ('orders-cdc', '', 4, 1700000000000000)",
        )
        .unwrap();
    // This reader's locker counts fences from 1.
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    let seen: Seen = Arc::default();
    let reader = reader(&server, &config).with_lock_service("local").unwrap();
    let lease = reader.checkpoint_lease();
    let leader = run(reader, 0, &seen);
    insert(&server, 0..3, "a");
    let kept = || {
        server
            .execute("SELECT lease FROM app.guard_binlog_checkpoints WHERE name = 'orders-cdc'")
            .unwrap_or_default()
    };
    // Each transaction's checkpoint follows its handling: the last may
    // still be on its way when every row was handled, so the test waits
    // for the checkpoint under the new lease rather than for a count.
    let all = wait_until(Duration::from_secs(10), || {
        handled(&seen, 0..3) && kept().trim() == lease
    });
    let stats = stop(leader);
    assert!(all, "{stats:?} {:?} {:?}", seen.lock().unwrap(), kept());
    assert!(stats.checkpoints >= 1, "{stats:?}");
    assert_eq!(stats.checkpoints_refused, 0, "{stats:?}");
    assert_eq!(kept().trim(), lease, "kept under its lease");
    assert!(lease.starts_with("local "), "{lease}");
}

#[test]
fn a_reader_whose_connections_go_silent_steps_down_and_resumes_from_the_checkpoint() {
    let server = server();
    let proxy = SilentProxy::start(server.port());
    let seen: Seen = Arc::default();
    let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
    // Requests wait at most 2 s; heartbeats every second (the default):
    // a dead stream is noticed after 3 s.
    let reader = reader_at(&proxy.url("app"), &config)
        .with_request_timeout(Duration::from_secs(2))
        .unwrap();
    assert_eq!(reader.read_timeout(), Duration::from_secs(3));
    let replica = run(reader, 0, &seen);
    wait_for_reader(&server);
    insert(&server, 0..5, "a");
    assert!(wait_until(Duration::from_secs(10), || handled(&seen, 0..5)));
    // An idle stream is not taken for a dead one: the server's heartbeats
    // arrive in the meantime.
    thread::sleep(Duration::from_secs(7));
    insert(&server, 5..10, "b");
    assert!(wait_until(Duration::from_secs(10), || handled(
        &seen,
        5..10
    )));
    let fence = seen.lock().unwrap()[&0][0].1;
    assert!(
        seen.lock().unwrap().values().all(|h| h == &[(0, fence)]),
        "one stream, under one fence: {:?}",
        seen.lock().unwrap()
    );

    // Every connection goes silent, the reader's stream and its new
    // connections alike, for longer than the read timeout (3 heartbeats)
    // and the request timeout; then the network heals, but the reader's
    // connections stay dead.
    proxy.partition();
    thread::sleep(Duration::from_secs(6));
    proxy.heal();
    insert(&server, 10..20, "c");
    let resumed = wait_until(Duration::from_secs(40), || handled(&seen, 10..20));
    let stats = stop(replica);
    let seen = seen.lock().unwrap();
    assert!(resumed, "the reader never came back: {stats:?} {seen:?}");
    // It stepped down and led again, under a new fence, from its
    // checkpoint: nothing read before the partition is handed again.
    assert!(
        (10..20).all(|id| seen[&id].iter().all(|&(_, f)| f > fence)),
        "{seen:?}"
    );
    assert!((0..10).all(|id| seen[&id].len() == 1), "{seen:?}");
}

/// A TCP proxy to a server whose connections go silent on demand, as
/// when the server's host vanishes or the network partitions: a silent
/// connection forwards nothing either way and is never closed (no FIN,
/// no RST), so its peer learns nothing from its socket.
struct SilentProxy {
    port: u16,
    /// Connections accepted so far: each is numbered in turn.
    accepted: Arc<AtomicU64>,
    /// Connections numbered below this are silent for good.
    cut_below: Arc<AtomicU64>,
    /// While set, every connection is silent, new ones included.
    partitioned: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl SilentProxy {
    fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let proxy = SilentProxy {
            port,
            accepted: Arc::default(),
            cut_below: Arc::default(),
            partitioned: Arc::default(),
            stop: Arc::default(),
        };
        let (accepted, cut_below, partitioned, stop) = (
            proxy.accepted.clone(),
            proxy.cut_below.clone(),
            proxy.partitioned.clone(),
            proxy.stop.clone(),
        );
        thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    Err(_) => return,
                };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let number = accepted.fetch_add(1, Ordering::SeqCst);
                let silent = {
                    let (cut_below, partitioned) = (cut_below.clone(), partitioned.clone());
                    move || {
                        number < cut_below.load(Ordering::SeqCst)
                            || partitioned.load(Ordering::SeqCst)
                    }
                };
                let (client_out, server_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                for (from, to) in [(client, server_out), (server, client_out)] {
                    let (silent, stop) = (silent.clone(), stop.clone());
                    thread::spawn(move || pump(from, to, &silent, &stop));
                }
            }
        });
        proxy
    }

    /// `mysql://root@127.0.0.1:<proxy>/<database>`, over TCP only: a
    /// client that prefers the server's Unix socket would go round the
    /// proxy.
    fn url(&self, database: &str) -> String {
        format!(
            "mysql://root@127.0.0.1:{}/{database}?prefer_socket=false",
            self.port
        )
    }

    /// Every connection goes silent, new ones too, until
    /// [`heal`](Self::heal).
    fn partition(&self) {
        self.partitioned.store(true, Ordering::SeqCst);
    }

    /// New connections forward again; every one made so far stays silent
    /// for good (its peer must give it up by itself).
    fn heal(&self) {
        self.cut_below
            .store(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
        self.partitioned.store(false, Ordering::SeqCst);
    }
}

impl Drop for SilentProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either closes, dropping what a silent
/// connection reads and keeping both sockets open while it is silent.
fn pump(mut from: TcpStream, mut to: TcpStream, silent: &dyn Fn() -> bool, stop: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = [0_u8; 16 * 1024];
    while !stop.load(Ordering::SeqCst) {
        match from.read(&mut buf) {
            Ok(0) if silent() => thread::sleep(Duration::from_millis(50)),
            Ok(0) => break,
            Ok(_) if silent() => {}
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) if silent() => thread::sleep(Duration::from_millis(50)),
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

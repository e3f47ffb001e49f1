//! `PgLocker` on real PostgreSQL servers: a database unique to each test
//! on the machine's server (127.0.0.1:5432), and a private server for the
//! restart.

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use futures_lite::future;
use guard_core::guard::{FailPolicy, OnceGuard, OnceOutcome};
use guard_core::lock::{LeaseRenewer, Locker, Renewal, Scope, Ttl, UnlockError};
use guard_postgres::{PURGE_EVERY, PgLockError, PgLocker};
use guard_testkit::contract;
use guard_testkit::postgres::{MACHINE_HOST, MACHINE_PORT, PgDatabase, PgServer, SUPERUSER};

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

fn rows(db: &PgDatabase, table: &str) -> u64 {
    db.query(&format!("SELECT count(*) FROM \"{table}\""))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn the_locker_contract_holds() {
    let db = PgDatabase::create().expect("a database on the machine's PostgreSQL");
    let locker = PgLocker::new(&db.url()).unwrap();
    smol::block_on(contract::run_all(&locker, "pg", 16, |d| {
        async_io::Timer::after(d)
    }));
}

#[test]
fn a_lost_lease_row_is_granted_to_nobody_before_its_holder_s_deadline() {
    // The row deleted by hand mid-lease (an operator's DELETE): its grant
    // record, in `guard_locks_grants`, still holds the holder's deadline.
    let db = PgDatabase::create().unwrap();
    let locker = PgLocker::new(&db.url()).unwrap();
    smol::block_on(
        contract::a_lost_key_is_granted_to_nobody_before_its_deadline(
            &locker,
            "pg:lost",
            |key: &str| {
                let delete = format!("DELETE FROM guard_locks WHERE key = '{key}'");
                let db = &db;
                async move {
                    db.query(&delete).expect("the row deleted");
                }
            },
            async_io::Timer::after,
        ),
    );
}

#[test]
fn the_last_fence_told_is_never_below_a_granted_one() {
    let db = PgDatabase::create().unwrap();
    let locker = PgLocker::new(&db.url()).unwrap();
    smol::block_on(contract::last_fence_is_never_below_a_granted_one(
        &locker, "pg:last",
    ));
    // Once its row is purged, a key's last fence is the sequence's.
    db.query("DELETE FROM guard_locks").unwrap();
    let told = smol::block_on(guard_std::LastFence::last_fence(&locker, "pg:last")).unwrap();
    assert!(told.is_some_and(|f| f >= 2), "{told:?}");
}

#[test]
fn a_deployment_made_before_the_grant_records_gains_them_at_the_next_start() {
    let db = PgDatabase::create().unwrap();
    smol::block_on(PgLocker::new(&db.url()).unwrap().connect()).unwrap();
    db.query("DROP TABLE guard_locks_grants").unwrap();
    let locker = PgLocker::new(&db.url()).unwrap();
    smol::block_on(async {
        let held = locker.try_lock("k", ttl(60_000)).await.unwrap().unwrap();
        assert_eq!(locker.try_lock("k", ttl(60_000)).await.unwrap(), None);
        locker.unlock("k", &held).await.unwrap();
    });
    assert_eq!(
        rows(&db, "guard_locks_grants"),
        0,
        "a release forgets its record"
    );
}

#[test]
fn a_delivery_key_with_a_nul_runs_once_even_fail_open() {
    // A producer's message id holds a NUL, which PostgreSQL's text
    // refuses: the key codec writes it `%00`, so the claim is decided by
    // the lock, never by the fail-open policy meant for a failed backend.
    let db = PgDatabase::create().unwrap();
    let locker = PgLocker::new(&db.url()).unwrap();
    let guard = OnceGuard::new(Some(&locker), Scope::new("hooks").unwrap())
        .with_fail_policy(FailPolicy::FailOpen);
    smol::block_on(async {
        assert!(matches!(
            guard.allow("evt\0-1").await.unwrap(),
            OnceOutcome::Won { .. }
        ));
        for _ in 0..3 {
            assert_eq!(
                guard.allow("evt\0-1").await.unwrap(),
                OnceOutcome::AlreadyClaimed
            );
        }
        // Another key that differs only where the codec escapes.
        assert!(matches!(
            guard.allow("evt%00-1").await.unwrap(),
            OnceOutcome::Won { .. }
        ));
    });
}

#[test]
fn a_key_postgres_cannot_hold_is_invalid_input_behind_a_shared_handle_too() {
    let db = PgDatabase::create().unwrap();
    let locker = PgLocker::new(&db.url()).unwrap();
    let refused = smol::block_on(locker.try_lock("a\0b", ttl(1_000))).unwrap_err();
    assert!(PgLocker::is_invalid_input(&refused), "{refused}");
    let shared = guard_std::SharedLocker::new(locker);
    let refused = smol::block_on(shared.try_lock("a\0b", ttl(1_000))).unwrap_err();
    assert!(refused.is_invalid_input(), "{refused}");
}

#[test]
fn lockers_of_one_table_exclude_each_other_and_share_its_fences() {
    let db = PgDatabase::create().unwrap();
    let a = PgLocker::new(&db.url())
        .unwrap()
        .with_table("Shared")
        .unwrap();
    let b = PgLocker::new(&db.url())
        .unwrap()
        .with_table("Shared")
        .unwrap();
    smol::block_on(async {
        let first = a.try_lock("k", ttl(60_000)).await.unwrap().unwrap();
        assert_eq!(b.try_lock("k", ttl(60_000)).await.unwrap(), None);
        assert!(
            b.unlock("k", &first).await.is_ok(),
            "a token is the proof, whoever holds the locker"
        );
        let second = b.try_lock("k", ttl(60_000)).await.unwrap().unwrap();
        assert!(second.fence() > first.fence());
        // Another table is another namespace.
        let other = PgLocker::new(&db.url())
            .unwrap()
            .with_table("other")
            .unwrap();
        assert!(other.try_lock("k", ttl(60_000)).await.unwrap().is_some());
    });
    assert_eq!(rows(&db, "Shared"), 1);
}

#[test]
fn fences_keep_increasing_and_leases_survive_a_server_restart() {
    let mut server = PgServer::start().expect("a private PostgreSQL server");
    let locker = PgLocker::new(&server.url()).unwrap();
    let (held, before) = smol::block_on(async {
        let held = locker
            .try_lock("held", ttl(120_000))
            .await
            .unwrap()
            .unwrap();
        let mut last = held.fence();
        for _ in 0..50 {
            let t = locker
                .try_lock("churn", ttl(60_000))
                .await
                .unwrap()
                .unwrap();
            locker.unlock("churn", &t).await.unwrap();
            last = t.fence();
        }
        (held, last)
    });
    server.stop();
    server.start_again().expect("the server starts again");
    smol::block_on(async {
        // The first request after the restart opens a new connection.
        assert_eq!(
            locker.try_lock("held", ttl(60_000)).await.unwrap(),
            None,
            "a lease granted before the restart is still held"
        );
        assert_eq!(
            locker.renew("held", &held, ttl(60_000)).await.unwrap(),
            Renewal::Held
        );
        let after = locker
            .try_lock("churn", ttl(60_000))
            .await
            .unwrap()
            .unwrap();
        assert!(
            after.fence() > before,
            "fence {} after the restart, {before} before",
            after.fence()
        );
    });
}

#[test]
fn a_request_to_a_server_that_does_not_answer_times_out() {
    // Accepts connections and never says a word.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming().flatten() {
            held.push(stream);
        }
    });
    let locker = PgLocker::new(&format!("postgres://app@127.0.0.1:{port}/app"))
        .unwrap()
        .with_request_timeout(Duration::from_millis(300))
        .unwrap();
    let started = Instant::now();
    let err = smol::block_on(locker.try_lock("k", ttl(1_000))).unwrap_err();
    assert!(
        matches!(err, PgLockError::Timeout { .. }),
        "{err:?} after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() < Duration::from_secs(3), "{err}");
    let started = Instant::now();
    let err = smol::block_on(locker.connect()).unwrap_err();
    assert!(
        matches!(
            err,
            PgLockError::Timeout {
                statement: "connect",
                ..
            }
        ) && started.elapsed() < Duration::from_secs(3),
        "a start against a silent server ends within the timeout: {err:?} after {:?}",
        started.elapsed()
    );
    let err =
        smol::block_on(locker.unlock("k", &guard_core::lock::Token::new(Default::default(), 1)));
    assert!(
        matches!(err, Err(UnlockError::Backend(PgLockError::Timeout { .. }))),
        "{err:?}"
    );
}

#[test]
fn ended_leases_are_purged_after_their_grace() {
    let db = PgDatabase::create().unwrap();
    // Generous: the test judges what is purged, not how fast (a busy
    // machine took more than 100 ms for one acquire). The grace is at
    // least twice the timeout, the locker's own rule.
    const GRACE: Duration = Duration::from_secs(2);
    let locker = PgLocker::new(&db.url())
        .unwrap()
        .with_request_timeout(GRACE / 2)
        .unwrap()
        .with_purge_grace(GRACE)
        .unwrap();
    smol::block_on(async {
        for i in 0..10 {
            locker
                .try_lock(&format!("once:{i}"), ttl(1))
                .await
                .unwrap()
                .unwrap();
        }
        locker.try_lock("live", ttl(60_000)).await.unwrap().unwrap();
        let released = locker
            .try_lock("released", ttl(60_000))
            .await
            .unwrap()
            .unwrap();
        locker.unlock("released", &released).await.unwrap();
        assert_eq!(
            locker.purge_expired().await.unwrap(),
            0,
            "a row is kept for the grace after its lease ended"
        );
        async_io::Timer::after(GRACE + Duration::from_millis(200)).await;
        assert_eq!(
            locker.purge_expired().await.unwrap(),
            11 + 10,
            "ended and released leases go after the grace, the live one stays, \
             and so do the ended leases' grant records (the released one's went \
             with its release)"
        );
        assert_eq!(
            rows(&db, "guard_locks_grants"),
            1,
            "the live lease's record"
        );
        // The locker purges by itself: keys taken once, each for 1 ms.
        for i in 0..PURGE_EVERY {
            locker
                .try_lock(&format!("slot:{i}"), ttl(1))
                .await
                .unwrap()
                .unwrap();
        }
        async_io::Timer::after(GRACE + Duration::from_millis(200)).await;
        for i in 0..PURGE_EVERY {
            locker
                .try_lock(&format!("later:{i}"), ttl(1))
                .await
                .unwrap()
                .unwrap();
        }
    });
    for table in ["guard_locks", "guard_locks_grants"] {
        let left = rows(&db, table);
        assert!(
            left <= 2 * PURGE_EVERY + 1 - 1_000,
            "{table}: {left} rows after {} grants of 1 ms leases: a purge ran",
            2 * PURGE_EVERY
        );
    }
}

#[test]
fn a_grant_given_up_while_its_call_purges_leaves_the_key_free() {
    // Every purge waits for an advisory lock the test holds (a trigger on
    // the table's deletes), so the call that purges can be dropped while
    // its purge runs. Whatever it had done by then, the key must not be
    // held with its token nowhere: either it was not granted, or the
    // grant was returned.
    let db = PgDatabase::create().unwrap();
    // Far longer than the test waits: neither side's timeout ends the purge.
    let locker = PgLocker::new(&db.url())
        .unwrap()
        .with_request_timeout(Duration::from_secs(20))
        .unwrap();
    smol::block_on(locker.connect()).unwrap();
    db.query(
        "CREATE FUNCTION purge_gate() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_advisory_xact_lock(7001); RETURN NULL; END $$; \
         CREATE TRIGGER purge_gate BEFORE DELETE ON guard_locks \
         FOR EACH STATEMENT EXECUTE FUNCTION purge_gate()",
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let gate = runtime.block_on(async {
        let (gate, connection) = tokio_postgres::connect(&db.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        gate.batch_execute("SELECT pg_advisory_lock(7001)")
            .await
            .unwrap();
        gate
    });
    // Tells the test when a purge waits at the gate.
    let (purge_waits_tx, purge_waits) = smol::channel::bounded::<()>(1);
    runtime.spawn({
        let url = db.url();
        async move {
            let (watcher, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                           AND wait_event_type = 'Lock' AND wait_event = 'advisory'";
            while watcher.query_one(waiting, &[]).await.unwrap().get::<_, i64>(0) == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            purge_waits_tx.try_send(()).unwrap();
        }
    });
    let dropped = smol::block_on(async {
        for i in 0..2 * PURGE_EVERY {
            let key = format!("slot:{i}");
            let call = async { Some(locker.try_lock(&key, ttl(60_000)).await) };
            let purge_runs = async {
                purge_waits.recv().await.expect("the watcher runs");
                None
            };
            match future::or(call, purge_runs).await {
                Some(granted) => assert!(granted.unwrap().is_some(), "{key} is new"),
                // The call is dropped here, its purge waiting.
                None => return Some(key),
            }
        }
        None
    });
    let key = dropped.expect("a purge within 2 * PURGE_EVERY acquisitions");
    runtime
        .block_on(gate.batch_execute("SELECT pg_advisory_unlock(7001)"))
        .unwrap();
    let live = db
        .query(&format!(
            "SELECT count(*) FROM guard_locks WHERE key = '{key}' AND expires_at > clock_timestamp()"
        ))
        .unwrap();
    let retaken = smol::block_on(locker.try_lock(&key, ttl(60_000))).unwrap();
    assert!(
        live == "0" && retaken.is_some(),
        "the call dropped while it purged left {key} held ({live} live lease), its token nowhere"
    );
}

/// A TCP relay to the machine's PostgreSQL that can hold back what the
/// server sends while requests still reach it: a network that delays
/// the answers.
struct HeldAnswers {
    port: u16,
    held: Arc<(Mutex<bool>, Condvar)>,
}

impl HeldAnswers {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = Arc::new((Mutex::new(false), Condvar::new()));
        thread::spawn({
            let held = held.clone();
            move || {
                for client in listener.incoming().flatten() {
                    let Ok(server) = TcpStream::connect((MACHINE_HOST, MACHINE_PORT)) else {
                        continue;
                    };
                    relay(
                        client.try_clone().unwrap(),
                        server.try_clone().unwrap(),
                        None,
                    );
                    relay(server, client, Some(held.clone()));
                }
            }
        });
        HeldAnswers { port, held }
    }

    /// `db`'s URL through the relay.
    fn url(&self, db: &PgDatabase) -> String {
        format!(
            "postgres://{SUPERUSER}@127.0.0.1:{}/{}",
            self.port,
            db.name()
        )
    }

    /// Holds the server's answers back (`true`) or lets them through.
    fn hold(&self, on: bool) {
        let (held, changed) = &*self.held;
        *held.lock().unwrap() = on;
        changed.notify_all();
    }
}

/// Copies `from` to `to` on a thread of its own; before each chunk waits
/// while `held` says so.
fn relay(mut from: TcpStream, mut to: TcpStream, held: Option<Arc<(Mutex<bool>, Condvar)>>) {
    thread::spawn(move || {
        let mut chunk = [0; 8192];
        while let Ok(n @ 1..) = from.read(&mut chunk) {
            if let Some(held) = &held {
                let (held, changed) = &**held;
                drop(changed.wait_while(held.lock().unwrap(), |on| *on).unwrap());
            }
            if to.write_all(&chunk[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

#[test]
fn a_request_that_times_out_does_not_cancel_a_concurrent_caller_s_statement() {
    // Caller A's answer is held back on the way (the server has answered)
    // until A times out. Caller B's renewal, sent on the same connection
    // half a timeout after A's acquire, meanwhile runs on the server,
    // waiting on a row lock the test holds until 2 s after A's timeout,
    // well within B's own. A's timeout must not end B's statement.
    const TIMEOUT: Duration = Duration::from_secs(10);
    let db = PgDatabase::create().unwrap();
    let relay = HeldAnswers::start();
    let locker = Arc::new(
        PgLocker::new(&relay.url(&db))
            .unwrap()
            .with_request_timeout(TIMEOUT)
            .unwrap(),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let b = locker.try_lock("b", ttl(120_000)).await.unwrap().unwrap();
        let connect = async || {
            let (client, connection) = tokio_postgres::connect(&db.url(), tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            client
        };
        let (hold_b, watch) = (connect().await, connect().await);
        hold_b
            .batch_execute("BEGIN; SELECT 1 FROM guard_locks WHERE key = 'b' FOR UPDATE")
            .await
            .unwrap();
        relay.hold(true);
        let a = tokio::spawn({
            let locker = locker.clone();
            async move { locker.try_lock("a", ttl(120_000)).await }
        });
        tokio::time::sleep(TIMEOUT / 2).await;
        let renewal = tokio::spawn({
            let locker = locker.clone();
            async move { locker.renew("b", &b, ttl(120_000)).await }
        });
        let waiting = "SELECT count(*) FROM pg_stat_activity \
                       WHERE datname = current_database() AND wait_event_type = 'Lock'";
        let sent = Instant::now();
        while watch
            .query_one(waiting, &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 0
        {
            assert!(
                sent.elapsed() < TIMEOUT / 4,
                "the renewal never waited on its row"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let a = a.await.unwrap();
        assert!(
            matches!(
                a,
                Err(PgLockError::Timeout {
                    statement: "acquire",
                    ..
                })
            ),
            "{a:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        relay.hold(false);
        hold_b.batch_execute("ROLLBACK").await.unwrap();
        let renewal = renewal.await.unwrap();
        assert!(
            matches!(renewal, Ok(Renewal::Held)),
            "the renewal beside a request that timed out: {renewal:?}"
        );
        assert_eq!(
            locker.renew("b", &b, ttl(120_000)).await.unwrap(),
            Renewal::Held,
            "the locker carries on, on a connection of its own"
        );
    });
}

#[test]
fn a_taken_key_s_fence_is_drawn_under_its_row_lock() {
    // A grant that waited on a key's row lock gets a fence above the one
    // the row got meanwhile: drawn when its statement started, it would
    // have been below, and the resource would refuse the new holder while
    // accepting the old one.
    let db = PgDatabase::create().unwrap();
    let locker = PgLocker::new(&db.url()).unwrap();
    smol::block_on(async {
        locker.try_lock("k", ttl(1)).await.unwrap().unwrap();
    });
    thread::sleep(Duration::from_millis(5));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (mut other, connection) = tokio_postgres::connect(&db.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        let other = other.transaction().await.unwrap();
        other
            .execute("SELECT 1 FROM guard_locks WHERE key = 'k' FOR UPDATE", &[])
            .await
            .unwrap();
        // The grant starts now and waits for the row.
        let waiting = thread::spawn({
            let url = db.url();
            move || {
                let locker = PgLocker::new(&url).unwrap();
                smol::block_on(locker.try_lock("k", ttl(60_000)))
            }
        });
        let blocked = "SELECT count(*) FROM pg_stat_activity \
                       WHERE datname = current_database() AND wait_event_type = 'Lock'";
        let start = Instant::now();
        while db.query(blocked).unwrap() != "1" {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the grant never waited"
            );
            thread::sleep(Duration::from_millis(10));
        }
        // Meanwhile another grant of the key, ended again at once.
        let row = other
            .query_one(
                "UPDATE guard_locks SET fence = nextval('guard_locks_fence'), \
                 expires_at = clock_timestamp() - interval '1 second' \
                 WHERE key = 'k' RETURNING fence",
                &[],
            )
            .await
            .unwrap();
        let meanwhile: i64 = row.get(0);
        other.commit().await.unwrap();
        let token = waiting.join().unwrap().unwrap().expect("the key was free");
        assert!(
            token.fence() > meanwhile as u64,
            "fence {} after the row's {meanwhile}",
            token.fence()
        );
    });
}

#[test]
fn lockers_on_connections_of_their_own_race_and_exactly_one_wins_each_round() {
    let db = PgDatabase::create().unwrap();
    const LOCKERS: usize = 6;
    const ROUNDS: usize = 40;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(LOCKERS));
    let threads: Vec<_> = (0..LOCKERS)
        .map(|_| {
            let (url, barrier) = (db.url(), barrier.clone());
            thread::spawn(move || {
                let locker = PgLocker::new(&url).unwrap();
                smol::block_on(locker.connect()).unwrap();
                let mut won = Vec::new();
                for round in 0..ROUNDS {
                    barrier.wait();
                    // Even rounds: a new key; odd rounds: the key of the
                    // round before, whose lease its winner ended (the
                    // update path). Every lease outlasts the round: a
                    // short one could expire before a late thread of the
                    // same round asks, and that thread would win too.
                    let key = format!("race:{}", round / 2);
                    let token = smol::block_on(locker.try_lock(&key, ttl(60_000))).unwrap();
                    if let Some(token) = &token {
                        won.push((round, token.fence()));
                    }
                    // Everyone has asked; then the even round's winner ends
                    // its lease for the next round.
                    barrier.wait();
                    if let Some(token) = token.filter(|_| round % 2 == 0) {
                        smol::block_on(locker.unlock(&key, &token)).unwrap();
                    }
                    barrier.wait();
                }
                won
            })
        })
        .collect();
    let mut winners: Vec<(usize, u64)> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    winners.sort_unstable();
    let rounds: Vec<usize> = winners.iter().map(|(r, _)| *r).collect();
    assert_eq!(
        rounds,
        (0..ROUNDS).collect::<Vec<_>>(),
        "exactly one winner a round: {winners:?}"
    );
    for pair in winners.chunks(2) {
        assert!(pair[1].1 > pair[0].1, "fences of a key increase: {pair:?}");
    }
}

#[test]
fn a_role_that_cannot_use_the_table_is_refused_at_the_start() {
    let db = PgDatabase::create().unwrap();
    let owner = PgLocker::new(&db.url()).unwrap();
    smol::block_on(owner.connect()).unwrap();
    let role = format!("{}_role", db.name());
    db.query(&format!("CREATE ROLE \"{role}\" LOGIN")).unwrap();
    // Rights on the table, none on its fence sequence.
    db.query(&format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON guard_locks TO \"{role}\""
    ))
    .unwrap();
    let url = db.url().replacen("postgres@", &format!("{role}@"), 1);
    let locker = PgLocker::new(&url).unwrap();
    let err = smol::block_on(locker.connect()).unwrap_err();
    let cleanup = format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\"");
    db.query(&cleanup).unwrap();
    assert!(
        matches!(
            err,
            PgLockError::InvalidInput {
                parameter: "table",
                ..
            }
        ) && err.to_string().contains("USAGE on its sequence"),
        "{err}"
    );
}

#[test]
fn bad_parameters_and_keys_are_refused_naming_them() {
    let err = PgLocker::new("postgres://app:secret@127.0.0.1:nope/app").unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("invalid server URL"), "{text}");
    assert!(!text.contains("secret"), "the password is hidden: {text}");
    let locker = || PgLocker::new("postgres://app@127.0.0.1/app").unwrap();
    for table in ["", "locks; drop table x", "9locks", &"t".repeat(56)] {
        let err = locker().with_table(table).unwrap_err();
        assert!(
            matches!(
                err,
                PgLockError::InvalidInput {
                    parameter: "table",
                    ..
                }
            ),
            "{table:?}: {err}"
        );
    }
    let err = locker().with_request_timeout(Duration::ZERO).unwrap_err();
    assert!(err.to_string().contains("request timeout"), "{err}");
    for key in ["", "a\0b", &"k".repeat(257)] {
        let err = smol::block_on(locker().try_lock(key, ttl(10))).unwrap_err();
        assert!(
            matches!(
                err,
                PgLockError::InvalidInput {
                    parameter: "lock key",
                    ..
                }
            ),
            "{key:?}: {err}"
        );
    }
}

#[test]
fn a_locker_inside_a_tokio_runtime_runs_on_it() {
    let db = PgDatabase::create().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let locker = std::sync::Arc::new(PgLocker::new(&db.url()).unwrap());
    runtime.block_on(async {
        // Spawned: the locker's futures are Send.
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let locker = locker.clone();
                tokio::spawn(async move { locker.try_lock("race", ttl(60_000)).await })
            })
            .collect();
        let mut won = 0;
        for task in tasks {
            won += usize::from(task.await.unwrap().unwrap().is_some());
        }
        assert_eq!(won, 1);
    });
}

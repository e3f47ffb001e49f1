//! The PostgreSQL queue on real servers: the machine's PostgreSQL (a
//! database made for each test, dropped after it) and, for the restart,
//! a private server this test starts and stops.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use futures_lite::future;
use guard_core::retry::{Classifier, Jitter, JitterNeedsRandom, RetryPolicy};
use guard_endpoints::Parameter;
use guard_endpoints::postgres::{PgMessage, PgQueue, PgQueueError, PgQueueStats};
use guard_smol::{RunHandle, control};
use guard_testkit::postgres::{PgDatabase, PgServer};

/// Which consumers handled each row id, in call order.
type Seen = Arc<Mutex<BTreeMap<i64, Vec<String>>>>;

fn wait_until(limit: Duration, done: impl FnMut() -> bool) -> bool {
    guard_testkit::wait_until("condition", limit, done).is_ok()
}

fn database() -> PgDatabase {
    PgDatabase::create().expect("a database on the machine's PostgreSQL (127.0.0.1:5432)")
}

/// `sql`'s single value, as a number.
fn number(db: &PgDatabase, sql: &str) -> i64 {
    let text = db.query(sql).expect("query");
    text.parse()
        .unwrap_or_else(|e| panic!("{sql}: {text:?}: {e}"))
}

/// A queue on `url`'s `jobs` table, polling often, its tables created.
fn queue(url: &str) -> PgQueue {
    let queue = PgQueue::new(url, "jobs")
        .expect("queue")
        .with_poll_interval(Duration::from_millis(20));
    smol::block_on(queue.create_tables()).expect("create tables");
    queue
}

fn payloads(prefix: &str, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .collect()
}

/// A consumer running on a thread of its own.
struct Replica {
    handle: RunHandle,
    thread: thread::JoinHandle<PgQueueStats>,
}

impl Replica {
    /// Runs `queue` with `handler` (every error retried).
    fn start<F, Fut>(queue: PgQueue, handler: F) -> Self
    where
        F: FnMut(PgMessage) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), String>>,
    {
        let (handle, ctl) = control();
        let thread =
            thread::spawn(move || smol::block_on(queue.run(ctl, Classifier::retry_all(), handler)));
        Replica { handle, thread }
    }

    /// A replica named `name` that records what it handles in `seen`.
    fn recording(queue: &PgQueue, name: &str, seen: &Seen) -> Self {
        let queue = queue.clone().with_consumer_name(name).expect("name");
        let (seen, name) = (seen.clone(), name.to_owned());
        Replica::start(queue, move |message| {
            seen.lock()
                .unwrap()
                .entry(message.id)
                .or_default()
                .push(name.clone());
            async {
                // A little work, so the replicas share the rows.
                async_io::Timer::after(Duration::from_millis(1)).await;
                Ok(())
            }
        })
    }

    fn stop(self) -> PgQueueStats {
        self.handle.stop();
        self.thread.join().expect("the consumer's thread")
    }
}

/// Every claimed row is in exactly one outcome once `run` has returned.
fn assert_accounted(stats: &PgQueueStats) {
    assert_eq!(
        stats.claimed,
        stats.handled
            + stats.dead_lettered
            + stats.lost_claim
            + stats.expired_unstarted
            + stats.unfinished,
        "{stats:?}"
    );
}

/// Each of `ids` handled exactly once, and nothing else.
fn assert_each_once(seen: &Seen, ids: &[i64]) {
    let seen = seen.lock().unwrap();
    let handled: Vec<i64> = seen.keys().copied().collect();
    let mut expected = ids.to_vec();
    expected.sort_unstable();
    assert_eq!(handled, expected, "rows handled");
    for (id, by) in seen.iter() {
        assert_eq!(by.len(), 1, "row {id} handled by {by:?}");
    }
}

#[test]
fn three_replicas_handle_every_row_exactly_once() {
    let db = database();
    let queue = queue(&db.url()).with_batch(10).unwrap();
    let seen: Seen = Arc::default();
    let replicas: Vec<Replica> = (0..3)
        .map(|r| Replica::recording(&queue, &format!("replica-{r}"), &seen))
        .collect();
    thread::sleep(Duration::from_millis(200));
    let mut ids = Vec::new();
    for round in 0..10 {
        let pushed = smol::block_on(queue.push_batch(&payloads(&format!("r{round}-"), 30)));
        ids.extend(pushed.expect("push"));
    }
    assert_eq!(ids.len(), 300);
    let all = wait_until(Duration::from_secs(20), || {
        seen.lock().unwrap().len() >= 300
    });
    let stats: Vec<PgQueueStats> = replicas.into_iter().map(Replica::stop).collect();
    assert!(all, "only {} of 300 handled", seen.lock().unwrap().len());
    assert_each_once(&seen, &ids);
    assert_eq!(
        stats.iter().map(|s| s.handled).sum::<u64>(),
        300,
        "{stats:?}"
    );
    for (r, s) in stats.iter().enumerate() {
        assert!(s.handled > 0, "replica {r} handled nothing: {stats:?}");
        assert_eq!(
            (s.lost_claim, s.dead_lettered, s.unfinished),
            (0, 0, 0),
            "{s:?}"
        );
        assert_accounted(s);
    }
    assert_eq!(number(&db, "SELECT count(*) FROM jobs"), 0, "rows left");
}

/// What the paused consumer's handler does with the first row once it
/// resumes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AfterPause {
    /// Succeeds: the consumer tries to delete the row.
    Succeed,
    /// Fails for good: the consumer tries to dead-letter the row.
    Fail,
}

/// A consumer claims five rows and pauses past its lease in the first
/// row's handler; another claims them meanwhile. Checks that the paused
/// one hands nothing more over and that the token refuses its completion
/// (`after` says which: a delete or a dead letter).
fn paused_claimer(after: AfterPause) {
    let db = database();
    let base = queue(&db.url()).with_batch(5).unwrap();
    let ids = smol::block_on(base.push_batch(&payloads("row-", 5))).expect("push");

    // The paused consumer claims the five rows (lease 1 s) and stops its
    // thread for 2.5 s in the first row's handler, as a long pause would.
    let pause = Duration::from_millis(2500);
    let paused_seen: Arc<Mutex<Vec<i64>>> = Arc::default();
    let resumed = Arc::new(AtomicBool::new(false));
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let paused = {
        let (seen, resumed) = (paused_seen.clone(), resumed.clone());
        let queue = base
            .clone()
            .with_claim_lease(Duration::from_secs(1))
            .unwrap()
            .with_consumer_name("paused")
            .unwrap()
            .with_retry(RetryPolicy::no_retry())
            .unwrap();
        Replica::start(queue, move |message| {
            let first = {
                let mut seen = seen.lock().unwrap();
                seen.push(message.id);
                seen.len() == 1
            };
            if first {
                entered_tx.send(()).ok();
                thread::sleep(pause);
                resumed.store(true, Ordering::SeqCst);
            }
            future::ready(match after {
                AfterPause::Succeed => Ok(()),
                AfterPause::Fail => Err("failed after the pause".to_owned()),
            })
        })
    };
    entered_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the paused consumer claimed the rows");

    // The other consumer (lease 10 s) claims the rows once the first lease
    // ends. It holds the first row until the paused one has resumed and
    // tried to complete it, so that completion meets a live claim that
    // is not its own.
    let patient_seen: Arc<Mutex<Vec<i64>>> = Arc::default();
    let patient = {
        let (seen, resumed) = (patient_seen.clone(), resumed.clone());
        let first_id = ids[0];
        let queue = base
            .clone()
            .with_claim_lease(Duration::from_secs(10))
            .unwrap()
            .with_consumer_name("patient")
            .unwrap();
        Replica::start(queue, move |message| {
            seen.lock().unwrap().push(message.id);
            let resumed = resumed.clone();
            async move {
                if message.id == first_id {
                    let start = Instant::now();
                    while !resumed.load(Ordering::SeqCst)
                        && start.elapsed() < Duration::from_secs(10)
                    {
                        async_io::Timer::after(Duration::from_millis(10)).await;
                    }
                    async_io::Timer::after(Duration::from_millis(500)).await;
                }
                Ok(())
            }
        })
    };
    let done = wait_until(Duration::from_secs(15), || {
        patient_seen.lock().unwrap().len() >= 5
    });
    // The paused consumer has resumed and given up its batch by now.
    let paused_stats = paused.stop();
    let patient_stats = patient.stop();
    assert!(
        done,
        "the other consumer handled {:?}",
        patient_seen.lock().unwrap()
    );

    assert_eq!(
        *paused_seen.lock().unwrap(),
        vec![ids[0]],
        "after resuming, the paused consumer started nothing more of its batch"
    );
    assert_eq!(
        *patient_seen.lock().unwrap(),
        ids,
        "the other consumer handled the rows"
    );
    assert_eq!(paused_stats.handled, 0, "{paused_stats:?}");
    assert_eq!(
        paused_stats.lost_claim, 1,
        "its delete or dead letter of the first row was refused by the token: {paused_stats:?}"
    );
    assert_eq!(paused_stats.expired_unstarted, 4, "{paused_stats:?}");
    assert_accounted(&paused_stats);
    assert_eq!(patient_stats.handled, 5, "{patient_stats:?}");
    assert_eq!(patient_stats.lost_claim, 0, "{patient_stats:?}");
    assert_eq!(number(&db, "SELECT count(*) FROM jobs"), 0, "rows left");
    assert_eq!(
        number(&db, "SELECT count(*) FROM jobs_dead_letters"),
        0,
        "the paused consumer dead-lettered a row it no longer held"
    );
}

#[test]
fn a_claimer_paused_past_its_lease_hands_over_nothing_and_cannot_complete() {
    paused_claimer(AfterPause::Succeed);
}

#[test]
fn a_claimer_paused_past_its_lease_cannot_dead_letter_what_it_lost() {
    paused_claimer(AfterPause::Fail);
}

#[test]
fn a_poisoned_row_is_dead_lettered_with_its_origin_error_and_attempts() {
    let db = database();
    let queue = queue(&db.url())
        .with_retry(RetryPolicy::fixed_delay(2, Duration::from_millis(10)))
        .unwrap();
    let ids = smol::block_on(queue.push_batch(&[
        b"fine-1".to_vec(),
        b"poison".to_vec(),
        b"fine-2".to_vec(),
    ]))
    .expect("push");
    let calls: Arc<Mutex<BTreeMap<i64, u32>>> = Arc::default();
    let replica = {
        let calls = calls.clone();
        Replica::start(queue.clone(), move |message| {
            *calls.lock().unwrap().entry(message.id).or_default() += 1;
            future::ready(if message.payload == b"poison" {
                Err(format!("cannot digest row {}", message.id))
            } else {
                Ok(())
            })
        })
    };
    let done = wait_until(Duration::from_secs(10), || {
        number(&db, "SELECT count(*) FROM jobs") == 0
    });
    let stats = replica.stop();
    assert!(done, "rows left: {stats:?}");
    assert_eq!((stats.handled, stats.dead_lettered), (2, 1), "{stats:?}");
    assert_accounted(&stats);
    assert_eq!(
        calls.lock().unwrap().get(&ids[1]),
        Some(&3),
        "1 call + 2 retries"
    );

    let letter = |column: &str| {
        db.query(&format!("SELECT {column} FROM jobs_dead_letters"))
            .expect("dead letter")
    };
    assert_eq!(number(&db, "SELECT count(*) FROM jobs_dead_letters"), 1);
    assert_eq!(letter("origin_table"), "jobs");
    assert_eq!(letter("origin_id"), ids[1].to_string());
    assert_eq!(letter("encode(payload, 'escape')"), "poison");
    assert_eq!(letter("attempts"), "3");
    assert_eq!(letter("deliveries"), "1");
    let error = letter("error");
    assert!(
        error.contains(&format!("cannot digest row {}", ids[1])),
        "{error}"
    );
}

/// Runs `queue` until its handler is called, then drops the consumer in
/// the middle of that call (a crash: the claim is never completed), and
/// returns the message the handler got.
fn crash_while_handling(queue: &PgQueue) -> PgMessage {
    let got: Arc<Mutex<Option<PgMessage>>> = Arc::default();
    let (_handle, ctl) = control();
    smol::block_on(future::or(
        {
            let got = got.clone();
            async move {
                queue
                    .run(ctl, Classifier::retry_all(), move |message| {
                        *got.lock().unwrap() = Some(message);
                        future::pending::<Result<(), String>>()
                    })
                    .await;
                panic!("the crashing consumer stopped");
            }
        },
        async {
            let start = Instant::now();
            while got.lock().unwrap().is_none() {
                assert!(start.elapsed() < Duration::from_secs(10), "nothing claimed");
                async_io::Timer::after(Duration::from_millis(5)).await;
            }
        },
    ));
    got.lock().unwrap().take().expect("the handler's message")
}

#[test]
fn a_crashed_claimer_s_row_comes_back_after_the_lease_then_is_dead_lettered() {
    let db = database();
    let lease = Duration::from_millis(400);
    let queue = queue(&db.url())
        .with_claim_lease(lease)
        .unwrap()
        .with_max_deliveries(2)
        .unwrap();
    let id = smol::block_on(queue.push(b"crashes its handler")).expect("push");

    // Each claim sets claimed_until to its start plus the lease, on the
    // server's clock: the difference of two is the time between claims.
    let claimed_until = || {
        number(
            &db,
            "SELECT (extract(epoch FROM claimed_until) * 1000000)::bigint FROM jobs",
        )
    };
    let first = crash_while_handling(&queue);
    assert_eq!((first.id, first.deliveries), (id, 1));
    let first_until = claimed_until();
    let second = crash_while_handling(&queue);
    assert_eq!((second.id, second.deliveries), (id, 2), "it came back");
    let between = Duration::from_micros((claimed_until() - first_until).unsigned_abs());
    assert!(
        between >= lease,
        "claimed again {between:?} after the first claim, before its lease of {lease:?} ended"
    );
    assert!(
        second.claim_token > first.claim_token,
        "{first:?} {second:?}"
    );

    // Claimed a third time, past max_deliveries: dead-lettered unhandled.
    let calls = Arc::new(AtomicU64::new(0));
    let replica = {
        let calls = calls.clone();
        Replica::start(queue.clone(), move |_message| {
            calls.fetch_add(1, Ordering::SeqCst);
            future::ready(Ok(()))
        })
    };
    let done = wait_until(Duration::from_secs(10), || {
        number(&db, "SELECT count(*) FROM jobs_dead_letters") == 1
    });
    let stats = replica.stop();
    assert!(done, "not dead-lettered: {stats:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the handler was not called"
    );
    assert_eq!(
        (stats.dead_lettered, stats.too_many_deliveries),
        (1, 1),
        "{stats:?}"
    );
    assert_accounted(&stats);
    assert_eq!(number(&db, "SELECT count(*) FROM jobs"), 0);
    let letter = db
        .query("SELECT origin_id, deliveries, attempts FROM jobs_dead_letters")
        .expect("dead letter");
    assert_eq!(letter, format!("{id}|3|0"));
    let error = db
        .query("SELECT error FROM jobs_dead_letters")
        .expect("dead letter");
    assert!(
        error.contains("more than the 2 deliveries allowed"),
        "{error}"
    );
}

#[test]
fn a_consumer_reconnects_after_the_server_restarts_and_handles_each_row_once() {
    let mut server = PgServer::start().expect("a private PostgreSQL server");
    let queue = queue(&server.url()).with_reconnect_delay(Duration::from_millis(100));
    let seen: Seen = Arc::default();
    let replica = Replica::recording(&queue, "survivor", &seen);

    let mut ids = smol::block_on(queue.push_batch(&payloads("before-", 20))).expect("push");
    let rows_left = |server: &PgServer| -> i64 {
        server
            .query("SELECT count(*) FROM jobs")
            .expect("count")
            .parse()
            .expect("a number")
    };
    assert!(
        wait_until(Duration::from_secs(10), || seen.lock().unwrap().len() == 20
            && rows_left(&server) == 0),
        "before the restart"
    );

    server.stop();
    thread::sleep(Duration::from_millis(300));
    server.start_again().expect("the same server again");
    ids.extend(smol::block_on(queue.push_batch(&payloads("after-", 20))).expect("push"));

    let all = wait_until(Duration::from_secs(15), || seen.lock().unwrap().len() >= 40);
    let stats = replica.stop();
    assert!(
        all,
        "only {} of 40 handled: {stats:?}",
        seen.lock().unwrap().len()
    );
    assert_each_once(&seen, &ids);
    assert!(stats.reconnects >= 1, "{stats:?}");
    assert_eq!(stats.handled, 40, "{stats:?}");
    assert_accounted(&stats);
    assert_eq!(rows_left(&server), 0);
}

/// `err` is an `InvalidInput` of `parameter` with `value`, and its
/// message names all three.
fn assert_refused(err: PgQueueError, parameter: Parameter, value: &str, rule: &str) {
    let text = err.to_string();
    match &err {
        PgQueueError::InvalidInput(guard_endpoints::InvalidInput {
            parameter: p,
            value: v,
            rule: r,
            ..
        }) => {
            assert_eq!((*p, v.as_str()), (parameter, value), "{text}");
            assert!(r.contains(rule), "{r}");
        }
        other => panic!("not an InvalidInput: {other:?}"),
    }
    assert!(text.contains(&parameter.to_string()), "{text}");
    // Text values are quoted (escaped) in the message.
    assert!(
        text.contains(value) || text.contains(&format!("{value:?}")),
        "{text}"
    );
    assert!(text.contains(rule), "{text}");
}

#[test]
fn bad_parameters_are_refused_naming_the_parameter_the_value_and_the_rule() {
    let url = "postgres://postgres@127.0.0.1:5432/app";
    let err = PgQueue::new(url, "a; drop table x").unwrap_err();
    assert_refused(
        err,
        Parameter::Table,
        "a; drop table x",
        "plain SQL identifier",
    );
    let err = PgQueue::new(url, "").unwrap_err();
    assert_refused(err, Parameter::Table, "", "plain SQL identifier");

    let queue = PgQueue::new(url, "jobs").expect("a valid queue");
    let err = queue.clone().with_claim_lease(Duration::ZERO).unwrap_err();
    assert_refused(err, Parameter::ClaimLease, "0ns", "from 100 ms to 24 h");

    let err = queue
        .clone()
        .with_retry(RetryPolicy::new().with_jitter(Jitter::Full))
        .unwrap_err();
    let source = std::error::Error::source(&err).expect("the cause");
    assert!(
        source.downcast_ref::<JitterNeedsRandom>().is_some(),
        "{source:?}"
    );
    assert_refused(err, Parameter::RetryPolicy, "with Full jitter", "no jitter");

    let err = queue
        .clone()
        .with_dead_letter_table("dead\"; drop table jobs; --")
        .unwrap_err();
    assert_refused(
        err,
        Parameter::Table,
        "dead\"; drop table jobs; --",
        "plain SQL identifier",
    );
    let err = queue.clone().with_batch(0).unwrap_err();
    assert_refused(err, Parameter::Batch, "0", "at least 1");
    let err = queue.clone().with_max_deliveries(0).unwrap_err();
    assert_refused(err, Parameter::MaxDeliver, "0", "from 1");
    let err = queue.clone().with_consumer_name("").unwrap_err();
    assert_refused(err, Parameter::ConsumerName, "", "must not be empty");

    let err = PgQueue::new("postgres://app:secret@db:port/app", "jobs").unwrap_err();
    assert_refused(
        err,
        Parameter::ServerUrl,
        "postgres://app:***@db:port/app",
        "PostgreSQL URL",
    );
}

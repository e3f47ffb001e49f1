//! The queue: its parameters, its producer side and its consumer loop.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_compat::Compat;
use futures_lite::future;
use guard_core::retry::{Classifier, RetryPolicy};
use guard_std::Throttle;

use crate::link::Link;
use guard_std::run::CallerRuntime;
use guard_std::run::{Control, Runtime as _};
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls, Row, Statement};

use super::deadline::ClaimDeadline;
use super::server::{redacted, server_name};
use super::sql::{self, Statements};
use super::{PgMessage, PgQueueError, PgQueueStats};
use crate::deliver;
use crate::parameter::Parameter;

/// Rows claimed per round.
pub const DEFAULT_BATCH: usize = 10;
/// The wait after a round that claimed nothing.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long a claim keeps other consumers off a row.
pub const DEFAULT_CLAIM_LEASE: Duration = Duration::from_secs(30);
/// The shortest claim lease: below it a round trip and the safety
/// margin leave no time to start a handler.
pub const MIN_CLAIM_LEASE: Duration = Duration::from_millis(100);
/// The longest claim lease: a crashed consumer's rows wait this long.
pub const MAX_CLAIM_LEASE: Duration = Duration::from_secs(24 * 60 * 60);
/// Claims of one row before it is dead-lettered unhandled.
pub const DEFAULT_MAX_DELIVERIES: u32 = 10;
/// The wait before connecting again after the connection failed.
pub const DEFAULT_RECONNECT_DELAY: Duration = Duration::from_secs(1);
/// How long a connection attempt or a statement may go unanswered before
/// its connection is given up (and opened again).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Distinguishes the default consumer names of the queues of one process.
static QUEUES: AtomicU64 = AtomicU64::new(0);

/// The statements of [`Statements`] prepared on one connection, so a
/// round costs one round trip per statement.
struct Prepared {
    claim: Statement,
    complete: Statement,
    dead_letter: Statement,
}

/// Where a claimed row was to go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Handled: deleted.
    Handled,
    /// Given up by the handler's retries: dead-lettered.
    GaveUp,
    /// Claimed more often than allowed: dead-lettered unhandled.
    TooManyDeliveries,
}

/// One connection as a round uses it.
#[derive(Clone, Copy)]
struct Session<'a> {
    client: &'a Client,
    /// Prepared on it.
    statements: &'a Prepared,
}

/// What became of a claimed row's completion (delete or dead letter).
enum Completion {
    /// Written under this consumer's claim.
    Done,
    /// Refused by the token: the claim ended and the row was claimed
    /// again (or is gone).
    LostClaim,
    /// Not written: the row stays claimed and returns after the lease.
    Failed(PgQueueError),
}

/// A checked table name, or the error naming it.
fn table_name(name: &str, max: usize) -> Result<String, PgQueueError> {
    match sql::identifier_rule(name, max) {
        None => Ok(name.to_owned()),
        Some(rule) => Err(PgQueueError::invalid(Parameter::Table, name, rule)),
    }
}

/// The message of a claimed row, as the claim statement returns it.
fn message(row: &Row) -> Result<PgMessage, tokio_postgres::Error> {
    Ok(PgMessage {
        id: row.try_get(0)?,
        payload: row.try_get(1)?,
        deliveries: row.try_get(2)?,
        enqueued_at: row.try_get(3)?,
        claim_token: row.try_get(4)?,
    })
}

/// `request`, failed as `statement` if it has no answer within
/// [`REQUEST_TIMEOUT`].
async fn timed<T>(
    statement: &'static str,
    request: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, PgQueueError> {
    future::or(
        async { request.await.map_err(|e| PgQueueError::query(statement, e)) },
        async {
            CallerRuntime.sleep(REQUEST_TIMEOUT).await;
            Err(PgQueueError::Timeout {
                statement,
                after: REQUEST_TIMEOUT,
            })
        },
    )
    .await
}

/// Whether `error` is a concurrent `CREATE TABLE IF NOT EXISTS` of the
/// same table losing the race (the server checks existence before it
/// inserts the catalog rows): trying again finds the table.
fn lost_create_race(error: &PgQueueError) -> bool {
    let PgQueueError::Query { source, .. } = error else {
        return false;
    };
    matches!(
        source.code(),
        Some(code) if *code == SqlState::UNIQUE_VIOLATION || *code == SqlState::DUPLICATE_TABLE
    )
}

/// A table of work that replicas claim row by row; see the module
/// documentation.
///
/// ```no_run
/// # smol::block_on(async {
/// use std::time::Duration;
/// use guard_core::retry::{Classifier, RetryPolicy};
/// use guard_endpoints::postgres::PgQueue;
///
/// let queue = PgQueue::new("postgres://app@127.0.0.1/app", "jobs")?
///     .with_claim_lease(Duration::from_secs(60))?
///     .with_retry(RetryPolicy::fixed_delay(2, Duration::from_millis(100)))?;
/// queue.create_tables().await?;
/// queue.push(b"hello").await?;
/// let (_handle, control) = guard_smol::control();
/// let stats = queue
///     .run(control, Classifier::retry_all(), |message| async move {
///         println!("{} {:?}", message.id, message.payload);
///         Ok::<(), String>(())
///     })
///     .await;
/// println!("{stats:?}");
/// # Ok::<(), guard_endpoints::postgres::PgQueueError>(())
/// # });
/// ```
#[derive(Clone)]
pub struct PgQueue {
    config: Config,
    server: String,
    table: String,
    dead_letters: String,
    statements: Statements,
    consumer: String,
    batch: usize,
    poll_interval: Duration,
    claim_lease: Duration,
    retry: RetryPolicy,
    max_deliveries: u32,
    reconnect_delay: Duration,
    link: Option<Link>,
}

impl fmt::Debug for PgQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the configuration: it holds the password.
        f.debug_struct("PgQueue")
            .field("server", &self.server)
            .field("table", &self.table)
            .field("dead_letters", &self.dead_letters)
            .field("consumer", &self.consumer)
            .field("batch", &self.batch)
            .field("claim_lease", &self.claim_lease)
            .field("max_deliveries", &self.max_deliveries)
            .finish()
    }
}

impl PgQueue {
    /// The queue in `table` of the database at `url` (a `postgres://`
    /// URL or a `key=value` connection string), with the defaults:
    /// 10 rows a round, 100 ms between empty rounds, 30 s claim lease,
    /// the original's retry policy, 10 deliveries, dead letters in
    /// `<table>_dead_letters`, and a consumer name unique in the process.
    ///
    /// `table` is a plain SQL identifier of at most 50 bytes (so its
    /// dead-letter table's name fits PostgreSQL's 63), used quoted: its
    /// case matters. The connection is plain TCP (or a Unix socket): an
    /// `sslmode` that requires TLS is refused.
    pub fn new(url: &str, table: &str) -> Result<Self, PgQueueError> {
        let mut config: Config = url.parse().map_err(|e: tokio_postgres::Error| {
            PgQueueError::InvalidInput(crate::InvalidInput {
                parameter: Parameter::ServerUrl,
                value: redacted(url),
                rule: "must be a PostgreSQL URL (postgres://user@host:port/database) or key=value connection string".to_owned(),
                source: Some(Arc::new(e)),
            })
        })?;
        if config.get_hosts().is_empty() {
            return Err(PgQueueError::invalid(
                Parameter::ServerUrl,
                redacted(url),
                "must name a host",
            ));
        }
        if !matches!(config.get_ssl_mode(), SslMode::Disable | SslMode::Prefer) {
            return Err(PgQueueError::invalid(
                Parameter::ServerUrl,
                redacted(url),
                "this endpoint connects without TLS: sslmode must be disable or prefer",
            ));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(REQUEST_TIMEOUT);
        }
        let table = table_name(table, sql::MAX_TABLE)?;
        let dead_letters = format!("{table}{}", sql::DEAD_LETTER_SUFFIX);
        Ok(PgQueue {
            server: server_name(&config),
            config,
            statements: Statements::new(&table, &dead_letters),
            table,
            dead_letters,
            consumer: format!(
                "pid-{}-{}",
                std::process::id(),
                QUEUES.fetch_add(1, Ordering::Relaxed)
            ),
            batch: DEFAULT_BATCH,
            poll_interval: DEFAULT_POLL_INTERVAL,
            claim_lease: DEFAULT_CLAIM_LEASE,
            retry: RetryPolicy::new(),
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            reconnect_delay: DEFAULT_RECONNECT_DELAY,
            link: None,
        })
    }

    /// Rows claimed per round (at least 1). Every row of a round must
    /// start before the claim's deadline (see
    /// [`with_claim_lease`](Self::with_claim_lease)): a batch larger
    /// than the rows one lease can start only sends rows back late.
    pub fn with_batch(mut self, batch: usize) -> Result<Self, PgQueueError> {
        if batch == 0 || i64::try_from(batch).is_err() {
            return Err(PgQueueError::invalid(
                Parameter::Batch,
                batch.to_string(),
                "must be at least 1",
            ));
        }
        self.batch = batch;
        Ok(self)
    }

    /// Reports the connection to `link` (see [`crate::link`]): down from
    /// a failed connect or a session that ended, up again when connected.
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = Some(link);
        self
    }

    /// The wait after a round that claimed nothing.
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long a claim keeps other consumers off a row (from 100 ms to
    /// 24 h). Choose it above the longest handling of a row, its retries
    /// and their delays included: a handler still running when the lease
    /// ends may run while another replica handles the same row.
    pub fn with_claim_lease(mut self, lease: Duration) -> Result<Self, PgQueueError> {
        if !(MIN_CLAIM_LEASE..=MAX_CLAIM_LEASE).contains(&lease) {
            return Err(PgQueueError::invalid(
                Parameter::ClaimLease,
                format!("{lease:?}"),
                "must be from 100 ms to 24 h",
            ));
        }
        self.claim_lease = lease;
        Ok(self)
    }

    /// How a failing row is retried before it is dead-lettered. The
    /// queue draws no random bits, so a policy with jitter is refused.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Result<Self, PgQueueError> {
        self.retry = deliver::checked(policy).map_err(PgQueueError::InvalidInput)?;
        Ok(self)
    }

    /// How often a row may be claimed (at least 1): a row claimed more
    /// often is dead-lettered when claimed, without calling the handler.
    /// A handler that crashes its process never returns an error, so this
    /// is what ends its row's redeliveries. Claims whose rows were not
    /// started before their deadline count too.
    pub fn with_max_deliveries(mut self, max: u32) -> Result<Self, PgQueueError> {
        if max == 0 || i32::try_from(max).is_err() {
            return Err(PgQueueError::invalid(
                Parameter::MaxDeliver,
                max.to_string(),
                "must be from 1 to 2147483647",
            ));
        }
        self.max_deliveries = max;
        Ok(self)
    }

    /// Where given-up rows go: a plain SQL identifier (at most 63 bytes),
    /// not the queue's table. Several queues may share one: each dead
    /// letter names its origin table.
    pub fn with_dead_letter_table(mut self, table: &str) -> Result<Self, PgQueueError> {
        let name = table_name(table, sql::MAX_IDENTIFIER)?;
        if name == self.table {
            return Err(PgQueueError::invalid(
                Parameter::Table,
                table,
                "the dead-letter table must differ from the queue's table",
            ));
        }
        self.statements = Statements::new(&self.table, &name);
        self.dead_letters = name;
        Ok(self)
    }

    /// The name written in `claimed_by` (not empty), for operators: which
    /// replica holds a row. Claims are told apart by their tokens, not by
    /// this name.
    pub fn with_consumer_name(mut self, name: &str) -> Result<Self, PgQueueError> {
        if name.is_empty() {
            return Err(PgQueueError::invalid(
                Parameter::ConsumerName,
                name,
                "must not be empty",
            ));
        }
        name.clone_into(&mut self.consumer);
        Ok(self)
    }

    /// The wait before connecting again after the connection failed.
    pub fn with_reconnect_delay(mut self, delay: Duration) -> Self {
        self.reconnect_delay = delay;
        self
    }

    /// The queue's table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Its dead-letter table.
    pub fn dead_letter_table(&self) -> &str {
        &self.dead_letters
    }

    /// The claim lease.
    pub fn claim_lease(&self) -> Duration {
        self.claim_lease
    }

    /// Opens a connection (within the connect timeout). Polled inside
    /// [`Compat`]: tokio-postgres needs tokio's reactor.
    async fn connect(
        &self,
    ) -> Result<
        (
            Client,
            tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
        ),
        PgQueueError,
    > {
        self.config
            .connect(NoTls)
            .await
            .map_err(|e| PgQueueError::Connect {
                server: self.server.clone(),
                source: Arc::new(e),
            })
    }

    /// Runs `op` on a connection of its own, driven alongside it; the
    /// connection is closed after.
    async fn once<T>(
        &self,
        op: impl AsyncFnOnce(&Client) -> Result<T, PgQueueError>,
    ) -> Result<T, PgQueueError> {
        Compat::new(async {
            let (client, connection) = self.connect().await?;
            let driven = async {
                match connection.await {
                    Err(e) => Err(PgQueueError::query("connection", e)),
                    // Ended cleanly: `op` hears it as a closed client.
                    Ok(()) => future::pending().await,
                }
            };
            future::or(op(&client), driven).await
        })
        .await
    }

    /// Creates the queue's table and its dead-letter table unless they
    /// exist (`CREATE TABLE IF NOT EXISTS`; see the module documentation
    /// for the schema). Replicas may all call it at start.
    pub async fn create_tables(&self) -> Result<(), PgQueueError> {
        self.once(async |client| {
            let mut lost = 0;
            loop {
                match timed(
                    "create tables",
                    client.batch_execute(&self.statements.create),
                )
                .await
                {
                    Err(e) if lost_create_race(&e) && lost < 3 => lost += 1,
                    done => return done,
                }
            }
        })
        .await
    }

    /// Enqueues `payload`; returns the row's id. Opens a connection of
    /// its own: for many rows, use [`push_batch`](Self::push_batch).
    pub async fn push(&self, payload: &[u8]) -> Result<i64, PgQueueError> {
        self.once(async |client| {
            let row = timed("push", client.query_one(&self.statements.push, &[&payload])).await?;
            row.try_get(0).map_err(|e| PgQueueError::query("push", e))
        })
        .await
    }

    /// Enqueues every payload in one statement (all or none); returns the
    /// rows' ids, in the order of `payloads`.
    pub async fn push_batch(&self, payloads: &[Vec<u8>]) -> Result<Vec<i64>, PgQueueError> {
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        self.once(async |client| {
            let rows = timed(
                "push",
                client.query(&self.statements.push_batch, &[&payloads]),
            )
            .await?;
            let mut ids = rows
                .iter()
                .map(|row| row.try_get(0))
                .collect::<Result<Vec<i64>, _>>()
                .map_err(|e| PgQueueError::query("push", e))?;
            // Ids grow in the order the rows were inserted, which is the
            // order of `payloads`.
            ids.sort_unstable();
            Ok(ids)
        })
        .await
    }

    /// Consumes until `control` stops it, then returns what it did.
    ///
    /// Each round claims up to a batch of rows and hands them to
    /// `handler` one at a time in id order, each retried under the retry
    /// policy while `classifier` allows: a handled row is deleted, a
    /// given-up one moved to the dead-letter table, both only under this
    /// consumer's claim. Server failures are logged and the connection
    /// opened again after the reconnect delay; the counts carry on. A
    /// batch being handled when stop comes is finished first (rows not
    /// started by the claim's deadline are left to return).
    pub async fn run<F, Fut, E>(
        &self,
        control: Control,
        classifier: Classifier<E>,
        mut handler: F,
    ) -> PgQueueStats
    where
        F: FnMut(PgMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let mut stats = PgQueueStats::default();
        let failures = Throttle::new();
        let link = self
            .link
            .clone()
            .unwrap_or_else(|| Link::new(&format!("table {}", self.table)));
        let mut connected_before = false;
        while !control.is_stopped() {
            let session = async {
                let connected = future::or(async { Some(self.connect().await) }, async {
                    control.stopped().await;
                    None
                })
                .await;
                let Some(connected) = connected else {
                    return Ok(());
                };
                let (client, connection) = connected?;
                if connected_before {
                    stats.reconnects += 1;
                }
                connected_before = true;
                link.up();
                // The connection is driven here, beside the consumer, never
                // spawned. When it ends it does not cut a handler short: the
                // consumer's next statement fails on the closed client and
                // ends the session.
                let driven = async {
                    if let Err(e) = connection.await {
                        tracing::warn!(
                            "table {}: connection to {} ended: {e}",
                            self.table,
                            self.server
                        );
                    }
                    future::pending::<Result<(), PgQueueError>>().await
                };
                future::or(
                    self.serve(
                        &client,
                        &control,
                        classifier,
                        &mut handler,
                        &mut stats,
                        &failures,
                    ),
                    driven,
                )
                .await
            };
            // Boxed: the nested handler, retry and request futures are
            // deep, and a caller's future would carry all of them inline.
            let ended = Compat::new(Box::pin(session)).await;
            if let Err(e) = ended {
                // A server that is down fails every reconnect delay.
                let then = format!("connecting again in {:?}", self.reconnect_delay);
                link.down(&e, &then);
                future::or(control.stopped(), async {
                    CallerRuntime.sleep(self.reconnect_delay).await;
                })
                .await;
            }
        }
        stats
    }

    /// Prepares the statements a round uses on `client`.
    async fn prepare(&self, client: &Client) -> Result<Prepared, PgQueueError> {
        let statements = &self.statements;
        Ok(Prepared {
            claim: timed("prepare", client.prepare(&statements.claim)).await?,
            complete: timed("prepare", client.prepare(&statements.complete)).await?,
            dead_letter: timed("prepare", client.prepare(&statements.dead_letter)).await?,
        })
    }

    /// Rounds on one connection until stopped (`Ok`) or the connection
    /// is lost (`Err`). A statement the server refuses (a missing table)
    /// is logged and tried again after the poll interval.
    async fn serve<F, Fut, E>(
        &self,
        client: &Client,
        control: &Control,
        classifier: Classifier<E>,
        handler: &mut F,
        stats: &mut PgQueueStats,
        failures: &Throttle,
    ) -> Result<(), PgQueueError>
    where
        F: FnMut(PgMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let mut prepared = None;
        while !control.is_stopped() {
            let outcome = match &prepared {
                Some(statements) => {
                    let session = Session { client, statements };
                    self.round(&session, classifier, handler, stats).await
                }
                // Counted as a busy round: the first claim follows at once.
                None => self.prepare(client).await.map(|statements| {
                    prepared = Some(statements);
                    1
                }),
            };
            let idle = match outcome {
                Ok(claimed) => claimed == 0,
                Err(e) if e.connection_lost() || client.is_closed() => return Err(e),
                Err(e) => {
                    // Prepared again: a table dropped and created anew
                    // invalidates the old statements.
                    prepared = None;
                    if let Some(held) = failures.admit() {
                        tracing::warn!("table {}: {e} ({held} more not logged)", self.table);
                    }
                    true
                }
            };
            if idle {
                future::or(control.stopped(), async {
                    CallerRuntime.sleep(self.poll_interval).await;
                })
                .await;
            }
        }
        Ok(())
    }

    /// One round: claim a batch, hand each row to the handler while the
    /// claim's deadline allows, complete each under the claim. Returns
    /// the rows claimed.
    async fn round<F, Fut, E>(
        &self,
        session: &Session<'_>,
        classifier: Classifier<E>,
        handler: &mut F,
        stats: &mut PgQueueStats,
    ) -> Result<usize, PgQueueError>
    where
        F: FnMut(PgMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        // Both fit: checked when set.
        let batch = i64::try_from(self.batch).unwrap_or(i64::MAX);
        let lease = i64::try_from(self.claim_lease.as_micros()).unwrap_or(i64::MAX);
        // Taken before the claim is sent: the server's lease starts later.
        let sent_at = CallerRuntime.now();
        let Session { client, statements } = *session;
        let rows = timed(
            "claim",
            client.query(&statements.claim, &[&batch, &self.consumer, &lease]),
        )
        .await?;
        let deadline = ClaimDeadline::new(sent_at, self.claim_lease);
        let claimed = rows.len();
        stats.claimed += claimed as u64;
        let mut messages = match rows.iter().map(message).collect::<Result<Vec<_>, _>>() {
            Ok(messages) => messages,
            Err(e) => {
                // A table whose columns are not the documented ones: the
                // rows return after the lease.
                stats.unfinished += claimed as u64;
                return Err(PgQueueError::query("claim", e));
            }
        };
        messages.sort_unstable_by_key(|m| m.id);
        let mut messages = messages.into_iter();
        while let Some(message) = messages.next() {
            // Checked where the side effect happens, before every row: a
            // consumer paused past its lease hands nothing over after
            // resuming (the rows may be another consumer's by then).
            if !deadline.allows_start(CallerRuntime.now()) {
                let late = 1 + messages.len();
                stats.expired_unstarted += late as u64;
                for _ in 0..late {
                    guard_std::metrics::record_refused_late(&self.table);
                }
                tracing::warn!(
                    "table {}: {late} claimed rows not started before the claim's deadline (lease {:?}); they return when the lease ends",
                    self.table,
                    self.claim_lease
                );
                break;
            }
            let (verdict, completion) = self.deliver(session, classifier, handler, &message).await;
            match completion {
                Completion::Done => match verdict {
                    Verdict::Handled => stats.handled += 1,
                    Verdict::GaveUp => stats.dead_lettered += 1,
                    Verdict::TooManyDeliveries => {
                        stats.dead_lettered += 1;
                        stats.too_many_deliveries += 1;
                    }
                },
                Completion::LostClaim => {
                    stats.lost_claim += 1;
                    tracing::warn!(
                        "table {}: row {}: claim {} ended and the row was claimed again before it was {}; not removed by this consumer (it may be handled twice)",
                        self.table,
                        message.id,
                        message.claim_token,
                        if verdict == Verdict::Handled {
                            "deleted"
                        } else {
                            "dead-lettered"
                        }
                    );
                }
                Completion::Failed(e) => {
                    stats.unfinished += 1;
                    tracing::error!(
                        "table {}: row {}: {e}; it returns when its lease ends and is handled again",
                        self.table,
                        message.id
                    );
                    if e.connection_lost() || client.is_closed() {
                        // The rest of the batch returns with it.
                        stats.unfinished += messages.len() as u64;
                        return Err(e);
                    }
                }
            }
        }
        Ok(claimed)
    }

    /// Hands one row to the handler (unless it has been claimed too
    /// often) and completes it: deleted if handled, dead-lettered if
    /// given up. Says where it was to go and whether it went.
    async fn deliver<F, Fut, E>(
        &self,
        session: &Session<'_>,
        classifier: Classifier<E>,
        handler: &mut F,
        message: &PgMessage,
    ) -> (Verdict, Completion)
    where
        F: FnMut(PgMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        if message.deliveries_exceed(self.max_deliveries) {
            let error = format!(
                "claimed {} times, more than the {} deliveries allowed, without being completed: its handler never returned (a crash, or handling that outlived the claim lease)",
                message.deliveries, self.max_deliveries
            );
            let completion = self.dead_letter(session, message, &error, 0).await;
            return (Verdict::TooManyDeliveries, completion);
        }
        let handled =
            deliver::handle(self.retry, classifier, &self.table, message, &mut *handler).await;
        match handled {
            Ok(()) => {
                let deleted = timed(
                    "complete",
                    session.client.execute(
                        &session.statements.complete,
                        &[&message.id, &message.claim_token],
                    ),
                )
                .await;
                let completion = match deleted {
                    Ok(0) => Completion::LostClaim,
                    Ok(_) => Completion::Done,
                    Err(e) => Completion::Failed(e),
                };
                (Verdict::Handled, completion)
            }
            Err(gave_up) => {
                let attempts = i32::try_from(gave_up.attempts).unwrap_or(i32::MAX);
                let completion = self
                    .dead_letter(session, message, &gave_up.error, attempts)
                    .await;
                (Verdict::GaveUp, completion)
            }
        }
    }

    /// Moves `message`'s row to the dead-letter table with `error` and
    /// `attempts`, in one statement and only under this claim.
    async fn dead_letter(
        &self,
        session: &Session<'_>,
        message: &PgMessage,
        error: &str,
        attempts: i32,
    ) -> Completion {
        let moved = timed(
            "dead letter",
            session.client.execute(
                &session.statements.dead_letter,
                &[
                    &message.id,
                    &message.claim_token,
                    &self.table,
                    &error,
                    &attempts,
                ],
            ),
        )
        .await;
        match moved {
            Ok(0) => Completion::LostClaim,
            Ok(_) => {
                tracing::warn!(
                    "table {}: row {} dead-lettered to {} after {attempts} attempts: {error}",
                    self.table,
                    message.id,
                    self.dead_letters
                );
                Completion::Done
            }
            Err(e) => Completion::Failed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_that_requires_tls_is_refused() {
        let err = PgQueue::new("postgres://db/app?sslmode=require", "jobs").unwrap_err();
        assert!(
            matches!(
                &err,
                PgQueueError::InvalidInput(crate::InvalidInput {
                    parameter: Parameter::ServerUrl,
                    ..
                })
            ),
            "{err}"
        );
        assert!(err.to_string().contains("sslmode"), "{err}");
    }

    #[test]
    fn an_unparsable_url_keeps_the_parser_s_error_and_hides_the_password() {
        let err = PgQueue::new("postgres://app:secret@db:notaport/app", "jobs").unwrap_err();
        let text = err.to_string();
        assert!(!text.contains("secret"), "{text}");
        assert!(std::error::Error::source(&err).is_some(), "{err:?}");
    }

    #[test]
    fn a_long_table_is_refused_so_its_dead_letter_table_fits() {
        let table = "t".repeat(sql::MAX_TABLE + 1);
        let err = PgQueue::new("postgres://db/app", &table).unwrap_err();
        assert!(err.to_string().contains("at most 50 bytes"), "{err}");
        assert!(PgQueue::new("postgres://db/app", &table[1..]).is_ok());
    }

    #[test]
    fn the_dead_letter_table_must_be_another_table() {
        let queue = PgQueue::new("postgres://db/app", "jobs").expect("queue");
        assert_eq!(queue.dead_letter_table(), "jobs_dead_letters");
        let err = queue.clone().with_dead_letter_table("jobs").unwrap_err();
        assert!(matches!(
            &err,
            PgQueueError::InvalidInput(crate::InvalidInput {
                parameter: Parameter::Table,
                ..
            })
        ));
        let queue = queue
            .with_dead_letter_table("failed")
            .expect("another table");
        assert_eq!(queue.dead_letter_table(), "failed");
    }

    #[test]
    fn queues_of_one_process_get_different_default_names() {
        let a = PgQueue::new("postgres://db/app", "jobs").expect("queue");
        let b = PgQueue::new("postgres://db/app", "jobs").expect("queue");
        assert_ne!(a.consumer, b.consumer);
    }
}

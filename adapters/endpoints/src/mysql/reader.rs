//! The elected binlog reader.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures_lite::{StreamExt, future};
use guard_core::guard::ActiveConfig;
use guard_core::lock::Scope;
use guard_core::retry::{Classifier, RetryPolicy};
use guard_std::GuardConfig;
use guard_std::run::CallerRuntime;
use guard_std::run::{Control, Runtime as _};
use mysql_async::binlog::events::{EventData, RowsEventData};
use mysql_async::binlog::value::BinlogValue;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Opts, OptsBuilder, Value};

use super::checkpoint::{BinlogPosition, CheckpointError, Checkpoints};
use super::{
    BinlogError, ChangeKind, ColumnValue, DEFAULT_CHECKPOINT_TABLE, DEFAULT_DEAD_LETTER_TABLE,
    DEFAULT_HEARTBEAT, DEFAULT_REQUEST_TIMEOUT, HEARTBEATS_BEFORE_DEAD, RowChange,
    checked_identifier,
};
use crate::deliver::{self, GaveUp};
use crate::delivery::{self, Delivered, ElectedLease, UnhandledReason};
use crate::elected::serve_while_leading;
use crate::link::Link;
use crate::parameter::{Parameter, redacted};
use crate::runtime::ActiveRunner;
use crate::runtime::on_tokio;

/// Where a reader without a checkpoint starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Start {
    /// At the server's current end of the binlog: changes from now on.
    #[default]
    Current,
    /// At the server's first binlog still kept.
    Beginning,
}

/// What a reader did, counted from its start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BinlogStats {
    /// Row changes the handler took.
    pub handled: u64,
    /// Row changes whose retries were spent, written to the dead-letter
    /// table.
    pub dead_lettered: u64,
    /// Checkpoints saved.
    pub checkpoints: u64,
    /// Checkpoints refused because a newer leader owns the position.
    pub checkpoints_refused: u64,
    /// Row changes read while the lease was past its renew deadline or
    /// gone: not handed over (the next leader reads them again from the
    /// checkpoint).
    pub refused_late: u64,
    /// Row changes whose lease ended while they were handled (between
    /// retries, or before their dead letter could be written under it):
    /// neither handled nor dead-lettered, left to the next leader, which
    /// reads them again from the checkpoint.
    pub lease_lost: u64,
}

#[derive(Default)]
struct Counters {
    handled: Cell<u64>,
    dead_lettered: Cell<u64>,
    checkpoints: Cell<u64>,
    checkpoints_refused: Cell<u64>,
    refused_late: Cell<u64>,
    lease_lost: Cell<u64>,
}

impl Counters {
    fn add(counter: &Cell<u64>) {
        counter.set(counter.get() + 1);
    }

    fn stats(&self) -> BinlogStats {
        BinlogStats {
            handled: self.handled.get(),
            dead_lettered: self.dead_lettered.get(),
            checkpoints: self.checkpoints.get(),
            checkpoints_refused: self.checkpoints_refused.get(),
            refused_late: self.refused_late.get(),
            lease_lost: self.lease_lost.get(),
        }
    }
}

/// A binlog stream opened under a lease: the stream, a second connection
/// for checkpoints and dead letters, and where the stream starts.
struct Opened {
    stream: BinlogStream,
    conn: Conn,
    from: BinlogPosition,
    fence: u64,
    /// Whether the server ends its binlog events with a checksum.
    checksummed: bool,
}

/// The row changes of one database server, read by the replica that holds
/// the lease; see the [module documentation](super).
///
/// ```no_run
/// # smol::block_on(async {
/// use guard_core::retry::Classifier;
/// use guard_endpoints::mysql::BinlogReader;
/// use guard_std::{GuardConfig, LocalLocker, SharedLocker};
///
/// let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
/// let scope = config.scope("endpoint/binlog")?;
/// let reader = BinlogReader::new("mysql://root@127.0.0.1:3306/app", "orders-cdc", &config, &scope)?;
/// let (_handle, control) = guard_smol::control();
/// reader
///     .run(control, Classifier::retry_all(), |change| async move {
///         println!("{} {}.{} {:?}", change.kind.name(), change.database, change.table, change.after);
///         Ok::<(), String>(())
///     })
///     .await;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
pub struct BinlogReader {
    opts: Opts,
    url: String,
    name: String,
    server_id: u32,
    start: Start,
    checkpoints: Checkpoints,
    lock_service: String,
    dead_letters: String,
    checkpoint_every: u32,
    retry: RetryPolicy,
    request_timeout: Duration,
    heartbeat: Duration,
    runner: ActiveRunner,
    link: Option<Link>,
}

impl fmt::Debug for BinlogReader {
    // The server without its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BinlogReader")
            .field("server", &redacted(&self.url))
            .field("name", &self.name)
            .field("server_id", &self.server_id)
            .field("checkpoints", &self.checkpoints)
            .field("lock_service", &self.lock_service)
            .field("checkpoint_every", &self.checkpoint_every)
            .field("request_timeout", &self.request_timeout)
            .field("heartbeat", &self.heartbeat)
            .finish()
    }
}

impl BinlogReader {
    /// A reader named `name` (its checkpoint's key; the same on every
    /// replica) of the server at `url` (`mysql://user:password@host:port/db`:
    /// the checkpoint and dead-letter tables live in `db`), elected under
    /// `config`'s locker in `scope`. Server id 4000 + a hash of the name
    /// unless set (one per reader name: the server drops an older
    /// connection with the same id), start at the current end of the
    /// binlog, a checkpoint after every transaction, the original's
    /// retry policy, requests that wait at most
    /// [`DEFAULT_REQUEST_TIMEOUT`](super::DEFAULT_REQUEST_TIMEOUT) and a
    /// heartbeat every [`DEFAULT_HEARTBEAT`](super::DEFAULT_HEARTBEAT). A
    /// refused URL is named in the error with its password hidden.
    pub fn new(
        url: &str,
        name: &str,
        config: &GuardConfig,
        scope: &Scope,
    ) -> Result<Self, BinlogError> {
        let opts = Opts::from_url(url).map_err(|e| {
            BinlogError::invalid(
                Parameter::ServerUrl,
                redacted(url),
                format!("must be mysql://user:password@host:port/database ({e})"),
            )
        })?;
        if opts.db_name().is_none() {
            return Err(BinlogError::invalid(
                Parameter::ServerUrl,
                redacted(url),
                "must name a database (its checkpoint and dead-letter tables live there)",
            ));
        }
        if name.is_empty() || name.len() > 191 {
            return Err(BinlogError::invalid(
                Parameter::Checkpoint,
                name,
                "must be from 1 to 191 bytes",
            ));
        }
        // Rows matched, not changed: a checkpoint saved twice at the same
        // position is not a refusal.
        let opts: Opts = OptsBuilder::from_opts(opts).client_found_rows(true).into();
        let hash = name
            .bytes()
            .fold(0_u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        Ok(BinlogReader {
            opts,
            url: url.to_owned(),
            name: name.to_owned(),
            server_id: 4000 + hash % 1_000_000,
            start: Start::Current,
            checkpoints: Checkpoints::new(DEFAULT_CHECKPOINT_TABLE),
            // Without a locker every reader leads with fence 0: a lease
            // of its own, so that one with a locker takes over, and back.
            lock_service: if config.locker().is_none() {
                "none".to_owned()
            } else {
                String::new()
            },
            dead_letters: DEFAULT_DEAD_LETTER_TABLE.to_owned(),
            checkpoint_every: 1,
            retry: RetryPolicy::new(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            heartbeat: DEFAULT_HEARTBEAT,
            runner: ActiveRunner::new(config, scope).map_err(BinlogError::Guard)?,
            link: None,
        })
    }

    /// Lease timing; validated.
    pub fn with_guard_settings(mut self, settings: ActiveConfig) -> Result<Self, BinlogError> {
        self.runner = self
            .runner
            .with_settings(settings)
            .map_err(BinlogError::Guard)?;
        Ok(self)
    }

    /// The server id the reader registers with (not 0, and not the id of
    /// any server or other reader of the same server).
    pub fn with_server_id(mut self, id: u32) -> Result<Self, BinlogError> {
        if id == 0 {
            return Err(BinlogError::invalid(
                Parameter::ServerUrl,
                "server id 0",
                "a replica's server id must not be 0",
            ));
        }
        self.server_id = id;
        Ok(self)
    }

    /// Where a reader without a checkpoint starts.
    pub fn with_start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// The checkpoints table (a plain SQL identifier).
    pub fn with_checkpoint_table(mut self, table: &str) -> Result<Self, BinlogError> {
        self.checkpoints = Checkpoints::new(&checked_identifier(Parameter::Table, table)?);
        Ok(self)
    }

    /// Names the lock service the reader's locker uses (1 to 200 bytes,
    /// no control characters), for the checkpoint: its fences are
    /// compared only with fences of the same lock service and lease key
    /// (see [`Checkpoints`]). Name what draws the fences: the kind, and
    /// the instance where another instance of that kind starts its fences
    /// again (`redis`, `postgres:<table>`, a process's own in-process
    /// locker with something unique to the process). Unnamed, every
    /// reader with a locker is taken to use one lock service (`none`
    /// without a locker); a reader whose lock service changes (Redis to
    /// PostgreSQL, say) must be named, or its new fences, far below the
    /// old ones, are refused.
    pub fn with_lock_service(mut self, name: &str) -> Result<Self, BinlogError> {
        if name.is_empty() || name.len() > 200 || name.contains(char::is_control) {
            return Err(BinlogError::invalid(
                Parameter::LockService,
                name,
                "must be from 1 to 200 bytes without control characters",
            ));
        }
        self.lock_service = name.to_owned();
        Ok(self)
    }

    /// The lease a checkpoint is written under: the lock service and the
    /// lease key (a locker orders fences per key only).
    pub fn checkpoint_lease(&self) -> String {
        if self.lock_service.is_empty() {
            self.key().to_owned()
        } else {
            format!("{} {}", self.lock_service, self.key())
        }
    }

    /// The dead-letter table (a plain SQL identifier).
    pub fn with_dead_letter_table(mut self, table: &str) -> Result<Self, BinlogError> {
        self.dead_letters = checked_identifier(Parameter::Table, table)?;
        Ok(self)
    }

    /// A checkpoint after every `transactions` transactions (at least 1):
    /// fewer writes, more changes handled again after a takeover.
    pub fn with_checkpoint_every(mut self, transactions: u32) -> Result<Self, BinlogError> {
        if transactions == 0 {
            return Err(BinlogError::invalid(
                Parameter::Checkpoint,
                "every 0 transactions",
                "must be at least 1",
            ));
        }
        self.checkpoint_every = transactions;
        Ok(self)
    }

    /// How a failing handler is retried before the change is
    /// dead-lettered. Endpoints draw no random bits, so a policy with
    /// jitter is refused.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Result<Self, BinlogError> {
        self.retry = deliver::checked(policy).map_err(BinlogError::InvalidInput)?;
        Ok(self)
    }

    /// How long each request (connecting, a query, claiming or saving the
    /// checkpoint, a dead letter, requesting the stream) waits for the
    /// server's answer before its connection is given up and the reader
    /// steps down (more than zero; default
    /// [`DEFAULT_REQUEST_TIMEOUT`](super::DEFAULT_REQUEST_TIMEOUT)). A
    /// connection that died silently answers nothing, ever: this bounds
    /// how long it holds the lease. Longer than the slowest statement the
    /// server may take (a checkpoint behind a lock), or the reader steps
    /// down while the server is merely slow.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Result<Self, BinlogError> {
        if timeout.is_zero() {
            return Err(BinlogError::invalid(
                Parameter::RequestTimeout,
                format!("{timeout:?}"),
                "must be more than zero",
            ));
        }
        self.request_timeout = timeout;
        Ok(self)
    }

    /// How often the server sends a heartbeat on the stream while it has
    /// no event to send (from 1 ms to 1 hour; default
    /// [`DEFAULT_HEARTBEAT`](super::DEFAULT_HEARTBEAT)). A stream with no
    /// event, heartbeats included, for
    /// [`HEARTBEATS_BEFORE_DEAD`](super::HEARTBEATS_BEFORE_DEAD) periods
    /// ([`read_timeout`](Self::read_timeout)) is taken for dead and the
    /// reader steps down: shorter notices a dead connection sooner, at a
    /// heartbeat's few bytes per period.
    pub fn with_heartbeat(mut self, period: Duration) -> Result<Self, BinlogError> {
        if period < Duration::from_millis(1) || period > Duration::from_secs(3_600) {
            return Err(BinlogError::invalid(
                Parameter::Heartbeat,
                format!("{period:?}"),
                "must be from 1 ms to 1 hour",
            ));
        }
        self.heartbeat = period;
        Ok(self)
    }

    /// Reports the connection to `link` (see [`crate::link`]): down from
    /// a promotion whose stream cannot be opened, up from one that opens
    /// it or a demotion (a standby reads nothing).
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = Some(link);
        self
    }

    /// How long the stream waits for an event, a heartbeat included,
    /// before its connection is taken for dead:
    /// [`HEARTBEATS_BEFORE_DEAD`](super::HEARTBEATS_BEFORE_DEAD) heartbeat
    /// periods.
    pub fn read_timeout(&self) -> Duration {
        self.heartbeat * HEARTBEATS_BEFORE_DEAD
    }

    /// The checkpoints table.
    pub fn checkpoints(&self) -> &Checkpoints {
        &self.checkpoints
    }

    /// The reader's name: its checkpoint's key.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        self.runner.key()
    }

    /// Runs until `control` stops it: reads while this replica leads and
    /// calls `handler` for each row change, one at a time, in binlog
    /// order. Returns what it did.
    pub async fn run<F, Fut, E>(
        &self,
        control: Control,
        classifier: Classifier<E>,
        handler: F,
    ) -> BinlogStats
    where
        F: FnMut(RowChange) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let counters = Counters::default();
        let handler = RefCell::new(handler);
        let what = format!("binlog {}", self.name);
        let source = Source {
            opts: self.opts.clone(),
            name: self.name.clone(),
            server_id: self.server_id,
            start: self.start,
            checkpoints: self.checkpoints.clone(),
            dead_letters: self.dead_letters.clone(),
            request_timeout: self.request_timeout,
            heartbeat: self.heartbeat,
        };
        let lease = self.checkpoint_lease();
        let open = move |fence| {
            let (source, lease) = (source.clone(), lease.clone());
            on_tokio(async move { open(&source, (&lease, fence)).await })
        };
        let (handler, counters) = (&handler, &counters);
        let serve = move |opened, lease| self.serve(opened, lease, classifier, handler, counters);
        let link = self.link.clone().unwrap_or_else(|| Link::new(&what));
        serve_while_leading(&self.runner, control, &what, &link, open, serve).await;
        counters.stats()
    }

    /// Reads one opened stream until it ends, the lease is found invalid
    /// or a checkpoint is refused.
    async fn serve<F, Fut, E>(
        &self,
        opened: Opened,
        lease: ElectedLease,
        classifier: Classifier<E>,
        handler: &RefCell<F>,
        counters: &Counters,
    ) where
        F: FnMut(RowChange) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let Opened {
            mut stream,
            mut conn,
            from,
            fence,
            checksummed,
        } = opened;
        tracing::info!(
            "binlog {}: reading from {from} under fence {fence}",
            self.name
        );
        let mut file = from.file.clone();
        // The reader's own writes are in the binlog too: never handed
        // over, and never a reason for a checkpoint (which would log a
        // change of its own, and so on).
        let own = OwnTables {
            database: self.opts.db_name().unwrap_or_default().to_owned(),
            tables: [
                self.checkpoints.table().to_owned(),
                self.dead_letters.clone(),
            ],
        };
        let mut handed_since_save = false;
        // A stream starts at a transaction's end (a checkpoint) or a
        // file's start.
        let mut in_transaction = false;
        let mut transactions = 0_u32;
        let mut unsaved: Option<BinlogPosition> = None;
        let lease_name = self.checkpoint_lease();
        let read_timeout = self.read_timeout();
        loop {
            // The server sends a heartbeat whenever it has had nothing to
            // send for a period, so silence for several periods means a
            // dead connection, which would otherwise hold the lease while
            // reading nothing: stop, which steps down.
            let event = match within(read_timeout, on_tokio(stream.next())).await {
                Ok(Some(Ok(event))) => event,
                Ok(Some(Err(e))) => {
                    tracing::warn!("binlog {}: {e}", self.name);
                    break;
                }
                Ok(None) => break,
                Err(Elapsed) => {
                    tracing::warn!(
                        "binlog {}: no event, heartbeats included, for {read_timeout:?}: the connection is taken for dead; stopping",
                        self.name
                    );
                    break;
                }
            };
            let end = u64::from(event.header().log_pos());
            // Decoded in full before any await: the event and the
            // stream's table maps are borrowed.
            let decoded = decode(
                &event,
                &stream,
                (&file, end),
                checksummed,
                &own,
                &mut in_transaction,
            );
            let (changes, boundary) = match decoded {
                Ok(Decoded::Rotate(next)) => {
                    file = next;
                    continue;
                }
                Ok(Decoded::Changes(changes)) => (changes, false),
                Ok(Decoded::Boundary) => (Vec::new(), true),
                Ok(Decoded::Other) => continue,
                Err(e) => {
                    tracing::error!(
                        "binlog {}: {file}:{end}: cannot decode ({e}); stopping",
                        self.name
                    );
                    break;
                }
            };
            for mut change in changes {
                change.fence = lease.fence();
                change.lease = Some(lease.clone());
                // The one elected delivery path: the lease checked before
                // the call, each retry and the dead letter.
                let delivered = delivery::deliver(
                    self.retry,
                    classifier,
                    &self.name,
                    Some(&lease),
                    &change,
                    |c| {
                        // Borrowed only to make the call's future.
                        (handler.borrow_mut())(c)
                    },
                )
                .await;
                handed_since_save = true;
                match delivered {
                    Delivered::Handled => Counters::add(&counters.handled),
                    // Written at once: the lease was valid when this was
                    // decided.
                    Delivered::GaveUp(gave_up) => {
                        if let Err(e) = self.dead_letter(&mut conn, &change, &gave_up).await {
                            // Not past it: the next leader reads it again.
                            tracing::error!(
                                "binlog {}: {} {gave_up}; the dead-letter table failed ({e}); stopping",
                                self.name,
                                change.position
                            );
                            return;
                        }
                        Counters::add(&counters.dead_lettered);
                        tracing::warn!(
                            "binlog {}: {} {gave_up}; dead-lettered",
                            self.name,
                            change.position
                        );
                    }
                    // The binlog keeps it: past the checkpoint, the next
                    // leader reads it again, so it is neither dead-lettered
                    // nor handed anywhere by this reader.
                    Delivered::Unhandled(reason) => {
                        match reason {
                            UnhandledReason::LeaseLost { .. } => {
                                Counters::add(&counters.lease_lost);
                            }
                            _ => Counters::add(&counters.refused_late),
                        }
                        tracing::warn!(
                            "binlog {}: {}: not handled, {reason}; stopping (the next leader reads it again from the checkpoint)",
                            self.name,
                            change.position
                        );
                        return;
                    }
                }
            }
            if boundary && handed_since_save {
                handed_since_save = false;
                transactions += 1;
                unsaved = Some(BinlogPosition {
                    file: file.clone(),
                    pos: end,
                });
            }
            if transactions >= self.checkpoint_every
                && let Some(position) = unsaved.take()
            {
                transactions = 0;
                // A checkpoint is a side effect: made only under the lease
                // (the table's fence refuses a stale one as well).
                if !lease.is_valid() {
                    Counters::add(&counters.refused_late);
                    tracing::warn!(
                        "binlog {}: lease no longer valid at checkpoint {position}; stopping",
                        self.name
                    );
                    return;
                }
                let saved = on_tokio(self.checkpoints.save(
                    &mut conn,
                    &self.name,
                    &position,
                    &lease_name,
                    fence,
                ));
                match within(self.request_timeout, saved).await {
                    Ok(Ok(())) => Counters::add(&counters.checkpoints),
                    Err(Elapsed) => {
                        tracing::warn!(
                            "binlog {}: checkpoint {position}: no answer within {:?}; stopping",
                            self.name,
                            self.request_timeout
                        );
                        return;
                    }
                    Ok(Err(CheckpointError::Stale { .. })) => {
                        Counters::add(&counters.checkpoints_refused);
                        tracing::warn!(
                            "binlog {}: checkpoint {position} refused under fence {fence}: a newer reader leads; stopping",
                            self.name
                        );
                        return;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!("binlog {}: {e}; stopping", self.name);
                        return;
                    }
                }
            }
        }
    }

    /// Records a given-up change in the dead-letter table, waiting at
    /// most the request timeout.
    async fn dead_letter(
        &self,
        conn: &mut Conn,
        change: &RowChange,
        gave_up: &GaveUp,
    ) -> Result<(), BinlogError> {
        let row = change.after.as_ref().or(change.before.as_ref());
        let insert = on_tokio(conn.exec_drop(
            format!(
                "INSERT INTO `{}` (reader, file, pos, row_index, db, tbl, kind, row_values, error, attempts) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                self.dead_letters
            ),
            (
                &self.name,
                &change.position.file,
                change.position.pos,
                change.row,
                &change.database,
                &change.table,
                change.kind.name(),
                row.map(|values| json_array(values)),
                &gave_up.error,
                gave_up.attempts,
            ),
        ));
        within(self.request_timeout, insert)
            .await
            .map_err(|Elapsed| BinlogError::timeout("dead letter", self.request_timeout))?
            .map_err(|e| BinlogError::server("dead letter", e))
    }

    /// The server's URL, password included: for connecting, never for
    /// printing (the reader's `Debug` hides it).
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// What [`open`] needs of a reader, owned: it runs on the lease task.
#[derive(Clone)]
struct Source {
    opts: Opts,
    name: String,
    server_id: u32,
    start: Start,
    checkpoints: Checkpoints,
    dead_letters: String,
    request_timeout: Duration,
    heartbeat: Duration,
}

/// No answer within a limit.
struct Elapsed;

/// `work`'s output, or [`Elapsed`] once `limit` has passed without it.
/// A connection that died silently (no FIN, no RST) answers nothing,
/// ever: every wait on the server goes through here, so none holds the
/// lease past its limit.
async fn within<F: Future>(limit: Duration, work: F) -> Result<F::Output, Elapsed> {
    future::or(async { Ok(work.await) }, async {
        CallerRuntime.sleep(limit).await;
        Err(Elapsed)
    })
    .await
}

/// `work` (`what`, in errors), within the request timeout `limit`.
async fn request<T, E>(
    limit: Duration,
    what: &str,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, BinlogError>
where
    E: std::error::Error + Send + Sync + 'static,
{
    within(limit, work)
        .await
        .map_err(|Elapsed| BinlogError::timeout(what, limit))?
        .map_err(|e| BinlogError::server(what, e))
}

/// Connects twice (a stream and a connection for writes), checks the
/// binlog format, claims the checkpoint under `fence` of `lease`, finds
/// where to start, and requests the stream from there, with a heartbeat.
/// Each request waits at most the request timeout.
async fn open(source: &Source, (lease, fence): (&str, u64)) -> Result<Opened, BinlogError> {
    let Source {
        opts,
        name,
        server_id,
        start,
        checkpoints,
        dead_letters,
        request_timeout: limit,
        heartbeat,
    } = source;
    let limit = *limit;
    let mut conn = request(limit, "connect", Conn::new(opts.clone())).await?;
    let format: Option<String> = request(
        limit,
        "binlog_format",
        conn.query_first("SELECT @@GLOBAL.binlog_format"),
    )
    .await?;
    if format.as_deref() != Some("ROW") {
        return Err(BinlogError::server(
            "binlog_format",
            std::io::Error::other(format!(
                "the server logs {format:?}, a reader needs binlog_format = ROW"
            )),
        ));
    }
    let checksum: Option<String> = request(
        limit,
        "binlog_checksum",
        conn.query_first("SELECT @@GLOBAL.binlog_checksum"),
    )
    .await?;
    let checksummed = checksum.is_some_and(|c| !c.eq_ignore_ascii_case("NONE"));
    request(limit, "checkpoints", checkpoints.create(&mut conn)).await?;
    request(
        limit,
        "dead-letter table",
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS `{dead_letters}` (\
             id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, reader VARCHAR(191) NOT NULL, \
             file VARCHAR(255) NOT NULL, pos BIGINT UNSIGNED NOT NULL, row_index INT UNSIGNED NOT NULL, \
             db VARCHAR(64) NOT NULL, tbl VARCHAR(64) NOT NULL, kind VARCHAR(8) NOT NULL, \
             row_values LONGTEXT, error TEXT NOT NULL, attempts INT UNSIGNED NOT NULL, \
             failed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))"
        )),
    )
    .await?;
    let claimed = request(
        limit,
        "claim the checkpoint",
        checkpoints.claim(&mut conn, name, lease, fence),
    )
    .await?;
    let from = match (claimed, start) {
        (Some(position), _) => position,
        (None, Start::Beginning) => BinlogPosition {
            file: String::new(),
            pos: 4,
        },
        (None, Start::Current) => {
            let status: Option<mysql_async::Row> = request(
                limit,
                "SHOW MASTER STATUS",
                conn.query_first("SHOW MASTER STATUS"),
            )
            .await?;
            let status = status.ok_or_else(|| {
                BinlogError::server(
                    "SHOW MASTER STATUS",
                    std::io::Error::other("the server keeps no binlog (log_bin is off)"),
                )
            })?;
            let file: Option<String> = status.get(0);
            let pos: Option<u64> = status.get(1);
            let position = BinlogPosition {
                file: file.unwrap_or_default(),
                pos: pos.unwrap_or(4),
            };
            // Saved at once: a takeover resumes here, not at a later end.
            request(
                limit,
                "first checkpoint",
                checkpoints.save(&mut conn, name, &position, lease, fence),
            )
            .await?;
            position
        }
    };
    let mut streaming = request(limit, "connect", Conn::new(opts.clone())).await?;
    // MariaDB and MySQL read the period (in nanoseconds) from this
    // session variable when the dump starts, and then send a heartbeat
    // whenever they have had nothing to send for that long: what lets
    // `serve` tell an idle stream from a dead one. The period is at most
    // an hour (`with_heartbeat`), so it fits.
    let period = u64::try_from(heartbeat.as_nanos()).unwrap_or(u64::MAX);
    request(
        limit,
        "heartbeat",
        streaming.query_drop(format!("SET @master_heartbeat_period = {period}")),
    )
    .await?;
    let request_stream = BinlogStreamRequest::new(*server_id)
        .with_filename(from.file.as_bytes())
        .with_pos(from.pos);
    let stream = request(
        limit,
        "binlog stream",
        streaming.get_binlog_stream(request_stream),
    )
    .await?;
    Ok(Opened {
        stream,
        conn,
        from,
        fence,
        checksummed,
    })
}

/// The tables a reader writes itself, in its database.
struct OwnTables {
    database: String,
    tables: [String; 2],
}

impl OwnTables {
    fn contains(&self, database: &str, table: &str) -> bool {
        database == self.database && self.tables.iter().any(|t| t == table)
    }
}

/// What one binlog event means to the reader.
enum Decoded {
    /// The stream moves to this file.
    Rotate(String),
    /// Row changes (fence not yet set).
    Changes(Vec<RowChange>),
    /// A transaction ended: a position the reader can resume from.
    Boundary,
    /// Nothing to act on.
    Other,
}

/// `event`, read at `file`:`end`; `checksummed`: whether the server ends
/// its events with a checksum.
fn decode(
    event: &mysql_async::binlog::events::Event,
    stream: &BinlogStream,
    (file, end): (&str, u64),
    checksummed: bool,
    own: &OwnTables,
    in_transaction: &mut bool,
) -> std::io::Result<Decoded> {
    let Some(data) = event.read_data()? else {
        return Ok(Decoded::Other);
    };
    Ok(match data {
        EventData::RotateEvent(rotate) => {
            // The decoder cuts a checksum off only once it knows there is
            // one (`checksum()` is then set).
            let checksum_left = checksummed && event.checksum().is_none();
            let name = file_name(rotate.name_raw(), checksum_left).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a rotate event names no binlog file: {:?}", rotate.name()),
                )
            })?;
            Decoded::Rotate(name)
        }
        EventData::XidEvent(_) => {
            *in_transaction = false;
            Decoded::Boundary
        }
        // BEGIN opens a transaction; COMMIT or ROLLBACK (a
        // non-transactional table's) ends it. Other statements inside one
        // (SAVEPOINT, and MariaDB's stand-ins for events this client does
        // not ask for: `# Dummy event ...`) end nothing: a checkpoint there
        // would resume without the transaction's table maps. Outside a
        // transaction a statement (DDL) is one of its own.
        EventData::QueryEvent(query) => {
            let text = query.query();
            let text = text.trim();
            if text.eq_ignore_ascii_case("BEGIN") {
                *in_transaction = true;
                Decoded::Other
            } else if text.starts_with('#') {
                Decoded::Other
            } else if !*in_transaction
                || text.eq_ignore_ascii_case("COMMIT")
                || text.eq_ignore_ascii_case("ROLLBACK")
            {
                *in_transaction = false;
                Decoded::Boundary
            } else {
                Decoded::Other
            }
        }
        EventData::RowsEvent(rows) => {
            let Some(table) = stream.get_tme(rows.table_id()) else {
                return Err(std::io::Error::other(format!(
                    "no table map for table id {}",
                    rows.table_id()
                )));
            };
            if own.contains(&table.database_name(), &table.table_name()) {
                return Ok(Decoded::Other);
            }
            let kind = match &rows {
                RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_) => {
                    ChangeKind::Insert
                }
                RowsEventData::DeleteRowsEventV1(_) | RowsEventData::DeleteRowsEvent(_) => {
                    ChangeKind::Delete
                }
                _ => ChangeKind::Update,
            };
            let mut changes = Vec::new();
            for (index, row) in rows.rows(table).enumerate() {
                let (before, after) = row?;
                changes.push(RowChange {
                    database: table.database_name().into_owned(),
                    table: table.table_name().into_owned(),
                    kind,
                    before: before.map(|r| r.unwrap().into_iter().map(column).collect()),
                    after: after.map(|r| r.unwrap().into_iter().map(column).collect()),
                    position: BinlogPosition {
                        file: file.to_owned(),
                        pos: end,
                    },
                    row: u32::try_from(index).unwrap_or(u32::MAX),
                    fence: 0,
                    lease: None,
                });
            }
            Decoded::Changes(changes)
        }
        _ => Decoded::Other,
    })
}

/// A binlog file's name from a rotate event's `raw` name. The server's
/// first (artificial) rotate event comes before the stream's format
/// description, which is what tells the decoder that events end with a
/// checksum: when the server checksums its events, that event's name
/// still ends with the 4 checksum bytes (`checksum_left`), cut off here.
/// Their values are arbitrary (a `.` or digits among them), so only
/// their count tells where the name ends. `None` for a name that is
/// empty, not UTF-8 or has control characters.
fn file_name(raw: &[u8], checksum_left: bool) -> Option<String> {
    let name = if checksum_left {
        raw.get(..raw.len().checked_sub(4)?)?
    } else {
        raw
    };
    let name = std::str::from_utf8(name).ok()?;
    (!name.is_empty() && !name.contains(char::is_control)).then(|| name.to_owned())
}

/// A column's value as bytes: text for what is not already bytes.
fn column(value: BinlogValue<'static>) -> ColumnValue {
    match value {
        BinlogValue::Value(Value::NULL) => None,
        BinlogValue::Value(Value::Bytes(bytes)) => Some(bytes),
        BinlogValue::Value(value) => {
            let text = value.as_sql(true);
            Some(text.trim_matches('\'').as_bytes().to_vec())
        }
        other => match Value::try_from(other) {
            Ok(Value::Bytes(bytes)) => Some(bytes),
            Ok(value) => Some(value.as_sql(true).into_bytes()),
            Err(e) => Some(format!("<{e}>").into_bytes()),
        },
    }
}

/// A JSON array of a row's values: strings (invalid UTF-8 replaced) or
/// null. What the dead-letter table keeps of a row.
pub fn json_array(values: &[ColumnValue]) -> String {
    let mut out = String::from("[");
    for (i, value) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match value {
            None => out.push_str("null"),
            Some(bytes) => {
                out.push('"');
                for c in String::from_utf8_lossy(bytes).chars() {
                    match c {
                        '"' => out.push_str("\\\""),
                        '\\' => out.push_str("\\\\"),
                        c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                        c => out.push(c),
                    }
                }
                out.push('"');
            }
        }
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_kept_as_json_arrays() {
        let row = vec![Some(b"1".to_vec()), None, Some(b"a\"b\\\n".to_vec())];
        assert_eq!(json_array(&row), r#"["1",null,"a\"b\\\u000a"]"#);
    }

    #[test]
    fn a_file_name_loses_the_checksum_left_on_it_whatever_its_bytes() {
        let name = |raw: &[u8], checksum_left| file_name(raw, checksum_left);
        assert_eq!(
            name(b"binlog.000001\\\xef-\x01", true).as_deref(),
            Some("binlog.000001")
        );
        // A checksum with a '.' or digits in it.
        assert_eq!(
            name(b"binlog.000001\\\xef.\x01", true).as_deref(),
            Some("binlog.000001")
        );
        assert_eq!(
            name(b"binlog.0000011234", true).as_deref(),
            Some("binlog.000001")
        );
        assert_eq!(
            name(b"mysql-bin.000012", false).as_deref(),
            Some("mysql-bin.000012")
        );
        assert_eq!(name(b"abc", true), None);
        assert_eq!(name(b"\x01\x02\x03\x04", true), None);
        assert_eq!(name(b"bin\xff.000001", false), None);
    }

    #[test]
    fn columns_are_bytes_or_text() {
        assert_eq!(column(BinlogValue::Value(Value::NULL)), None);
        assert_eq!(
            column(BinlogValue::Value(Value::Int(-3))),
            Some(b"-3".to_vec())
        );
        assert_eq!(
            column(BinlogValue::Value(Value::Bytes(b"x".to_vec()))),
            Some(b"x".to_vec())
        );
    }
}

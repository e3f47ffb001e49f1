//! A fenced lock service on a PostgreSQL lease table, and a claim store
//! and a semaphore beside it.

mod claims;
mod semaphore;

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_compat::Compat;
use guard_core::lock::{
    MAX_KEY_LEN, Renewal, SendLeaseRenewer, SendLocker, Token, TokenId, Ttl, UnlockError,
};
use guard_std::TokenIds;
use tokio_postgres::{Client, Config, NoTls, Statement};

use crate::error::PgLockError;
use crate::server::{redacted, server_name};
use crate::sql::{DEFAULT_TABLE, MAX_TABLE, Statements, identifier_rule};

/// How long a request (connecting included) may take unless configured.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Every this many acquisitions, one first deletes rows whose leases
/// ended more than the purge grace ago ([`PURGE_BATCH`] at most), then
/// asks for its grant: keys taken once (a message id, a schedule slot)
/// would otherwise stay in the table for good.
pub const PURGE_EVERY: u64 = 1_024;

/// The most ended leases one purge deletes.
pub const PURGE_BATCH: i64 = 1_000;

/// How long after its lease ended a key's row is kept, unless configured
/// (at least twice the request timeout, which is also the session's
/// `statement_timeout`): no grant still running can have drawn its fence
/// before a grant whose row a purge removed.
pub const DEFAULT_PURGE_GRACE: Duration = Duration::from_secs(600);

/// One connection with the locker's statements prepared on it.
struct Session {
    client: Client,
    acquire: Statement,
    renew: Statement,
    release: Statement,
    purge: Statement,
    grants_purge: Statement,
    last_fence: Statement,
    claim_begin: Statement,
    claim_extend: Statement,
    claim_settle: Statement,
    claim_purge: Statement,
    /// The semaphores' statements, or why they cannot run here (their
    /// table or function missing and not creatable, or not granted): the
    /// locks and claims work without them.
    permits: Result<PermitStatements, String>,
    /// How many callers wait on the connection (the low bits), and
    /// [`ABANDONED`]: one word, so that no caller enters a connection
    /// once it is abandoned, and the last one out knows it is the last.
    callers: AtomicU64,
}

/// The statements on `<table>_permits`.
struct PermitStatements {
    acquire: Statement,
    renew: Statement,
    release: Statement,
    holders: Statement,
    purge: Statement,
}

/// Set in [`Session::callers`] when a request on the connection timed
/// out: no request is sent on it again and the next one opens another
/// (a hung connection does not report itself closed).
const ABANDONED: u64 = 1 << 63;

impl Session {
    /// A place for a caller on `session`, unless it is abandoned.
    fn enter(session: &Arc<Session>) -> Option<Entered> {
        session
            .callers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |callers| {
                (callers & ABANDONED == 0).then_some(callers + 1)
            })
            .ok()?;
        Some(Entered(Arc::clone(session)))
    }
}

/// A caller's place on a [`Session`], from getting it until the
/// request's answer, timeout or drop.
///
/// PostgreSQL cancels whatever statement runs on a connection, not a
/// given one, and requests of several callers are pipelined on it; so a
/// timed-out statement is cancelled only when the last caller leaves an
/// abandoned connection. Nobody enters it after it is abandoned, so the
/// statements still running there are then only those of callers who
/// gave up: a timeout never cancels a statement another caller waits for.
struct Entered(Arc<Session>);

impl Entered {
    /// Gives the connection up after this caller's request on it timed
    /// out; its statement is cancelled when the last caller leaves.
    fn abandon(&self) {
        self.0.callers.fetch_or(ABANDONED, Ordering::AcqRel);
    }
}

impl Deref for Entered {
    type Target = Session;

    fn deref(&self) -> &Session {
        &self.0
    }
}

impl Drop for Entered {
    /// Leaves the connection; the last caller out of an abandoned one
    /// cancels what still runs on it (from a task; the server's own
    /// `statement_timeout` ends it too). Dropped inside [`Compat`], so a
    /// tokio runtime is at hand.
    fn drop(&mut self) {
        if self.0.callers.fetch_sub(1, Ordering::AcqRel) != ABANDONED | 1 {
            return;
        }
        let cancel = self.0.client.cancel_token();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move {
                if let Err(e) = cancel.cancel_query(NoTls).await {
                    tracing::debug!("PostgreSQL locker: cancelling a timed-out statement: {e}");
                }
            })),
            Err(e) => {
                tracing::debug!(
                    "PostgreSQL locker: no runtime to cancel a timed-out statement on: {e}"
                )
            }
        }
    }
}

/// A `Locker` and `LeaseRenewer` on a PostgreSQL lease table (see
/// [`crate::sql`] for the layout and the statements).
///
/// Acquire, renew and release are one statement each, on one connection
/// that is opened on first use (creating the table unless it exists)
/// and opened again after it fails. Leases run on the server's clock;
/// fences come from a sequence, so they never repeat for any key.
///
/// ```no_run
/// # smol::block_on(async {
/// use guard_core::lock::{Locker, Ttl};
/// use guard_postgres::PgLocker;
///
/// let locker = PgLocker::new("postgres://app@127.0.0.1/app")?;
/// if let Some(token) = locker.try_lock("nightly-report", Ttl::from_secs(30)?).await? {
///     println!("ours, fence {}", token.fence());
///     locker.unlock("nightly-report", &token).await?;
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
pub struct PgLocker {
    config: Config,
    server: String,
    table: String,
    statements: Statements,
    ids: TokenIds,
    request_timeout: Duration,
    purge_grace: Duration,
    session: async_lock::Mutex<Option<Arc<Session>>>,
    acquisitions: AtomicU64,
}

impl fmt::Debug for PgLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLocker")
            .field("server", &self.server)
            .field("table", &self.table)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl PgLocker {
    /// A locker on the server at `url` (a `postgres://` URL or a
    /// `key=value` string, as tokio-postgres reads them; no TLS), on the
    /// table [`DEFAULT_TABLE`], with [`DEFAULT_REQUEST_TIMEOUT`].
    pub fn new(url: &str) -> Result<Self, PgLockError> {
        let mut config: Config = url.parse().map_err(|e: tokio_postgres::Error| {
            PgLockError::invalid("server URL", redacted(url), e.to_string())
        })?;
        if config.get_hosts().is_empty() {
            return Err(PgLockError::invalid(
                "server URL",
                redacted(url),
                "must name a host",
            ));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_REQUEST_TIMEOUT);
        }
        Ok(PgLocker {
            server: server_name(&config),
            config,
            table: DEFAULT_TABLE.to_owned(),
            statements: Statements::new(DEFAULT_TABLE),
            ids: TokenIds::new(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            purge_grace: DEFAULT_PURGE_GRACE,
            session: async_lock::Mutex::new(None),
            acquisitions: AtomicU64::new(0),
        })
    }

    /// Keeps the leases in `table` (a plain SQL identifier of at most
    /// [`MAX_TABLE`] bytes; used quoted, so its case is kept).
    pub fn with_table(mut self, table: &str) -> Result<Self, PgLockError> {
        if let Some(rule) = identifier_rule(table, MAX_TABLE) {
            return Err(PgLockError::invalid("table", table, rule));
        }
        self.table = table.to_owned();
        self.statements = Statements::new(table);
        Ok(self)
    }

    /// How long a request may take, waiting for the connection and
    /// connecting included, before it fails and its connection is given
    /// up (its statement cancelled once no other caller waits on that
    /// connection); at least 1 ms, and less than half the purge grace.
    /// It is also the session's `statement_timeout` and `lock_timeout`,
    /// so the server ends what the client gave up.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Result<Self, PgLockError> {
        if timeout < Duration::from_millis(1) || timeout * 2 > self.purge_grace {
            return Err(PgLockError::invalid(
                "request timeout",
                format!("{timeout:?}"),
                format!(
                    "must be at least 1 ms and at most half the purge grace ({:?})",
                    self.purge_grace
                ),
            ));
        }
        self.request_timeout = timeout;
        self.config.connect_timeout(timeout);
        Ok(self)
    }

    /// How long after its lease ended a key's row is kept before a purge
    /// may delete it (default [`DEFAULT_PURGE_GRACE`]); at least twice the
    /// request timeout, which bounds how long a grant's statement runs.
    pub fn with_purge_grace(mut self, grace: Duration) -> Result<Self, PgLockError> {
        if grace < self.request_timeout * 2 {
            return Err(PgLockError::invalid(
                "purge grace",
                format!("{grace:?}"),
                format!(
                    "must be at least twice the request timeout ({:?})",
                    self.request_timeout
                ),
            ));
        }
        self.purge_grace = grace;
        Ok(self)
    }

    /// The lease table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// `host:port/database`, as errors and logs name the server.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Opens the connection now (creating the table unless it exists),
    /// so that a server that cannot be reached is found at start rather
    /// than at the first grant.
    pub async fn connect(&self) -> Result<(), PgLockError> {
        Compat::new(async {
            let deadline = tokio::time::Instant::now() + self.request_timeout;
            self.session_by(deadline, "connect").await.map(drop)
        })
        .await
    }

    /// Deletes up to [`PURGE_BATCH`] rows whose leases ended, as many
    /// grant records, claim records forgotten and ended permits, more than the
    /// purge grace ago; returns how many. The locker does this by itself
    /// at the start of every [`PURGE_EVERY`]-th acquisition, claim begin
    /// or permit.
    pub async fn purge_expired(&self) -> Result<u64, PgLockError> {
        let grace = i64::try_from(self.purge_grace.as_millis()).unwrap_or(i64::MAX);
        self.request("purge", async |s: &Session| {
            let locks = s.client.execute(&s.purge, &[&PURGE_BATCH, &grace]).await?;
            let grants = s
                .client
                .execute(&s.grants_purge, &[&PURGE_BATCH, &grace])
                .await?;
            let claims = s
                .client
                .execute(&s.claim_purge, &[&PURGE_BATCH, &grace])
                .await?;
            let permits = match &s.permits {
                Ok(p) => s.client.execute(&p.purge, &[&PURGE_BATCH, &grace]).await?,
                Err(_) => 0,
            };
            Ok(locks
                .saturating_add(grants)
                .saturating_add(claims)
                .saturating_add(permits))
        })
        .await
    }

    /// Runs `op` on the current session (opened first if there is none
    /// or it has failed), all within the request timeout, on tokio (the
    /// caller's runtime, or async-compat's). A request that times out
    /// abandons its connection, so the next one opens a fresh one; its
    /// statement is cancelled once no caller waits on that connection
    /// (see [`Entered`]).
    async fn request<T>(
        &self,
        statement: &'static str,
        op: impl AsyncFnOnce(&Session) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, PgLockError> {
        Compat::new(async {
            // One deadline for the whole request: waiting behind another
            // request's connect counts too.
            let deadline = tokio::time::Instant::now() + self.request_timeout;
            let session = self.session_by(deadline, statement).await?;
            match tokio::time::timeout_at(deadline, op(&session)).await {
                Ok(answer) => answer.map_err(|e| PgLockError::query(statement, e)),
                Err(_) => {
                    session.abandon();
                    Err(self.timed_out(statement))
                }
            }
        })
        .await
    }

    /// [`session`](Self::session), failed as `statement` if it is not
    /// ready by `deadline`. Polled inside [`Compat`].
    async fn session_by(
        &self,
        deadline: tokio::time::Instant,
        statement: &'static str,
    ) -> Result<Entered, PgLockError> {
        tokio::time::timeout_at(deadline, self.session())
            .await
            .unwrap_or_else(|_| Err(self.timed_out(statement)))
    }

    /// `statement` had no answer within the request timeout.
    fn timed_out(&self, statement: &'static str) -> PgLockError {
        PgLockError::Timeout {
            statement,
            after: self.request_timeout,
        }
    }

    /// A place on the open session, or on a new one. Polled inside
    /// [`Compat`], within a request's deadline.
    async fn session(&self) -> Result<Entered, PgLockError> {
        let mut current = self.session.lock().await;
        if let Some(session) = current.as_ref()
            && !session.client.is_closed()
            && let Some(entered) = Session::enter(session)
        {
            return Ok(entered);
        }
        *current = None;
        let session = Arc::new(self.open().await?);
        *current = Some(Arc::clone(&session));
        // `open` counted its caller in.
        Ok(Entered(session))
    }

    /// Connects, creates the table unless it exists, and prepares the
    /// statements; the session counts its caller in. The connection is
    /// driven by a task of the tokio runtime it was opened on, until the
    /// client is dropped.
    async fn open(&self) -> Result<Session, PgLockError> {
        let (client, connection) =
            self.config
                .connect(NoTls)
                .await
                .map_err(|e| PgLockError::Connect {
                    server: self.server.clone(),
                    source: Arc::new(e),
                })?;
        let server = self.server.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!("PostgreSQL locker connection to {server} ended: {e}");
            }
        });
        // The server ends what a client gave up: a statement or a lock
        // wait outlives no request.
        let ms = self.request_timeout.as_millis();
        client
            .batch_execute(&format!(
                "SET statement_timeout = {ms}; SET lock_timeout = {ms}"
            ))
            .await
            .map_err(|e| PgLockError::query("session settings", e))?;
        // One boolean a row: whether the table exists, whether the role
        // may use it.
        let ask = async |sql: &str, statement: &'static str| {
            client
                .query_one(sql, &[])
                .await
                .and_then(|row| row.try_get::<_, bool>(0))
                .map_err(|e| PgLockError::query(statement, e))
        };
        if !ask(&self.statements.exists, "create table").await? {
            client
                .batch_execute(&self.statements.create)
                .await
                .map_err(|e| PgLockError::query("create table", e))?;
        }
        // A table a DBA made may lack a grant: found here, at the start,
        // rather than as every acquisition failing.
        if !ask(&self.statements.privileges, "check privileges").await? {
            return Err(PgLockError::invalid(
                "table",
                self.table.clone(),
                "the role needs SELECT, INSERT, UPDATE and DELETE on the table, <table>_claims and <table>_grants, and USAGE on its sequence <table>_fence",
            ));
        }
        let prepare = async |sql: &str| {
            client
                .prepare(sql)
                .await
                .map_err(|e| PgLockError::query("prepare", e))
        };
        let acquire = prepare(&self.statements.acquire).await?;
        let renew = prepare(&self.statements.renew).await?;
        let release = prepare(&self.statements.release).await?;
        let purge = prepare(&self.statements.purge).await?;
        let grants_purge = prepare(&self.statements.grants_purge).await?;
        let last_fence = prepare(&self.statements.last_fence).await?;
        Ok(Session {
            claim_begin: prepare(&self.statements.claim_begin).await?,
            claim_extend: prepare(&self.statements.claim_extend).await?,
            claim_settle: prepare(&self.statements.claim_settle).await?,
            claim_purge: prepare(&self.statements.claim_purge).await?,
            permits: self.open_permits(&client).await,
            client,
            acquire,
            renew,
            release,
            purge,
            grants_purge,
            last_fence,
            callers: AtomicU64::new(1),
        })
    }

    /// The semaphores' table and function, made unless they exist, and
    /// their statements prepared; or why not, for a semaphore call to
    /// report (a deployment whose DBA made the lock tables before them
    /// keeps its locks and claims).
    async fn open_permits(&self, client: &Client) -> Result<PermitStatements, String> {
        let table = &self.table;
        let ask = async |sql: &str| {
            client
                .query_one(sql, &[])
                .await
                .and_then(|row| row.try_get::<_, bool>(0))
                .map_err(|e| e.to_string())
        };
        if !ask(&self.statements.permits_exist).await?
            && let Err(e) = client.batch_execute(&self.statements.create_permits).await
        {
            // The failed transaction would refuse every later statement
            // on this connection, the locks' too.
            if let Err(rollback) = client.batch_execute("ROLLBACK").await {
                tracing::warn!("PostgreSQL locker {}: rollback: {rollback}", self.server);
            }
            return Err(format!(
                "{table}_permits and {table}_acquire are missing and could not be made ({e}): run the semaphore part of the layout in guard_postgres::sql as a role that may"
            ));
        }
        if !ask(&self.statements.permit_privileges).await? {
            return Err(format!(
                "the role needs SELECT, INSERT, UPDATE and DELETE on {table}_permits and EXECUTE on the function {table}_acquire"
            ));
        }
        let prepare = async |sql: &str| client.prepare(sql).await.map_err(|e| e.to_string());
        Ok(PermitStatements {
            acquire: prepare(&self.statements.permit_acquire).await?,
            renew: prepare(&self.statements.permit_renew).await?,
            release: prepare(&self.statements.permit_release).await?,
            holders: prepare(&self.statements.permit_holders).await?,
            purge: prepare(&self.statements.permit_purge).await?,
        })
    }

    /// Purges ended leases on every [`PURGE_EVERY`]-th acquisition, as a
    /// request of its own before the grant's; a failure is logged, never
    /// the grant's.
    async fn purge_now_and_then(&self) {
        if self.acquisitions.fetch_add(1, Ordering::Relaxed) % PURGE_EVERY != PURGE_EVERY - 1 {
            return;
        }
        if let Err(e) = self.purge_expired().await {
            tracing::warn!(
                "PostgreSQL locker {}: purging ended leases: {e}",
                self.server
            );
        }
    }
}

/// `key`, if a lock key can be it: non-empty, at most [`MAX_KEY_LEN`]
/// bytes, without NUL (which PostgreSQL's text refuses).
fn checked_key(key: &str) -> Result<&str, PgLockError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN || key.contains('\0') {
        return Err(PgLockError::invalid(
            "lock key",
            key,
            format!("must be 1 to {MAX_KEY_LEN} bytes without NUL"),
        ));
    }
    Ok(key)
}

/// The TTL in milliseconds as the statements take it (rounded up, so the
/// server never holds a lock for less than asked).
fn ttl_millis(ttl: Ttl) -> i64 {
    i64::try_from(ttl.as_millis_ceil()).unwrap_or(i64::MAX)
}

/// The count a renewal or a release answers (its statement's one row).
fn counted(row: &tokio_postgres::Row, statement: &str) -> Result<u64, PgLockError> {
    let count: i64 = row
        .try_get(0)
        .map_err(|e| PgLockError::UnexpectedReply(format!("{statement}: {e}")))?;
    u64::try_from(count)
        .map_err(|_| PgLockError::UnexpectedReply(format!("{statement}: count {count}")))
}

/// A token's fence as the table keeps it; a fence past `i64::MAX` was
/// never issued by the sequence, so it holds nothing.
fn stored_fence(token: &Token) -> Option<i64> {
    i64::try_from(token.fence()).ok()
}

impl SendLocker for PgLocker {
    type Error = PgLockError;

    fn is_invalid_input(error: &PgLockError) -> bool {
        matches!(error, PgLockError::InvalidInput { .. })
    }

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, PgLockError> {
        let key = checked_key(key)?;
        // Purge before the grant, so the grant is the last step awaited: a
        // caller that drops this future while the purge runs was granted
        // nothing, and no key is left held for its TTL with its token
        // nowhere (only the acquire request's own window remains, as for
        // any request given up in flight).
        self.purge_now_and_then().await;
        let id = self.ids.next_id();
        let (token, millis) = (&id.0[..], ttl_millis(ttl));
        let row = self
            .request("acquire", async |s: &Session| {
                s.client
                    .query_opt(&s.acquire, &[&key, &token, &millis])
                    .await
            })
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let fence: i64 = row
            .try_get(0)
            .map_err(|e| PgLockError::UnexpectedReply(format!("acquire: {e}")))?;
        match u64::try_from(fence) {
            Ok(fence) if fence > 0 => Ok(Some(Token::new(id, fence))),
            _ => Err(PgLockError::UnexpectedReply(format!("fence {fence}"))),
        }
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<PgLockError>> {
        let key = checked_key(key).map_err(UnlockError::Backend)?;
        let Some(fence) = stored_fence(token) else {
            return Err(UnlockError::NotHeld);
        };
        let id: &TokenId = token.id();
        let released = self
            .request("release", async |s: &Session| {
                s.client
                    .query_one(&s.release, &[&key, &&id.0[..], &fence])
                    .await
            })
            .await
            .and_then(|row| counted(&row, "release"))
            .map_err(UnlockError::Backend)?;
        // None released: not ours, or ours but ended (another holder may
        // have had the key meanwhile, so this unlock released nothing live).
        if released == 1 {
            Ok(())
        } else {
            Err(UnlockError::NotHeld)
        }
    }
}

impl SendLeaseRenewer for PgLocker {
    async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, PgLockError> {
        let key = checked_key(key)?;
        let Some(fence) = stored_fence(token) else {
            return Ok(Renewal::Lost);
        };
        let (id, millis) = (&token.id().0[..], ttl_millis(ttl));
        let renewed = self
            .request("renew", async |s: &Session| {
                s.client
                    .query_one(&s.renew, &[&key, &id, &fence, &millis])
                    .await
            })
            .await
            .and_then(|row| counted(&row, "renew"))?;
        Ok(if renewed == 1 {
            Renewal::Held
        } else {
            Renewal::Lost
        })
    }
}

/// The key's row's fence while the row is kept (its last grant's), else
/// the fence sequence's last value, above every fence drawn for any key.
impl guard_std::LastFence for PgLocker {
    type Error = PgLockError;

    async fn last_fence(&self, key: &str) -> Result<Option<u64>, PgLockError> {
        let key = checked_key(key)?;
        let row = self
            .request("last fence", async |s: &Session| {
                s.client.query_one(&s.last_fence, &[&key]).await
            })
            .await?;
        let fence: Option<i64> = row
            .try_get(0)
            .map_err(|e| PgLockError::UnexpectedReply(format!("last fence: {e}")))?;
        fence
            .map(|f| {
                u64::try_from(f)
                    .map_err(|_| PgLockError::UnexpectedReply(format!("last fence {f}")))
            })
            .transpose()
    }
}

// The gateway's (and any process's) one shared handle: `SharedLocker`.
guard_std::impl_dyn_locker!(PgLocker);

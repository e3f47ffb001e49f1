//! guard-postgres: a [`Locker`](guard_core::lock::Locker) and
//! [`LeaseRenewer`](guard_core::lock::LeaseRenewer) on PostgreSQL, for
//! users whose side effects cannot tolerate the second holder that a
//! Redis failover can create.
//!
//! [`PgLocker`] keeps one row per held key in a lease table (layout in
//! [`sql`]): acquire, renew and release are one statement each, leases
//! end on the server's clock, and fences come from a sequence. It is also
//! a `ClaimStore` (guard-core's `claim`: done at most once, retried until
//! done), with records in `<table>_claims`, one statement a call
//! (`tests/pg_claims.rs`), and a `Semaphore` (guard-core's `semaphore`: at
//! most N holders of a key), with permits in `<table>_permits` taken by one
//! function call under an advisory lock of the key (`tests/pg_semaphore.rs`).
//!
//! ```no_run
//! # smol::block_on(async {
//! use guard_core::lock::{LeaseRenewer, Locker, Renewal, Ttl};
//! use guard_postgres::PgLocker;
//!
//! let locker = PgLocker::new("postgres://app@127.0.0.1/app")?.with_table("locks")?;
//! let ttl = Ttl::from_secs(15)?;
//! if let Some(token) = locker.try_lock("billing:leader", ttl).await? {
//!     // Hand token.fence() to the resource with every side effect.
//!     assert_eq!(locker.renew("billing:leader", &token, ttl).await?, Renewal::Held);
//!     locker.unlock("billing:leader", &token).await?;
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # });
//! ```
//!
//! # Guarantees
//!
//! Each names the test that backs it (in `tests/pg_locker.rs`).
//!
//! - **One holder per key.** A grant is one `INSERT ... ON CONFLICT DO
//!   UPDATE ... WHERE expires_at <= clock_timestamp()`: the row lock makes
//!   contenders for one key wait on each other, and a contender that finds
//!   a live lease takes nothing. PostgreSQL is a single primary, so this
//!   holds for every client of the server, with no replication window
//!   (`lockers_on_connections_of_their_own_race_and_exactly_one_wins_each_round`:
//!   six lockers, each on its own connection, on new keys and on keys whose
//!   lease ended; and the contract suite, `the_locker_contract_holds`).
//! - **Compare-on-token release and renewal.** Unlock and renew match the
//!   key, the token's 16 random bytes and its fence, and only a lease that
//!   has not ended; a stale or foreign token changes nothing (`NotHeld`,
//!   `Lost`) (the contract suite).
//! - **Fences strictly increase per key and are never issued twice.** A
//!   fence is `nextval` of the table's sequence. A key taken from an
//!   ended lease draws it in the `SET`, under the row's lock, so above
//!   every fence drawn before (`a_taken_key_s_fence_is_drawn_under_its_row_lock`);
//!   a new row's is drawn before its insert, and no later-drawn fence can
//!   precede it in the table, because a key's row stays (a release ends
//!   its lease, it does not delete it) until a purge at least the purge
//!   grace after its lease ended, longer than any statement may run (the
//!   session's `statement_timeout` is the request timeout, at most half
//!   the grace). Also across a server restart
//!   (`fences_keep_increasing_and_leases_survive_a_server_restart`). The
//!   condition: the grant's commit must be durable before its answer, as
//!   PostgreSQL's defaults make it (`fsync = on`, `synchronous_commit`
//!   not `off`); a failover must go to a standby that had confirmed the
//!   commits (synchronous replication), or a lost commit can hand a fence
//!   out again.
//! - **Leases survive a restart.** The table is an ordinary logged
//!   table: a lease granted before a restart (tested: a fast shutdown) is
//!   still held after it, and the locker opens a new connection by itself
//!   (the same test).
//! - **Bounded requests.** Each request, waiting for the connection and
//!   connecting included, fails with [`PgLockError::Timeout`] after the
//!   request timeout (default [`DEFAULT_REQUEST_TIMEOUT`]) instead of
//!   hanging; its connection is abandoned, and the server ends statements
//!   and lock waits at the same timeout; [`PgLocker::connect`], which an
//!   application calls at its start, ends within it too
//!   (`a_request_to_a_server_that_does_not_answer_times_out`). A timeout
//!   never cancels another caller's statement: PostgreSQL cancels
//!   whatever runs on a connection, so the timed-out statement is
//!   cancelled only once no caller waits on that connection any more
//!   (`a_request_that_times_out_does_not_cancel_a_concurrent_caller_s_statement`).
//!   A role that may not use the table or its sequence is refused at the
//!   connection (`a_role_that_cannot_use_the_table_is_refused_at_the_start`).
//! - **Bounded table.** Every [`PURGE_EVERY`]-th acquisition first
//!   deletes up to [`PURGE_BATCH`] rows whose leases ended more than the
//!   purge grace ago (default [`DEFAULT_PURGE_GRACE`]), so keys taken
//!   once (message ids, schedule slots) do not pile up
//!   (`ended_leases_are_purged_after_their_grace`). The purge comes
//!   before the grant, a request of its own (so that acquisition may
//!   take up to twice the request timeout): a caller that gives up while
//!   it runs was granted nothing, and no key is left held with its token
//!   nowhere (`a_grant_given_up_while_its_call_purges_leaves_the_key_free`).
//!
//! # Limits
//!
//! - Leases end by the **server's wall clock** (`clock_timestamp()`): a
//!   step of that clock shortens or lengthens the leases running. The
//!   guards' own deadline (the active guard demotes at sent + ttl −
//!   drift on its monotonic clock) does not depend on it.
//! - An acquire that timed out may have committed: the key is then held
//!   for its TTL with no token anywhere (a standby takes over later,
//!   never earlier).
//! - Every acquisition, won or lost, is a write transaction (ON CONFLICT
//!   locks the row it finds): standbys' attempts write to the WAL.
//! - TTLs are kept to the millisecond, rounded up.
//! - One connection per locker; concurrent requests are pipelined on it,
//!   and the server runs them one after another: a statement that waits
//!   (on a row another client has locked) delays those behind it.
//! - The table is created, with its sequence and index, when it does not
//!   exist (which needs the rights to); a table a DBA created is used as
//!   it is.
//! - No TLS: connect over a trusted network or a Unix socket.
//! - tokio-postgres needs tokio: inside a tokio runtime the connection is
//!   a task of that runtime (which must have its time driver enabled);
//!   elsewhere (smol, async-io, a plain executor) it runs on
//!   async-compat's runtime thread.
// docs.rs (nightly, `--cfg docsrs`) marks each feature-gated item with
// the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod error;
mod locker;
pub mod server;
pub mod sql;

pub use error::PgLockError;
pub use locker::{
    DEFAULT_PURGE_GRACE, DEFAULT_REQUEST_TIMEOUT, PURGE_BATCH, PURGE_EVERY, PgLocker,
};

//! A PostgreSQL table of work, claimed row by row.
//!
//! Every replica polls the same table; each round claims up to a batch of
//! rows in one statement (`SELECT ... FOR UPDATE SKIP LOCKED` feeding an
//! `UPDATE`), so a row is claimed by one replica and the others skip it.
//! That is the source's own single delivery, so no guard is added (the
//! seeds' rule): what this adds is the claim's lease, acknowledgement by
//! deleting the row, retries under a
//! [`RetryPolicy`](guard_core::retry::RetryPolicy), and a dead-letter
//! table.
//!
//! # Guarantees
//!
//! - **One claimer at a time.** A claim holds its row until
//!   `claimed_until = now() + lease`, on the server's clock (replicas'
//!   clocks play no part): while it lasts, no other consumer claims the
//!   row. A consumer that crashed leaves its rows to come back when their
//!   leases end.
//! - **A paused claimer hands nothing over.** Each batch also has a local
//!   deadline, on the consumer's monotonic clock: the instant the claim
//!   was sent, plus the lease, minus a tenth of it. A row whose handling
//!   has not started by then is not handed to the handler (it comes back
//!   when the lease ends; counted in [`PgQueueStats::expired_unstarted`]).
//!   The deadline comes before the server ends the lease as long as the
//!   two clocks disagree by less than a tenth of the lease over one lease.
//! - **Only the current claim completes a row.** Each claim gets a token
//!   (the claiming transaction's id: unique, and greater for a later
//!   claim of the row), handed to the handler in
//!   [`PgMessage::claim_token`] for a resource that refuses stale
//!   claimers. Deleting a handled row and dead-lettering a given-up one
//!   are both conditioned on the token: a consumer whose lease ended and
//!   whose row was claimed again cannot remove it (counted in
//!   [`PgQueueStats::lost_claim`] and logged).
//! - **Nothing is dropped.** A row leaves the table only deleted after
//!   its handler succeeded, or moved to the dead-letter table (insert and
//!   delete in one statement, so one transaction) with its origin (table,
//!   id), payload, error, attempts and deliveries. A row whose completion
//!   could not be written stays claimed and comes back after the lease
//!   ([`PgQueueStats::unfinished`]).
//! - **A crash loop ends.** A row claimed more than `max_deliveries`
//!   times (a handler that crashes its process never returns an error) is
//!   dead-lettered when claimed, without calling the handler, with that
//!   reason ([`PgQueueStats::too_many_deliveries`]).
//! - **Server failures are survived.** A failed or restarted server is
//!   logged, and the consumer connects again after the reconnect delay;
//!   its [`PgQueueStats`] carry on. Statements are bounded by
//!   [`REQUEST_TIMEOUT`].
//!
//! # Limits
//!
//! Delivery is at least once. A handler that ran but whose delete was
//! lost (the server failed first) runs again after the lease. A handler
//! still running when the lease ends (its retries and their delays
//! included) may run while another replica handles the same row: the
//! deadline stops only what has not started. **Choose a lease above the
//! longest handling of a row**, retries included; the claim token lets a
//! downstream resource refuse the older claimer.
//!
//! `deliveries` counts claims, including claims whose rows were not
//! started before their deadline: a consumer paused again and again can
//! bring a row to `max_deliveries` without a crash.
//!
//! Leases follow the server's wall clock: a step of that clock shortens
//! or lengthens the leases running. Tokens are transaction ids: a
//! failover to a standby that lost committed transactions can hand out a
//! token again (the rows those transactions claimed are back to
//! unclaimed there, so this is the at-least-once redelivery above).
//!
//! Rows are handled one at a time, in id order within a batch; across
//! replicas there is no order. Each consumer holds one connection;
//! [`PgQueue::push`], [`PgQueue::push_batch`] and
//! [`PgQueue::create_tables`] open one per call.
//!
//! # Schema
//!
//! [`PgQueue::create_tables`] creates, unless they exist (names quoted,
//! so their case is kept):
//!
//! ```sql
//! CREATE TABLE "<table>" (
//!     id            BIGSERIAL PRIMARY KEY,      -- claim order
//!     payload       BYTEA NOT NULL,
//!     enqueued_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
//!     available_at  TIMESTAMPTZ NOT NULL DEFAULT now(), -- not claimed before
//!     deliveries    INTEGER NOT NULL DEFAULT 0, -- claims so far
//!     claimed_by    TEXT,                       -- the consumer's name
//!     claim_token   BIGINT,                     -- the current claim
//!     claimed_until TIMESTAMPTZ                 -- its lease, server time
//! );
//! CREATE TABLE "<table>_dead_letters" (        -- or with_dead_letter_table
//!     id           BIGSERIAL PRIMARY KEY,
//!     origin_table TEXT NOT NULL,
//!     origin_id    BIGINT NOT NULL,
//!     payload      BYTEA NOT NULL,
//!     error        TEXT NOT NULL,
//!     attempts     INTEGER NOT NULL,            -- handler calls; 0 if never called
//!     deliveries   INTEGER NOT NULL,
//!     enqueued_at  TIMESTAMPTZ,
//!     failed_at    TIMESTAMPTZ NOT NULL DEFAULT now()
//! );
//! ```
//!
//! Producers may insert rows themselves (`INSERT INTO "<table>"
//! (payload) VALUES ($1)`), with a later `available_at` to delay one.
//!
//! # Runtime
//!
//! tokio-postgres needs tokio's reactor: the queue runs its connection
//! inside `async-compat` (the caller's tokio runtime if there is one,
//! else async-compat's own), driven beside the consumer rather than
//! spawned, so it also runs under smol.

mod deadline;
mod error;
mod queue;
mod server;
mod sql;

use std::time::SystemTime;

pub use error::PgQueueError;
pub use queue::{
    DEFAULT_BATCH, DEFAULT_CLAIM_LEASE, DEFAULT_MAX_DELIVERIES, DEFAULT_POLL_INTERVAL,
    DEFAULT_RECONNECT_DELAY, MAX_CLAIM_LEASE, MIN_CLAIM_LEASE, PgQueue, REQUEST_TIMEOUT,
};

/// One claimed row, as the handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgMessage {
    /// The row's id.
    pub id: i64,
    /// Its payload.
    pub payload: Vec<u8>,
    /// How often it was claimed, this claim included (1 the first time).
    pub deliveries: i32,
    /// When it was inserted, by the server's clock.
    pub enqueued_at: SystemTime,
    /// The token of this claim: unique, and greater than that of any
    /// earlier claim of the row. A resource that keeps the greatest token
    /// it saw per row can refuse a claimer whose lease ended.
    pub claim_token: i64,
}

impl PgMessage {
    /// Whether the row has been claimed more often than `max` allows.
    pub(crate) fn deliveries_exceed(&self, max: u32) -> bool {
        i64::from(self.deliveries) > i64::from(max)
    }
}

/// What a consumer did, counted from the start of its
/// [`run`](PgQueue::run), across reconnections.
///
/// Once `run` has returned, every claimed row is in exactly one of
/// `handled`, `dead_lettered`, `lost_claim`, `expired_unstarted` and
/// `unfinished`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PgQueueStats {
    /// Rows claimed.
    pub claimed: u64,
    /// Rows handled and deleted under this consumer's claim.
    pub handled: u64,
    /// Rows moved to the dead-letter table under this consumer's claim:
    /// retries spent, an error the classifier refused, or too many
    /// deliveries.
    pub dead_lettered: u64,
    /// Of `dead_lettered`, rows claimed more than `max_deliveries` times,
    /// dead-lettered without calling the handler.
    pub too_many_deliveries: u64,
    /// Rows whose delete or dead letter the token refused: the lease
    /// ended and another consumer claimed the row (it may be handled
    /// twice).
    pub lost_claim: u64,
    /// Rows not handed to the handler because the batch's local deadline
    /// had passed; they come back when the lease ends.
    pub expired_unstarted: u64,
    /// Rows whose delete or dead letter could not be written (the
    /// server failed), and rows of a batch cut short by a lost
    /// connection; they come back when the lease ends.
    pub unfinished: u64,
    /// Connections opened again after the previous one was lost.
    pub reconnects: u64,
}

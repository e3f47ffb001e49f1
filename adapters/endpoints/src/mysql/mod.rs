//! MariaDB/MySQL change data capture from the binlog (the `mysql`
//! feature).
//!
//! A binlog is one ordered log that any number of readers may stream:
//! a broadcast. So the seeds' rule elects one reader: a [`BinlogReader`]
//! reads only while its replica holds the lease, checks the lease before
//! every handler call, and hands each row change to the handler with the
//! fence. Its position is checkpointed in the database it reads
//! ([`Checkpoints`]), under the fence: a stale reader's checkpoint is
//! refused, and a takeover resumes from the last checkpoint.
//!
//! Guarantees, each with its test in `tests/binlog_reader.rs`:
//! - one reader at a time hands changes over, only with a valid lease
//!   (`three_readers_one_leads_and_a_standby_resumes_from_the_checkpoint`);
//! - a reader paused past its renew deadline hands nothing it finds
//!   buffered to the handler
//!   (`a_reader_past_its_renew_deadline_hands_nothing_over`);
//! - a checkpoint written under an older fence of the same lease is
//!   refused (`a_checkpoint_under_an_older_fence_is_refused`), and one
//!   kept under another lock service's fences is taken over whatever
//!   their size (`a_checkpoint_fenced_by_another_lock_service_is_taken_over`,
//!   `a_checkpoint_changes_lease_on_a_claim_and_refuses_the_old_lease_s_saves`;
//!   see [`Checkpoints`] and [`BinlogReader::with_lock_service`]);
//! - a change whose handler fails after its retries is written to the
//!   dead-letter table with its origin (file, position, row, table), and
//!   reading goes on (`a_poisoned_change_is_dead_lettered_with_its_origin`);
//! - after the server restarts, the reader resumes from its checkpoint
//!   (`the_reader_resumes_from_its_checkpoint_after_the_server_restarts`);
//! - a connection that dies silently (the server's host vanishes, the
//!   network partitions: no FIN, no RST) does not hold leadership: every
//!   request the reader makes (connecting, its queries, a checkpoint, a
//!   dead letter) waits at most the request timeout, and the stream asks
//!   the server for a heartbeat whenever it has nothing to send, so a
//!   stream with no event for [`HEARTBEATS_BEFORE_DEAD`] heartbeat
//!   periods is taken for dead. Either ends the reader's serving, which
//!   steps down (releasing the lease), and the next leader, this replica
//!   or another, resumes from the checkpoint
//!   (`a_reader_whose_connections_go_silent_steps_down_and_resumes_from_the_checkpoint`;
//!   see [`BinlogReader::with_request_timeout`] and
//!   [`BinlogReader::with_heartbeat`]).
//!
//! The bound on duplicates: checkpoints are taken at transaction ends
//! (the only positions a reader can resume from: a row event needs its
//! transaction's table map), after every `checkpoint_every`-th
//! transaction (default 1). A takeover, or a restart, hands again the
//! changes of the transactions read since the last checkpoint: with the
//! default, at most the rows of the one transaction in progress. Nothing
//! is skipped: a position is saved only after every change before it was
//! handled or dead-lettered.
//!
//! The server must log rows (`binlog_format = ROW`; checked when a reader
//! starts) and the reader's user needs `REPLICATION SLAVE` and
//! `REPLICATION CLIENT`. Each change carries the row's values by column
//! position (the binlog has no column names unless the server writes
//! them: `binlog_row_metadata = FULL`).
//!
//! The client is `mysql_async`, which runs on tokio: inside a tokio
//! runtime it uses the caller's, elsewhere async-compat's runtime thread.

mod checkpoint;
mod reader;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use guard_std::run::RunnerError;

use crate::delivery::ElectedLease;
use crate::parameter::Parameter;

pub use checkpoint::{BinlogPosition, CheckpointError, Checkpoints};
pub use reader::{BinlogReader, BinlogStats, Start, json_array};

/// The checkpoints table unless configured.
pub const DEFAULT_CHECKPOINT_TABLE: &str = "guard_binlog_checkpoints";
/// The dead-letter table unless configured.
pub const DEFAULT_DEAD_LETTER_TABLE: &str = "guard_binlog_dead_letters";

/// How long a request (connecting, a query, a checkpoint, a dead letter)
/// waits for the server's answer unless configured: the longest a silent
/// connection holds a reader that is not streaming.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the server sends a heartbeat on an idle stream unless
/// configured.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// Heartbeat periods without any event after which a stream is taken for
/// dead: one late heartbeat on a busy server or network is not a dead
/// connection, three in a row are.
pub const HEARTBEATS_BEFORE_DEAD: u32 = 3;

/// A binlog reader's failure, or input that cannot work.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum BinlogError {
    /// A parameter that cannot be used.
    InvalidInput(crate::InvalidInput),
    /// The reader's guard (its lease runner) cannot be built.
    Guard(RunnerError),
    /// The server refused or failed a request.
    Server {
        /// What was asked.
        what: String,
        /// Why (shared, so the error stays `Clone`).
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// The server did not answer a request in time: its connection is
    /// given up (one that died silently never answers).
    Timeout {
        /// What was asked.
        what: String,
        /// How long the reader waited.
        after: Duration,
    },
}

impl BinlogError {
    pub(crate) fn invalid(
        parameter: Parameter,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> Self {
        BinlogError::InvalidInput(crate::InvalidInput::new(parameter, value, rule))
    }

    pub(crate) fn server(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        BinlogError::Server {
            what: what.into(),
            source: Arc::new(source),
        }
    }

    pub(crate) fn timeout(what: impl Into<String>, after: Duration) -> Self {
        BinlogError::Timeout {
            what: what.into(),
            after,
        }
    }
}

crate::parameter::refusal!(BinlogError);

impl fmt::Display for BinlogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BinlogError::InvalidInput(e) => fmt::Display::fmt(e, f),
            BinlogError::Guard(e) => write!(f, "binlog reader guard: {e}"),
            BinlogError::Server { what, source } => write!(f, "binlog: {what}: {source}"),
            BinlogError::Timeout { what, after } => {
                write!(f, "binlog: {what}: no answer within {after:?}")
            }
        }
    }
}

impl std::error::Error for BinlogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BinlogError::Guard(e) => Some(e),
            BinlogError::Server { source, .. } => Some(&**source),
            BinlogError::InvalidInput(_) | BinlogError::Timeout { .. } => None,
        }
    }
}

/// What happened to a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChangeKind {
    /// A row was inserted: `after` holds it.
    Insert,
    /// A row was updated: `before` and `after` hold both images.
    Update,
    /// A row was deleted: `before` holds it.
    Delete,
}

impl ChangeKind {
    /// `insert`, `update` or `delete`.
    pub fn name(self) -> &'static str {
        match self {
            ChangeKind::Insert => "insert",
            ChangeKind::Update => "update",
            ChangeKind::Delete => "delete",
        }
    }
}

/// A column's value: `None` for SQL NULL, else its bytes (text for
/// numbers, dates and times, as the server would print them).
pub type ColumnValue = Option<Vec<u8>>;

/// One row change, as the handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowChange {
    /// The database (schema).
    pub database: String,
    /// The table.
    pub table: String,
    /// What happened.
    pub kind: ChangeKind,
    /// The row before (update, delete), by column position.
    pub before: Option<Vec<ColumnValue>>,
    /// The row after (insert, update), by column position.
    pub after: Option<Vec<ColumnValue>>,
    /// Where its event ends in the binlog.
    pub position: BinlogPosition,
    /// Its index among the rows of that event.
    pub row: u32,
    /// The reader's fence, checked valid immediately before the handler
    /// was called: pass it to a resource that refuses stale leaders.
    pub fence: u64,
    /// The lease the change was read under: a handler that waits before
    /// its side effect checks [`ElectedLease::is_valid`] again immediately
    /// before it. `None` only before the reader hands the change over.
    pub lease: Option<ElectedLease>,
}

/// A plain SQL identifier (letters, digits, `_`, `$`, not starting with
/// a digit, at most 64 characters): safe to put between backquotes.
pub(crate) fn checked_identifier(parameter: Parameter, name: &str) -> Result<String, BinlogError> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    if !valid {
        return Err(BinlogError::invalid(
            parameter,
            name,
            "must be a plain SQL identifier: letters, digits, '_' or '$', not starting with a digit, at most 64 characters",
        ));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers_name_tables() {
        for good in ["guard_binlog_checkpoints", "t1", "_x", "a$b"] {
            assert!(checked_identifier(Parameter::Table, good).is_ok(), "{good}");
        }
        for bad in ["", "1t", "a;drop table x", "a`b", "a b", &"x".repeat(65)] {
            let err = checked_identifier(Parameter::Table, bad).unwrap_err();
            assert!(err.to_string().starts_with("invalid table"), "{err}");
        }
    }
}

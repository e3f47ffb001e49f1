//! Where a binlog reader's position is kept: one row per reader in a
//! table of the database it reads, written only under the lease that
//! holds it, with a fence at least as high as the one stored.
//!
//! See [`Checkpoints`] for the table and its rules.

use std::fmt;

use mysql_async::prelude::Queryable;

/// A position in the binlog: a file and the offset of the next event.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BinlogPosition {
    /// The binlog file's name (`binlog.000001`); empty before the first
    /// checkpoint of a reader that starts at the server's first binlog.
    pub file: String,
    /// The offset in that file.
    pub pos: u64,
}

impl fmt::Display for BinlogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

/// Why a checkpoint was not read or written.
#[derive(Debug)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A newer reader owns the checkpoint now: one with a higher fence of
    /// the same lease, or, for a save, one of another lease.
    Stale {
        /// The fence the refused writer gave.
        fence: u64,
    },
    /// The database refused or failed the statement.
    Database(mysql_async::Error),
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointError::Stale { fence } => write!(
                f,
                "checkpoint refused: a newer reader owns it (a fence above {fence}, or another lease)"
            ),
            CheckpointError::Database(e) => write!(f, "checkpoint: {e}"),
        }
    }
}

impl std::error::Error for CheckpointError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CheckpointError::Database(e) => Some(e),
            CheckpointError::Stale { .. } => None,
        }
    }
}

impl From<mysql_async::Error> for CheckpointError {
    fn from(e: mysql_async::Error) -> Self {
        CheckpointError::Database(e)
    }
}

/// The checkpoints table, by name (a plain identifier, checked by the
/// reader that names it).
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS guard_binlog_checkpoints (
///     name  VARCHAR(191) PRIMARY KEY,  -- the reader's name
///     file  VARCHAR(255) NOT NULL,     -- binlog file ('' before the first)
///     pos   BIGINT UNSIGNED NOT NULL,  -- position after a transaction
///     fence BIGINT UNSIGNED NOT NULL,  -- fence of the last writer
///     lease VARBINARY(512) NOT NULL DEFAULT ''  -- whose sequence it is
/// )
/// ```
///
/// A table made before the `lease` column existed gets it when a reader
/// starts; its rows name no lease (`''`).
///
/// # Fences are compared within one lease only
///
/// A locker promises fences that increase per key, within itself: Redis
/// draws them from its clock (microseconds since the epoch), PostgreSQL
/// from a sequence, etcd from its revision, an in-process locker from a
/// counter that starts again with the process. Fences of two lock
/// services, or of two keys, say nothing about which grant came later.
/// So the row keeps, beside the fence, the *lease* it belongs to: the
/// lock service's name (given by the application, see
/// [`BinlogReader::with_lock_service`](super::BinlogReader::with_lock_service))
/// and the lease key. The rules:
///
/// - a **claim** (a reader promoted under a new grant) takes the row if
///   the row's lease is ours and its fence is at most ours, or if the
///   row's lease is another one: a reader moved to another lock service
///   takes over at once, whatever the two fences are;
/// - a **save** moves the position only while the row's lease is ours
///   and its fence at most ours.
///
/// The invariant the fence exists for still holds within a lease: once
/// a reader with fence `f` has claimed or saved the row, a claim or save
/// of the same lease with a fence below `f` changes nothing and is
/// refused ([`CheckpointError::Stale`]), so a leader that lost its lease
/// without knowing (paused, partitioned) cannot move the position back
/// or forward under the newer leader. And a reader of the old lease that
/// wakes after a takeover has its saves refused, since the row's lease
/// is no longer its own.
///
/// Why the fence sequence and not each grant: a stale reader holds a
/// grant of its own too, so "another grant takes over" would let it in;
/// "another lock service or lease key takes over" keeps every reader of
/// one sequence ordered by its fence, which is what refuses the stale
/// one.
///
/// The limit: a *claim* of another lease always wins, so two lock
/// services must not serve one reader at once (during a move, stop the
/// replicas of the old one first): readers of both would each lead,
/// and the row would follow whichever claimed last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoints {
    table: String,
}

impl Checkpoints {
    /// The table `table` (a plain SQL identifier, unchecked here).
    pub(crate) fn new(table: &str) -> Self {
        Checkpoints {
            table: table.to_owned(),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table unless it exists, and adds the `lease` column
    /// to one made without it.
    pub async fn create(&self, conn: &mut mysql_async::Conn) -> Result<(), CheckpointError> {
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS `{}` (\
             name VARCHAR(191) PRIMARY KEY, file VARCHAR(255) NOT NULL, \
             pos BIGINT UNSIGNED NOT NULL, fence BIGINT UNSIGNED NOT NULL, \
             lease VARBINARY(512) NOT NULL DEFAULT '')",
            self.table
        ))
        .await?;
        let has_lease: Option<u64> = conn
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'lease'",
                (&self.table,),
            )
            .await?;
        if has_lease == Some(0) {
            let added = conn
                .query_drop(format!(
                    "ALTER TABLE `{}` ADD COLUMN lease VARBINARY(512) NOT NULL DEFAULT ''",
                    self.table
                ))
                .await;
            match added {
                // Another replica added it first (ER_DUP_FIELDNAME).
                Err(mysql_async::Error::Server(e)) if e.code == 1060 => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Claims `name`'s checkpoint for `fence` of `lease` and reads it:
    /// `None` when the reader has none yet. Refused
    /// ([`CheckpointError::Stale`]) when a higher fence of the same lease
    /// holds it; taken over from another lease whatever its fence (see
    /// the module documentation).
    pub async fn claim(
        &self,
        conn: &mut mysql_async::Conn,
        name: &str,
        lease: &str,
        fence: u64,
    ) -> Result<Option<BinlogPosition>, CheckpointError> {
        conn.exec_drop(
            format!(
                "INSERT IGNORE INTO `{}` (name, file, pos, fence, lease) VALUES (?, '', 0, 0, ?)",
                self.table
            ),
            (name, lease),
        )
        .await?;
        self.write(conn, name, None, lease, fence).await?;
        let row: Option<(String, u64)> = conn
            .exec_first(
                format!("SELECT file, pos FROM `{}` WHERE name = ?", self.table),
                (name,),
            )
            .await?;
        Ok(row.and_then(|(file, pos)| (pos > 0).then_some(BinlogPosition { file, pos })))
    }

    /// Saves `position` for `name` under `fence` of `lease`; refused
    /// ([`CheckpointError::Stale`]) when another lease holds it, or a
    /// higher fence of this one.
    pub async fn save(
        &self,
        conn: &mut mysql_async::Conn,
        name: &str,
        position: &BinlogPosition,
        lease: &str,
        fence: u64,
    ) -> Result<(), CheckpointError> {
        self.write(conn, name, Some(position), lease, fence).await
    }

    /// One conditional UPDATE: a save matched only while the row is of
    /// our lease with a fence at most ours, a claim also when the row is
    /// of another lease. The connection reports rows matched, not changed
    /// (`CLIENT_FOUND_ROWS`), so saving the same position twice is not
    /// mistaken for a refusal.
    async fn write(
        &self,
        conn: &mut mysql_async::Conn,
        name: &str,
        position: Option<&BinlogPosition>,
        lease: &str,
        fence: u64,
    ) -> Result<(), CheckpointError> {
        match position {
            Some(position) => {
                conn.exec_drop(
                    format!(
                        "UPDATE `{}` SET file = ?, pos = ?, fence = ? \
                         WHERE name = ? AND lease = ? AND fence <= ?",
                        self.table
                    ),
                    (&position.file, position.pos, fence, name, lease, fence),
                )
                .await?
            }
            None => {
                conn.exec_drop(
                    format!(
                        "UPDATE `{}` SET fence = ?, lease = ? \
                         WHERE name = ? AND (lease <> ? OR fence <= ?)",
                        self.table
                    ),
                    (fence, lease, name, lease, fence),
                )
                .await?
            }
        }
        if conn.affected_rows() == 0 {
            return Err(CheckpointError::Stale { fence });
        }
        Ok(())
    }
}

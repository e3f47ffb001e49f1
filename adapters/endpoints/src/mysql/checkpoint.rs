//! Where a binlog reader's position is kept: one row per reader in a
//! table of the database it reads, written only under a fence at least as
//! high as the one stored.
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS guard_binlog_checkpoints (
//!     name  VARCHAR(191) PRIMARY KEY,  -- the reader's name
//!     file  VARCHAR(255) NOT NULL,     -- binlog file ('' before the first)
//!     pos   BIGINT UNSIGNED NOT NULL,  -- position after a transaction
//!     fence BIGINT UNSIGNED NOT NULL   -- fence of the last writer
//! )
//! ```
//!
//! The invariant: once a reader with fence `f` has claimed or saved the
//! row, a save with a fence below `f` changes nothing and is refused
//! ([`CheckpointError::Stale`]). A leader that lost its lease without
//! knowing (paused, partitioned) cannot move the position back or
//! forward under the newer leader.

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
    /// A reader with a higher fence owns the checkpoint now.
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
                "checkpoint refused: a reader with a fence above {fence} owns it"
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

    /// Creates the table unless it exists.
    pub async fn create(&self, conn: &mut mysql_async::Conn) -> Result<(), CheckpointError> {
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS `{}` (\
             name VARCHAR(191) PRIMARY KEY, file VARCHAR(255) NOT NULL, \
             pos BIGINT UNSIGNED NOT NULL, fence BIGINT UNSIGNED NOT NULL)",
            self.table
        ))
        .await?;
        Ok(())
    }

    /// Claims `name`'s checkpoint for `fence` and reads it: `None` when
    /// the reader has none yet. Refused ([`CheckpointError::Stale`]) when
    /// a higher fence holds it.
    pub async fn claim(
        &self,
        conn: &mut mysql_async::Conn,
        name: &str,
        fence: u64,
    ) -> Result<Option<BinlogPosition>, CheckpointError> {
        conn.exec_drop(
            format!(
                "INSERT IGNORE INTO `{}` (name, file, pos, fence) VALUES (?, '', 0, 0)",
                self.table
            ),
            (name,),
        )
        .await?;
        self.write(conn, name, None, fence).await?;
        let row: Option<(String, u64)> = conn
            .exec_first(
                format!("SELECT file, pos FROM `{}` WHERE name = ?", self.table),
                (name,),
            )
            .await?;
        Ok(row.and_then(|(file, pos)| (pos > 0).then_some(BinlogPosition { file, pos })))
    }

    /// Saves `position` for `name` under `fence`; refused
    /// ([`CheckpointError::Stale`]) when a higher fence holds it.
    pub async fn save(
        &self,
        conn: &mut mysql_async::Conn,
        name: &str,
        position: &BinlogPosition,
        fence: u64,
    ) -> Result<(), CheckpointError> {
        self.write(conn, name, Some(position), fence).await
    }

    /// One conditional UPDATE: matched only while the stored fence is at
    /// most ours. The connection reports rows matched, not changed
    /// (`CLIENT_FOUND_ROWS`), so saving the same position twice is not
    /// mistaken for a refusal.
    async fn write(
        &self,
        conn: &mut mysql_async::Conn,
        name: &str,
        position: Option<&BinlogPosition>,
        fence: u64,
    ) -> Result<(), CheckpointError> {
        match position {
            Some(position) => {
                conn.exec_drop(
                    format!(
                        "UPDATE `{}` SET file = ?, pos = ?, fence = ? WHERE name = ? AND fence <= ?",
                        self.table
                    ),
                    (&position.file, position.pos, fence, name, fence),
                )
                .await?
            }
            None => {
                conn.exec_drop(
                    format!(
                        "UPDATE `{}` SET fence = ? WHERE name = ? AND fence <= ?",
                        self.table
                    ),
                    (fence, name, fence),
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

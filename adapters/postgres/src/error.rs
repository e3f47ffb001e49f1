//! The locker's errors.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A locker that cannot be built, or a request to the server that failed.
///
/// The message names what failed; [`source`](Error::source) returns
/// tokio-postgres's [`Error`](tokio_postgres::Error) where there is one
/// (shared behind an [`Arc`], so the error stays `Clone`).
///
/// ```
/// use guard_postgres::{PgLockError, PgLocker};
///
/// let err = PgLocker::new("postgres://127.0.0.1/app")
///     .unwrap()
///     .with_table("locks; drop table x")
///     .unwrap_err();
/// assert!(matches!(err, PgLockError::InvalidInput { parameter: "table", .. }));
/// assert!(err.to_string().contains("plain SQL identifier"), "{err}");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum PgLockError {
    /// A parameter or key that cannot be used.
    #[non_exhaustive]
    InvalidInput {
        /// What was refused: `server URL`, `table`, `lock key`,
        /// `request timeout`.
        parameter: &'static str,
        /// The value given, as text (a URL's password hidden).
        value: String,
        /// The rule it breaks.
        rule: String,
    },
    /// The server could not be reached or refused the connection.
    Connect {
        /// Where: `host:port/database`.
        server: String,
        /// Why.
        source: Arc<tokio_postgres::Error>,
    },
    /// A statement failed, or the connection it was sent on ended.
    Query {
        /// Which statement: `create table`, `prepare`, `acquire`,
        /// `renew`, `release`, `purge`.
        statement: &'static str,
        /// Why.
        source: Arc<tokio_postgres::Error>,
    },
    /// A request had no answer in time; its connection is given up.
    Timeout {
        /// Which statement, or `connect`.
        statement: &'static str,
        /// How long it waited.
        after: Duration,
    },
    /// The server answered something the locker cannot use.
    UnexpectedReply(String),
}

impl PgLockError {
    /// `value` of `parameter` breaks `rule`.
    pub(crate) fn invalid(
        parameter: &'static str,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> Self {
        PgLockError::InvalidInput {
            parameter,
            value: value.into(),
            rule: rule.into(),
        }
    }

    /// `statement` failed with `source`.
    pub(crate) fn query(statement: &'static str, source: tokio_postgres::Error) -> Self {
        PgLockError::Query {
            statement,
            source: Arc::new(source),
        }
    }
}

impl fmt::Display for PgLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PgLockError::InvalidInput {
                parameter,
                value,
                rule,
            } => write!(f, "invalid {parameter} {value:?}: {rule}"),
            PgLockError::Connect { server, source } => {
                write!(f, "cannot connect to PostgreSQL at {server}: {source}")
            }
            PgLockError::Query { statement, source } => {
                // tokio-postgres's own message is terse ("db error");
                // the server's is what names the cause.
                match source.as_db_error() {
                    Some(db) => write!(f, "{statement} failed: {}: {}", db.code().code(), db),
                    None => write!(f, "{statement} failed: {source}"),
                }
            }
            PgLockError::Timeout { statement, after } => {
                write!(f, "{statement}: no answer within {after:?}")
            }
            PgLockError::UnexpectedReply(what) => write!(f, "unexpected reply: {what}"),
        }
    }
}

impl Error for PgLockError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            PgLockError::Connect { source, .. } | PgLockError::Query { source, .. } => {
                Some(source.as_ref())
            }
            _ => None,
        }
    }
}

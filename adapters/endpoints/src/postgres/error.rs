//! The errors of the PostgreSQL queue.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::parameter::Parameter;

/// A queue that cannot be built, or a request to the server that failed.
///
/// The message names what failed; [`source`](Error::source) returns the
/// cause: tokio-postgres's [`Error`](tokio_postgres::Error) (shared
/// behind an [`Arc`], so the error stays `Clone`), or the check that
/// refused a parameter.
///
/// ```
/// use guard_endpoints::Parameter;
/// use guard_endpoints::postgres::{PgQueue, PgQueueError};
///
/// let err = PgQueue::new("postgres://127.0.0.1/app", "jobs; drop table x").unwrap_err();
/// assert!(matches!(
///     err,
///     PgQueueError::InvalidInput(guard_endpoints::InvalidInput { parameter: Parameter::Table, .. })
/// ));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum PgQueueError {
    /// A parameter that cannot be used.
    InvalidInput(crate::InvalidInput),
    /// The server could not be reached or refused the connection.
    Connect {
        /// Where: `host:port/database`.
        server: String,
        /// Why.
        source: Arc<tokio_postgres::Error>,
    },
    /// A statement failed, or the connection it was sent on ended.
    Query {
        /// Which statement: `claim`, `complete`, `dead letter`, `push`,
        /// `create tables`, `prepare`.
        statement: &'static str,
        /// Why.
        source: Arc<tokio_postgres::Error>,
    },
    /// A statement had no answer in time; its connection is given up.
    Timeout {
        /// Which statement.
        statement: &'static str,
        /// How long it waited.
        after: Duration,
    },
}

impl PgQueueError {
    /// `value` of `parameter` breaks `rule`.
    pub(crate) fn invalid(
        parameter: Parameter,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> Self {
        PgQueueError::InvalidInput(crate::InvalidInput::new(parameter, value, rule))
    }

    /// `statement` failed with `source`.
    pub(crate) fn query(statement: &'static str, source: tokio_postgres::Error) -> Self {
        PgQueueError::Query {
            statement,
            source: Arc::new(source),
        }
    }

    /// Whether the connection this came from can no longer be used: it
    /// ended, or a statement on it had no answer (its reply, should it
    /// come, would answer the wrong request).
    pub(crate) fn connection_lost(&self) -> bool {
        match self {
            PgQueueError::Query { source, .. } | PgQueueError::Connect { source, .. } => {
                source.is_closed()
            }
            PgQueueError::Timeout { .. } => true,
            PgQueueError::InvalidInput(_) => false,
        }
    }
}

crate::parameter::refusal!(PgQueueError);

impl fmt::Display for PgQueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PgQueueError::InvalidInput(e) => fmt::Display::fmt(e, f),
            PgQueueError::Connect { server, source } => {
                write!(f, "postgres connect: {server}: {source}")
            }
            PgQueueError::Query { statement, source } => {
                write!(f, "postgres {statement}: {source}")
            }
            PgQueueError::Timeout { statement, after } => {
                write!(f, "postgres {statement}: no answer within {after:?}")
            }
        }
    }
}

impl Error for PgQueueError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            PgQueueError::InvalidInput(e) => Error::source(e),
            PgQueueError::Connect { source, .. } | PgQueueError::Query { source, .. } => {
                Some(&**source)
            }
            PgQueueError::Timeout { .. } => None,
        }
    }
}

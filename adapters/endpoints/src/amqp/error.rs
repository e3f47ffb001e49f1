//! The errors of the RabbitMQ endpoints.

use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use guard_std::run::RunnerError;
use lapin::protocol::AMQPErrorKind;

use crate::parameter::Parameter;

/// A RabbitMQ failure, or input that cannot work.
///
/// The message names what failed; [`source`](Error::source) returns the
/// cause where there is one: lapin's [`Error`](lapin::Error) (shared
/// behind an [`Arc`], so the error stays `Clone`), the
/// [`RunnerError`] of the endpoint's guard, or the check that refused a
/// parameter.
///
/// ```
/// use guard_endpoints::Parameter;
/// use guard_endpoints::amqp::{AmqpError, AmqpOptions, WorkQueueConsumer};
///
/// let options = AmqpOptions::new("amqp://127.0.0.1:5672/%2f")?;
/// let err = WorkQueueConsumer::new(options, "").unwrap_err();
/// assert!(matches!(
///     err,
///     AmqpError::InvalidInput(guard_endpoints::InvalidInput { parameter: Parameter::AmqpQueue, .. })
/// ));
/// # Ok::<(), AmqpError>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AmqpError {
    /// A parameter that cannot be used.
    InvalidInput(crate::InvalidInput),
    /// The endpoint's guard (its lease runner) cannot be built.
    Guard(RunnerError),
    /// The broker could not be reached, or refused the connection or a
    /// channel on it.
    Connect {
        /// `host:port/vhost`.
        server: String,
        /// Why.
        source: Arc<lapin::Error>,
    },
    /// A declaration failed: refused by the broker (a queue that exists
    /// with other arguments: `PRECONDITION_FAILED`; a name this user may
    /// not use: `ACCESS_REFUSED`; see [`reply_code`](Self::reply_code)),
    /// or cut short by the connection.
    Declare {
        /// What was declared: `queue`, `dead-letter queue`, `exchange`,
        /// `binding`, `prefetch`.
        what: &'static str,
        /// Its name (a binding's queue; a prefetch's queue or exchange).
        name: String,
        /// Why.
        source: Arc<lapin::Error>,
    },
    /// The broker refused the consumer, or the consumer ended: the
    /// connection or channel closed (with lapin's error), or the broker
    /// cancelled it (the queue was deleted: `source` is `None`).
    Consume {
        /// The queue consumed.
        queue: String,
        /// Why.
        source: Option<Arc<lapin::Error>>,
    },
    /// No answer in time.
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        limit: Duration,
    },
}

impl AmqpError {
    /// `value` of `parameter` breaks `rule`.
    pub(crate) fn invalid(
        parameter: Parameter,
        value: impl Into<String>,
        rule: impl Into<String>,
    ) -> Self {
        AmqpError::InvalidInput(crate::InvalidInput::new(parameter, value, rule))
    }

    /// The lapin error behind this one, if any.
    fn lapin(&self) -> Option<&lapin::Error> {
        match self {
            AmqpError::Connect { source, .. } | AmqpError::Declare { source, .. } => Some(source),
            AmqpError::Consume {
                source: Some(source),
                ..
            } => Some(source),
            _ => None,
        }
    }

    /// The broker's reply code, where the broker refused: 403
    /// `ACCESS_REFUSED`, 404 `NOT_FOUND`, 405 `RESOURCE_LOCKED`, 406
    /// `PRECONDITION_FAILED`, 320 `CONNECTION_FORCED` (a broker shutting
    /// down), ...
    pub fn reply_code(&self) -> Option<u16> {
        match self.lapin()?.kind() {
            lapin::ErrorKind::ProtocolError(e) => Some(e.get_id()),
            _ => None,
        }
    }

    /// A declaration the broker refused for what was declared, not for
    /// the connection's sake: declaring it again cannot succeed until
    /// someone changes the broker or the endpoint's settings.
    pub(crate) fn is_refused_declaration(&self) -> bool {
        let AmqpError::Declare { source, .. } = self else {
            return false;
        };
        match source.kind() {
            lapin::ErrorKind::ProtocolError(e) => {
                matches!(e.kind(), AMQPErrorKind::Soft(_)) && matches!(e.get_id(), 403 | 406)
            }
            _ => false,
        }
    }
}

crate::parameter::refusal!(AmqpError);

impl fmt::Display for AmqpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AmqpError::InvalidInput(e) => fmt::Display::fmt(e, f),
            AmqpError::Guard(e) => write!(f, "AMQP endpoint guard: {e}"),
            AmqpError::Connect { server, source } => write!(f, "amqp connect: {server}: {source}"),
            AmqpError::Declare { what, name, source } => {
                write!(f, "amqp declare {what} {name:?}: {source}")
            }
            AmqpError::Consume {
                queue,
                source: Some(source),
            } => write!(f, "amqp consume {queue:?}: {source}"),
            AmqpError::Consume {
                queue,
                source: None,
            } => write!(
                f,
                "amqp consume {queue:?}: the broker cancelled the consumer"
            ),
            AmqpError::Timeout { what, limit } => {
                write!(f, "amqp {what}: no answer within {limit:?}")
            }
        }
    }
}

impl Error for AmqpError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            AmqpError::InvalidInput(e) => Error::source(e),
            AmqpError::Guard(e) => Some(e),
            _ => self.lapin().map(|e| e as &(dyn Error + 'static)),
        }
    }
}

impl From<RunnerError> for AmqpError {
    fn from(e: RunnerError) -> Self {
        AmqpError::Guard(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::protocol::{AMQPError, AMQPHardError, AMQPSoftError};

    fn declare_refused(kind: AMQPErrorKind) -> AmqpError {
        let refusal = AMQPError::new(kind, "refused".into());
        AmqpError::Declare {
            what: "queue",
            name: "orders".to_owned(),
            source: Arc::new(lapin::ErrorKind::ProtocolError(refusal).into()),
        }
    }

    #[test]
    fn only_a_refusal_of_what_was_declared_is_final() {
        let final_ones = [
            AMQPSoftError::PRECONDITIONFAILED,
            AMQPSoftError::ACCESSREFUSED,
        ];
        for soft in final_ones {
            let err = declare_refused(AMQPErrorKind::Soft(soft));
            assert!(err.is_refused_declaration(), "{err}");
        }
        let passing = [
            declare_refused(AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)),
            declare_refused(AMQPErrorKind::Soft(AMQPSoftError::RESOURCELOCKED)),
            declare_refused(AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED)),
        ];
        for err in passing {
            assert!(!err.is_refused_declaration(), "{err}");
        }
    }

    #[test]
    fn the_reply_code_and_the_source_are_the_broker_s() {
        let err = declare_refused(AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED));
        assert_eq!(err.reply_code(), Some(406));
        assert!(
            err.to_string()
                .starts_with("amqp declare queue \"orders\": ")
        );
        let source = err.source().expect("lapin's error");
        assert!(
            source.downcast_ref::<lapin::Error>().is_some(),
            "{source:?}"
        );
        let timeout = AmqpError::Timeout {
            what: "connect",
            limit: Duration::from_secs(1),
        };
        assert_eq!(timeout.reply_code(), None);
        assert!(timeout.source().is_none());
    }
}

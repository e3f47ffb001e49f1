//! What a replica reports: one line per event on `guard-gateway run`'s
//! standard output.

use std::fmt;

use guard_core::guard::DemoteReason;
use guard_core::slot::UnixMillis;

/// Something a replica did, printed one per line by `guard-gateway run`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// This replica ran a scheduled slot.
    Executed {
        /// The router.
        router: String,
        /// The planned slot.
        slot: UnixMillis,
        /// The claim's fence.
        fence: Option<u64>,
    },
    /// This replica became the leader of a consumer.
    Promoted {
        /// The consumer.
        name: String,
        /// The lease's fence.
        fence: u64,
    },
    /// This replica stopped leading a consumer.
    Demoted {
        /// The consumer.
        name: String,
        /// Why.
        reason: DemoteReason,
    },
    /// This replica handled a message of an endpoint.
    Received {
        /// The endpoint.
        endpoint: String,
        /// Where it came from: channel, entry id or topic.
        from: String,
        /// The lease's fence, checked valid just before the handler ran
        /// (elected endpoints; `None` where the source delivers once).
        fence: Option<u64>,
        /// What it carried.
        content: Content,
    },
    /// A message the endpoint's limiter refused, kept as a dead letter.
    DeadLettered {
        /// The endpoint.
        endpoint: String,
        /// Where it came from.
        from: String,
        /// Why.
        reason: String,
    },
    /// A scheduled run's action (a command, a message to a sink) failed
    /// after its attempts.
    Failed {
        /// The router.
        router: String,
        /// The planned slot.
        slot: UnixMillis,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's failure.
        reason: String,
    },
    /// A scheduled run its limiter refused: the slot was skipped.
    Skipped {
        /// The router.
        router: String,
        /// The planned slot.
        slot: UnixMillis,
        /// Why.
        reason: String,
    },
}

/// A handled message's content, as text (invalid UTF-8 replaced).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Content {
    /// A Pub/Sub or MQTT payload.
    Payload(String),
    /// A stream entry's fields, by name.
    Fields(Vec<(String, String)>),
}

impl fmt::Display for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Content::Payload(text) => write!(f, "payload={text}"),
            Content::Fields(fields) => {
                let mut first = true;
                for (name, value) in fields {
                    if !first {
                        f.write_str(" ")?;
                    }
                    first = false;
                    write!(f, "{name}={value}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Executed {
                router,
                slot,
                fence,
            } => {
                write!(
                    f,
                    "executed router={router} slot={slot} fence={}",
                    fence.map_or("-".into(), |x| x.to_string())
                )
            }
            Event::Promoted { name, fence } => write!(f, "promoted name={name} fence={fence}"),
            Event::Demoted { name, reason } => write!(f, "demoted name={name} reason={reason:?}"),
            Event::Received {
                endpoint,
                from,
                fence,
                content,
            } => write!(
                f,
                "received endpoint={endpoint} from={from} fence={} {content}",
                fence.map_or("-".into(), |x| x.to_string())
            ),
            Event::DeadLettered {
                endpoint,
                from,
                reason,
            } => write!(
                f,
                "dead-lettered endpoint={endpoint} from={from} reason={reason}"
            ),
            Event::Skipped {
                router,
                slot,
                reason,
            } => write!(f, "skipped router={router} slot={slot} reason={reason}"),
            Event::Failed {
                router,
                slot,
                attempts,
                reason,
            } => write!(
                f,
                "failed router={router} slot={slot} attempts={attempts} reason={reason}"
            ),
        }
    }
}

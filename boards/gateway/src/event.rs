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
    /// A queued message its sink refused for good or as stale, kept as a
    /// dead letter.
    SinkDeadLettered {
        /// The sink.
        sink: String,
        /// The message's id (its idempotency key).
        id: String,
        /// Where it came from.
        from: String,
        /// The sink's answer.
        reason: String,
    },
    /// The dead letters on disk, opened: the torn bytes their recovery
    /// cut.
    DeadLettersOpened {
        /// Their directory.
        dir: String,
        /// Bytes of a torn last letter cut.
        lost_bytes: u64,
    },
    /// A sink's queue on disk, opened: what it holds and what its
    /// recovery cut.
    QueueOpened {
        /// The sink.
        sink: String,
        /// Messages waiting to be forwarded.
        pending: u64,
        /// Bytes of torn or damaged tails cut.
        lost_bytes: u64,
        /// Segments whose tail was cut, or found empty.
        damaged_segments: u64,
        /// Segments not all forwarded that are gone (their records lost).
        missing_segments: u64,
        /// Whether the cursor could not be placed (forwarding restarts at
        /// the oldest record: repeats, no loss).
        cursor_reset: bool,
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
    /// The configuration was read again and applied: what started,
    /// restarted and stopped (each `endpoint:<name>`,
    /// `schedule:<router>` or `active:<name>`), and how many units kept
    /// running.
    Reloaded {
        /// Units new in the file.
        started: Vec<String>,
        /// Units whose configuration changed.
        restarted: Vec<String>,
        /// Units no longer in the file.
        stopped: Vec<String>,
        /// Units that did not start again (each logged with its error).
        failed: Vec<String>,
        /// Units that kept running, their leases held.
        kept: usize,
    },
    /// The configuration read again was refused: the running one stays.
    ReloadRefused {
        /// Why.
        reason: String,
    },
}

/// `text` as one line: a control character (a newline in a payload, a
/// command's standard error), a line or paragraph separator or a
/// bidirectional override is written escaped, so what a message or a
/// command says can never begin a line of its own nor reorder one.
pub(crate) fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(escaped_in_a_line) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if escaped_in_a_line(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `text` as one field's value on a line of `name=value` fields: as it
/// is when it is plain, otherwise quoted as a Rust string literal (`"`
/// and `\` escaped by `\`, control characters, separators and
/// bidirectional overrides as escapes) when it is empty or holds a space,
/// `=`, `"`, `\` or anything [`one_line`] escapes. So a value from
/// outside (a channel, an id) can neither begin a line nor pose as a
/// field of its own (`from="a reason=forged"`, not `from=a reason=forged`).
pub(crate) fn field_value(text: &str) -> std::borrow::Cow<'_, str> {
    let plain = !text.is_empty()
        && !text
            .chars()
            .any(|c| matches!(c, ' ' | '=' | '"' | '\\') || escaped_in_a_line(c));
    if plain {
        std::borrow::Cow::Borrowed(text)
    } else {
        // str's Debug escapes every control character and every character
        // that is not printable (the separators and overrides among them).
        std::borrow::Cow::Owned(format!("{text:?}"))
    }
}

/// What [`one_line`] escapes.
fn escaped_in_a_line(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
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
            Content::Payload(text) => write!(f, "payload={}", one_line(text)),
            Content::Fields(fields) => {
                let mut first = true;
                for (name, value) in fields {
                    if !first {
                        f.write_str(" ")?;
                    }
                    first = false;
                    write!(f, "{}={}", field_value(name), field_value(value))?;
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
                "received endpoint={endpoint} from={} fence={} {content}",
                field_value(from),
                fence.map_or("-".into(), |x| x.to_string())
            ),
            Event::DeadLettered {
                endpoint,
                from,
                reason,
            } => write!(
                f,
                "dead-lettered endpoint={endpoint} from={} reason={}",
                field_value(from),
                one_line(reason)
            ),
            Event::SinkDeadLettered {
                sink,
                id,
                from,
                reason,
            } => write!(
                f,
                "dead-lettered sink={sink} id={} from={} reason={}",
                field_value(id),
                field_value(from),
                one_line(reason)
            ),
            Event::DeadLettersOpened { dir, lost_bytes } => write!(
                f,
                "dead-letters dir={} lost_bytes={lost_bytes}",
                one_line(dir)
            ),
            Event::QueueOpened {
                sink,
                pending,
                lost_bytes,
                damaged_segments,
                missing_segments,
                cursor_reset,
            } => write!(
                f,
                "queue sink={sink} pending={pending} lost_bytes={lost_bytes} damaged_segments={damaged_segments} missing_segments={missing_segments} cursor_reset={cursor_reset}"
            ),
            Event::Skipped {
                router,
                slot,
                reason,
            } => write!(
                f,
                "skipped router={router} slot={slot} reason={}",
                one_line(reason)
            ),
            Event::Failed {
                router,
                slot,
                attempts,
                reason,
            } => write!(
                f,
                "failed router={router} slot={slot} attempts={attempts} reason={}",
                one_line(reason)
            ),
            Event::Reloaded {
                started,
                restarted,
                stopped,
                failed,
                kept,
            } => {
                let list = |units: &[String]| {
                    if units.is_empty() {
                        "-".to_owned()
                    } else {
                        one_line(&units.join(",")).into_owned()
                    }
                };
                write!(
                    f,
                    "reloaded started={} restarted={} stopped={} failed={} kept={kept}",
                    list(started),
                    list(restarted),
                    list(stopped),
                    list(failed)
                )
            }
            Event::ReloadRefused { reason } => {
                write!(f, "reload-refused reason={}", one_line(reason))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_message_or_a_command_says_never_begins_a_line_of_its_own() {
        let forged = "x\nexecuted router=fake slot=1";
        let events = [
            Event::Received {
                endpoint: "orders".into(),
                from: "1-0".into(),
                fence: None,
                content: Content::Fields(vec![("b".into(), forged.into())]),
            },
            Event::Received {
                endpoint: "alerts".into(),
                from: "alerts.fire\r".into(),
                fence: Some(3),
                content: Content::Payload(forged.into()),
            },
            Event::Failed {
                router: "backup".into(),
                slot: UnixMillis(1),
                attempts: 1,
                reason: "exit status: 3: some noise\ndisk full".into(),
            },
            Event::DeadLettered {
                endpoint: "alerts".into(),
                from: "a".into(),
                reason: forged.into(),
            },
        ];
        for event in events {
            let line = event.to_string();
            assert!(!line.chars().any(char::is_control), "{line:?}");
        }
        let line = Event::Failed {
            router: "backup".into(),
            slot: UnixMillis(1),
            attempts: 1,
            reason: "some noise\ndisk full".into(),
        }
        .to_string();
        assert!(line.ends_with("reason=some noise\\ndisk full"), "{line}");
    }

    #[test]
    fn a_value_from_outside_never_poses_as_a_field_of_its_own() {
        let line = Event::DeadLettered {
            endpoint: "alerts".into(),
            from: "alerts.x reason=forged".into(),
            reason: "rate limited".into(),
        }
        .to_string();
        assert_eq!(
            line,
            "dead-lettered endpoint=alerts from=\"alerts.x reason=forged\" reason=rate limited"
        );
        let line = Event::SinkDeadLettered {
            sink: "uplink".into(),
            id: "a\"b c\\".into(),
            from: String::new(),
            reason: "gone".into(),
        }
        .to_string();
        assert_eq!(
            line,
            "dead-lettered sink=uplink id=\"a\\\"b c\\\\\" from=\"\" reason=gone"
        );
        let line = Event::Received {
            endpoint: "orders".into(),
            from: "1-0".into(),
            fence: None,
            content: Content::Fields(vec![
                ("temp".into(), "21".into()),
                ("note".into(), "x fence=9".into()),
            ]),
        }
        .to_string();
        assert_eq!(
            line,
            "received endpoint=orders from=1-0 fence=- temp=21 note=\"x fence=9\""
        );
        // Plain values are written as they are.
        assert_eq!(field_value("alerts.fire"), "alerts.fire");
    }
}

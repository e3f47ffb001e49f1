//! An endpoint whose sink writes where the endpoint reads: each message
//! forwarded would be read again and forwarded again, forever, at the
//! uplink's full rate. Refused when the file is read.
//!
//! The same place is the same server, as written (the same URL, or both
//! on the locker's connection; the same host and port), and a name the
//! source reads: the stream key, or a topic or subject its filter
//! matches. Two spellings of one server (`localhost` and `127.0.0.1`)
//! are not told apart.

use super::{ConfigError, Source, invalid};
use crate::sink::{Sink, SinkKind};

/// Refuses `sink` as the `to` (at `key`) of an endpoint reading `source`
/// when it writes where `source` reads.
pub(crate) fn not_into_its_source(
    key: &str,
    source: &Source,
    sink: &Sink,
) -> Result<(), ConfigError> {
    let written = match (source, &sink.kind) {
        (Source::RedisStream(s), SinkKind::RedisStream(t)) if s.url == t.url => {
            (s.stream == t.stream).then(|| format!("the stream {:?}", t.stream))
        }
        (Source::Mqtt(s), SinkKind::Mqtt(t)) if (&s.host, s.port) == (&t.host, t.port) => {
            filter_matches(&s.filter, &t.topic, &MQTT).then(|| format!("the topic {:?}", t.topic))
        }
        #[cfg(feature = "nats")]
        (Source::Nats(s), SinkKind::JetStream(t)) if s.url == t.url => {
            filter_matches(&s.subject, &t.subject, &NATS)
                .then(|| format!("the subject {:?}", t.subject))
        }
        #[cfg(feature = "nats")]
        (Source::NatsJetStream(s), SinkKind::JetStream(t)) if s.url == t.url => s
            .subjects
            .iter()
            .any(|subjects| filter_matches(subjects, &t.subject, &NATS))
            .then(|| format!("the subject {:?}, one of its stream's", t.subject)),
        _ => None,
    };
    match written {
        Some(place) => Err(invalid(
            key,
            format!("{:?}", sink.name),
            format!(
                "a sink that does not write where the endpoint reads ({place}: every message would come back, forever)"
            ),
        )),
        None => Ok(()),
    }
}

/// How a filter is written: levels split at `separator`, `one` matching
/// a level, `rest` (last) the levels left.
struct Syntax {
    separator: char,
    one: &'static str,
    rest: &'static str,
    /// `rest` matches no level too: MQTT's `a/#` matches `a`, NATS's
    /// `a.>` does not match `a`.
    rest_may_be_none: bool,
}

const MQTT: Syntax = Syntax {
    separator: '/',
    one: "+",
    rest: "#",
    rest_may_be_none: true,
};

// Used by the NATS kinds, each behind the `nats` feature (and the tests).
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
const NATS: Syntax = Syntax {
    separator: '.',
    one: "*",
    rest: ">",
    rest_may_be_none: false,
};

/// Whether `name` is one of the names `filter` selects.
fn filter_matches(filter: &str, name: &str, syntax: &Syntax) -> bool {
    let mut names = name.split(syntax.separator);
    for level in filter.split(syntax.separator) {
        if level == syntax.rest {
            return names.next().is_some() || syntax.rest_may_be_none;
        }
        match names.next() {
            Some(n) if level == syntax.one || level == n => {}
            _ => return false,
        }
    }
    names.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::{MQTT, NATS, filter_matches};

    #[test]
    fn filters_match_as_mqtt_and_nats_match_them() {
        let mqtt = |f: &str, t: &str| filter_matches(f, t, &MQTT);
        assert!(mqtt("a/b", "a/b"));
        assert!(mqtt("a/+", "a/b"));
        assert!(mqtt("a/#", "a/b/c"));
        assert!(mqtt("#", "a"));
        assert!(mqtt("a/#", "a"), "MQTT's # matches its parent level");
        assert!(!mqtt("a/+", "a/b/c"));
        assert!(!mqtt("a/b", "a/b/c"));
        assert!(!mqtt("a/b/c", "a/b"));
        assert!(!mqtt("a/b", "a/c"));
        let nats = |f: &str, s: &str| filter_matches(f, s, &NATS);
        assert!(nats("up.>", "up.orders"));
        assert!(nats("up.*.x", "up.a.x"));
        assert!(!nats("up.>", "up"));
        assert!(!nats("up.*", "up.a.b"));
    }
}

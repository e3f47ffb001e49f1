//! A `tracing` subscriber for tests: it records every span when it
//! closes, with its name, its parent's name and its fields as they were
//! last recorded (a span's `outcome` is recorded once the call answered),
//! and every event with its level, message and the span it happened in,
//! at every level.
//!
//! ```
//! use guard_testkit::SpanLog;
//!
//! let log = SpanLog::new();
//! tracing::subscriber::with_default(log.subscriber(), || {
//!     let span = tracing::debug_span!("send", sink = "archive", outcome = tracing::field::Empty);
//!     span.record("outcome", "ok");
//! });
//! let sent = log.closed("send");
//! assert_eq!(sent[0].field("sink"), Some("archive"));
//! assert_eq!(sent[0].field("outcome"), Some("ok"));
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber, subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;

/// A span as it closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClosedSpan {
    /// Its name.
    pub name: String,
    /// Its parent's name, if it had one.
    pub parent: Option<String>,
    /// Its fields, each as recorded last: a string as it is, anything
    /// else as its `Debug`.
    pub fields: BTreeMap<String, String>,
}

impl ClosedSpan {
    /// The field `name`, if it was recorded.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// An event (a line) as it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedEvent {
    /// Its level.
    pub level: tracing::Level,
    /// Its message (the `message` field).
    pub message: String,
    /// The name of the span it happened in, if any.
    pub span: Option<String>,
}

/// The spans closed and the events logged so far, shared with the
/// subscriber that records them.
#[derive(Clone, Debug, Default)]
pub struct SpanLog(Arc<Mutex<Recorded>>);

#[derive(Debug, Default)]
struct Recorded {
    spans: Vec<ClosedSpan>,
    events: Vec<LoggedEvent>,
}

impl SpanLog {
    /// An empty log.
    pub fn new() -> Self {
        SpanLog::default()
    }

    /// The process's log, its subscriber installed as the global default
    /// on the first call: for code whose spans open on threads of its own.
    /// Tests of one binary share it; tell your spans apart by their keys.
    /// `None` when another global subscriber was installed first.
    pub fn global() -> Option<SpanLog> {
        static GLOBAL: OnceLock<Option<SpanLog>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let log = SpanLog::new();
                subscriber::set_global_default(log.subscriber())
                    .ok()
                    .map(|()| log)
            })
            .clone()
    }

    /// A subscriber recording into this log, for
    /// `tracing::subscriber::with_default` (this thread) or
    /// `set_global_default` (the process).
    pub fn subscriber(&self) -> impl Subscriber + Send + Sync + 'static {
        tracing_subscriber::registry().with(Recorder(self.clone()))
    }

    /// Every span closed so far, in the order they closed.
    pub fn all(&self) -> Vec<ClosedSpan> {
        self.recorded().spans.clone()
    }

    /// Every event logged so far, in order.
    pub fn events(&self) -> Vec<LoggedEvent> {
        self.recorded().events.clone()
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The spans called `name` closed so far.
    pub fn closed(&self, name: &str) -> Vec<ClosedSpan> {
        self.all().into_iter().filter(|s| s.name == name).collect()
    }
}

/// The layer that fills a [`SpanLog`].
struct Recorder(SpanLog);

/// A span's fields while it is open, kept in its extensions.
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S> Layer<S> for Recorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attributes: &Attributes<'_>, id: &Id, context: Context<'_, S>) {
        let mut fields = Fields(BTreeMap::new());
        attributes.record(&mut fields);
        if let Some(span) = context.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, context: Context<'_, S>) {
        if let Some(span) = context.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }

    fn on_close(&self, id: Id, context: Context<'_, S>) {
        let Some(span) = context.span(&id) else {
            return;
        };
        let fields = span
            .extensions_mut()
            .remove::<Fields>()
            .map(|f| f.0)
            .unwrap_or_default();
        let closed = ClosedSpan {
            name: span.name().to_owned(),
            parent: span.parent().map(|p| p.name().to_owned()),
            fields,
        };
        self.0.recorded().spans.push(closed);
    }

    fn on_event(&self, event: &Event<'_>, context: Context<'_, S>) {
        let mut fields = Fields(BTreeMap::new());
        event.record(&mut fields);
        let logged = LoggedEvent {
            level: *event.metadata().level(),
            message: fields.0.remove("message").unwrap_or_default(),
            span: context.lookup_current().map(|s| s.name().to_owned()),
        };
        self.0.recorded().events.push(logged);
    }
}

//! The gateway's lines and spans.
//!
//! Events of `tracing` (the gateway's, the libraries') and the `log`
//! records of its dependencies go to stderr, one line each:
//! `[LEVEL target] span{fields}: ... message fields`, every control
//! character of the message and fields escaped (a channel or a topic named
//! with a newline cannot forge a line), the spans being the
//! ones the event happened in (an acquisition with its key, a sink's
//! send with its message id). `RUST_LOG` filters them, `info` by
//! default; async-nats never below `info` (at `debug` it logs its server
//! URL whole, password included). The filter decides which spans exist
//! at all: lock calls are `info`, per-message work `debug`.
//!
//! With the `otel` feature and `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, the spans also go to an
//! OpenTelemetry collector, OTLP over HTTP (protobuf), batched on a thread
//! of their own, as service `guard-gateway`; the other standard
//! `OTEL_EXPORTER_OTLP_*` variables (headers, timeout) apply.

use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent as _;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, filter::LevelFilter};

use crate::event::{field_value, one_line};

/// What [`install`] set up; dropping it sends the spans still batched
/// (with the `otel` feature).
#[must_use = "dropping it ends the export of spans"]
pub struct Installed {
    #[cfg(feature = "otel")]
    exporter: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Installed {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.exporter.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("OpenTelemetry export: the last spans were not sent: {e}");
        }
    }
}

/// Installs the process's subscriber. `status_line`: stderr is a
/// terminal on which the demo keeps a status line at the bottom, so each
/// line first clears it and the two never glue together.
pub fn install(status_line: bool) -> Result<Installed, Box<dyn std::error::Error + Send + Sync>> {
    let filter = EnvFilter::builder()
        .with_default_directive(LevelFilter::INFO.into())
        .from_env_lossy()
        .add_directive("async_nats=info".parse()?);
    let lines = lines(status_line, std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter).with(lines);
    #[cfg(feature = "otel")]
    {
        let exporter = otel::provider()?;
        let layer = exporter.as_ref().map(|provider| {
            use opentelemetry::trace::TracerProvider as _;
            tracing_opentelemetry::layer().with_tracer(provider.tracer("guard-gateway"))
        });
        registry.with(layer).try_init()?;
        Ok(Installed { exporter })
    }
    #[cfg(not(feature = "otel"))]
    {
        registry.try_init()?;
        Ok(Installed {})
    }
}

/// The layer that writes each event as one [`Line`] to `writer`.
fn lines<S, W>(status_line: bool, writer: W) -> impl tracing_subscriber::Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + 'static,
{
    // No colours: a field name's escape codes would be escaped with the
    // control characters of the values (see `Line`).
    tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(writer)
        .fmt_fields(QuotedFields)
        .event_format(Line { status_line })
}

/// Fields as `name=value`, each value from outside written by
/// [`field_value`]: quoted when it holds a space, `=` or `"`, however it
/// was recorded (`%`, `?` or a string), so that no value poses as a field
/// of its own. The message is written as it is, first.
struct QuotedFields;

impl<'w> FormatFields<'w> for QuotedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut quoting = Quoting {
            writer: &mut writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut quoting);
        quoting.result
    }
}

/// [`QuotedFields`]' visitor: writes each field in turn, keeping the
/// first error.
struct Quoting<'a, 'w> {
    writer: &'a mut Writer<'w>,
    first: bool,
    result: std::fmt::Result,
}

impl Quoting<'_, '_> {
    fn write(&mut self, field: &tracing::field::Field, value: &str) {
        let name = field.name();
        // tracing-log's own fields, already in the line's target.
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let separator = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        self.result = if name == "message" {
            write!(self.writer, "{separator}{value}")
        } else {
            let name = name.strip_prefix("r#").unwrap_or(name);
            write!(self.writer, "{separator}{name}={}", field_value(value))
        };
    }
}

impl tracing::field::Visit for Quoting<'_, '_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.write(field, value);
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.write(field, &format!("{value:?}"));
    }
}

/// One line per event: `[LEVEL target] span{fields}: message fields`.
struct Line {
    status_line: bool,
}

impl<S, N> FormatEvent<S, N> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        context: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        // A dependency's `log` record: its own target, not "log".
        let normalized = event.normalized_metadata();
        let metadata = normalized.as_ref().unwrap_or_else(|| event.metadata());
        if self.status_line {
            writer.write_str("\r\x1b[2K")?;
        }
        write!(writer, "[{} {}] ", metadata.level(), metadata.target())?;
        if let Some(scope) = context.event_scope() {
            for span in scope.from_root() {
                writer.write_str(span.name())?;
                if let Some(fields) = span.extensions().get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    write!(writer, "{{{}}}", one_line(fields))?;
                }
                writer.write_str(": ")?;
            }
        }
        // The message and fields carry text from outside (a channel, a
        // topic, a broker's error): formatted apart, then written as one
        // line, so no value can begin a line of its own.
        let mut fields = String::new();
        context
            .field_format()
            .format_fields(Writer::new(&mut fields), event)?;
        writer.write_str(&one_line(&fields))?;
        writeln!(writer)
    }
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry_otlp::{Protocol, WithExportConfig as _};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;

    /// The variables that name a collector; without one, nothing is
    /// exported.
    const ENDPOINTS: [&str; 2] = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ];

    /// A provider exporting to the collector the environment names, if
    /// it names one.
    pub(super) fn provider()
    -> Result<Option<SdkTracerProvider>, Box<dyn std::error::Error + Send + Sync>> {
        if !ENDPOINTS
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
        {
            return Ok(None);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()
            .map_err(|e| format!("OpenTelemetry exporter: {e}"))?;
        Ok(Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    Resource::builder()
                        .with_service_name("guard-gateway")
                        .build(),
                )
                .build(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex, PoisonError};

    use tracing_subscriber::layer::SubscriberExt as _;

    /// What the lines layer wrote.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let mut written = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            written.extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the lines layer writes of the events `log` makes.
    fn written_by(log: impl FnOnce()) -> String {
        let written = Written::default();
        let writer = {
            let written = written.clone();
            move || written.clone()
        };
        let subscriber = tracing_subscriber::registry().with(super::lines(false, writer));
        tracing::subscriber::with_default(subscriber, log);
        let text = written
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        String::from_utf8(text).unwrap()
    }

    #[test]
    fn a_name_from_outside_with_a_newline_cannot_forge_a_line() {
        let text = written_by(|| {
            let channel = "sensors\n[ERROR guard_gateway] FORGED\r\x1b[2K\u{2028}\u{202e}";
            let span = tracing::info_span!("receive", from = %channel);
            let _entered = span.enter();
            tracing::warn!(from = channel, "no handler for {channel}");
        });
        assert_eq!(text.lines().count(), 1, "one event, one line: {text:?}");
        assert!(
            !text.contains(['\x1b', '\r', '\u{2028}', '\u{202e}']),
            "{text:?}"
        );
        assert_eq!(
            text.matches("sensors\\n[ERROR guard_gateway] FORGED")
                .count(),
            3,
            "{text}"
        );
    }

    #[test]
    fn a_field_from_outside_never_poses_as_another_field() {
        let text = written_by(|| {
            let channel = "sensors reason=forged";
            let span = tracing::info_span!("receive", from = %channel, n = 3);
            let _entered = span.enter();
            tracing::warn!(from = %channel, plain = %"alerts.fire", id = channel, "refused");
        });
        assert_eq!(
            text.trim_end(),
            "[WARN guard_gateway::logging::tests] receive{from=\"sensors reason=forged\" n=3}: \
             refused from=\"sensors reason=forged\" plain=alerts.fire id=\"sensors reason=forged\"",
        );
    }
}

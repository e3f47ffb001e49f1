//! The gateway's lines and spans.
//!
//! Events of `tracing` (the gateway's, the libraries') and the `log`
//! records of its dependencies go to stderr, one line each:
//! `[LEVEL target] span{fields}: ... message fields`, the spans being the
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
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .event_format(Line { status_line });
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
                    write!(writer, "{{{fields}}}")?;
                }
                writer.write_str(": ")?;
            }
        }
        context
            .field_format()
            .format_fields(writer.by_ref(), event)?;
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

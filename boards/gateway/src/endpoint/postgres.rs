//! `kind = "postgres-queue"`: a table of work, each row claimed by one
//! replica, in one module: the `[[endpoints]]` entry as written, its
//! check with [`guard_endpoints::postgres`]'s own rules (so a
//! configuration that loads builds its queue), the validated source, what
//! `check` prints of it and its assembly. Refused, naming the feature, in
//! a build without `postgres`.

use std::time::Duration;

use guard_core::retry::RetryPolicy;
use serde::Deserialize;

#[cfg(feature = "postgres")]
use super::retrying::Report;
#[cfg(feature = "postgres")]
use super::{Assembly, Task, failed, never_invalid};
use crate::config::check::{Env, MAX_BATCH, MAX_TIMEOUT_MS, bounded, expand, retry};
use crate::config::raw;
use crate::config::{ConfigError, RedactedUrl, Source};
#[cfg(feature = "postgres")]
use crate::error::GatewayError;
#[cfg(feature = "postgres")]
use guard_endpoints::postgres::PgQueue;

/// `kind = "postgres-queue"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgQueueSource {
    /// The server (`postgres://user@host:port/database`).
    pub url: RedactedUrl,
    /// The table of work.
    pub table: String,
    /// Where given-up rows go (`<table>_dead_letters` unless given).
    pub dead_letter_table: Option<String>,
    /// Rows claimed at once.
    pub batch: usize,
    /// How long a claim lasts.
    pub claim_lease: Duration,
    /// Claims of a row before it is dead-lettered unhandled.
    pub max_deliveries: u32,
    /// How long to wait after a poll that found nothing.
    pub poll_interval: Duration,
    /// Retries of a failing row within one claim.
    pub retry: RetryPolicy,
}

/// A `kind = "postgres-queue"` entry of `[[endpoints]]` as written (an unknown key
/// is refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PgQueueEntry {
    pub name: String,
    pub url: String,
    pub table: String,
    pub dead_letter_table: Option<String>,
    pub batch: Option<u64>,
    pub claim_lease_ms: Option<u64>,
    pub max_deliveries: Option<u32>,
    pub poll_interval_ms: Option<u64>,
    pub retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub limit: Option<String>,
    pub limit_key: Option<String>,
    pub when_limited: Option<raw::WhenLimited>,
    pub max_wait_ms: Option<u64>,
    pub max_payload_bytes: Option<u64>,
}

/// `kind = "postgres-queue"`.
#[cfg(feature = "postgres")]
pub(crate) fn resolve(
    p: &PgQueueEntry,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Source, ConfigError> {
    use guard_endpoints::postgres::{
        DEFAULT_BATCH, DEFAULT_CLAIM_LEASE, DEFAULT_MAX_DELIVERIES, DEFAULT_POLL_INTERVAL, PgQueue,
        PgQueueError,
    };
    let refused = |field: &str, e: PgQueueError| crate::config::check::refused(field, key, &e);
    let url = RedactedUrl::with_shown(
        expand(&key("url"), &p.url, env)?,
        guard_postgres::server::redacted(&p.url),
    );
    let mut queue = PgQueue::new(&url, &p.table)
        .map_err(|e| crate::config::check::refused_url(key, &url, &p.url, &e))?;
    if let Some(table) = &p.dead_letter_table {
        queue = queue
            .with_dead_letter_table(table)
            .map_err(|e| refused("dead_letter_table", e))?;
    }
    let batch = match p.batch {
        None => DEFAULT_BATCH,
        Some(n) => {
            usize::try_from(bounded(&key("batch"), n, MAX_BATCH, "rows")?).unwrap_or(usize::MAX)
        }
    };
    let claim_lease = match p.claim_lease_ms {
        None => DEFAULT_CLAIM_LEASE,
        Some(ms) => {
            let lease = Duration::from_millis(ms);
            queue
                .clone()
                .with_claim_lease(lease)
                .map_err(|e| refused("claim_lease_ms", e))?;
            lease
        }
    };
    let max_deliveries = match p.max_deliveries {
        None => DEFAULT_MAX_DELIVERIES,
        Some(n) => {
            queue
                .with_max_deliveries(n)
                .map_err(|e| refused("max_deliveries", e))?;
            n
        }
    };
    let poll_interval = match p.poll_interval_ms {
        None => DEFAULT_POLL_INTERVAL,
        Some(ms) => Duration::from_millis(bounded(
            &key("poll_interval_ms"),
            ms,
            MAX_TIMEOUT_MS,
            "milliseconds",
        )?),
    };
    Ok(Source::PostgresQueue(PgQueueSource {
        url,
        table: p.table.clone(),
        dead_letter_table: p.dead_letter_table.clone(),
        batch,
        claim_lease,
        max_deliveries,
        poll_interval,
        retry: retry(p.retries, p.retry_delay_ms, key)?,
    }))
}

/// `kind = "postgres-queue"`: refused in this build.
#[cfg(not(feature = "postgres"))]
pub(crate) fn resolve(
    p: &PgQueueEntry,
    key: &dyn Fn(&str) -> String,
    _env: Env<'_>,
) -> Result<Source, ConfigError> {
    retry(p.retries, p.retry_delay_ms, key)?;
    Err(crate::config::check::unsupported(
        "postgres-queue",
        "postgres",
        key,
    ))
}

/// What `check` prints of a table of work.
#[cfg(feature = "postgres")]
pub(super) fn describe(source: &PgQueueSource) -> String {
    format!("postgres-queue, rows claimed from {}", source.table)
}

/// The claimer of a table of work (its tables created unless they exist).
#[cfg(feature = "postgres")]
pub(super) async fn start(cx: Assembly<'_>, source: &PgQueueSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let identity = cx.identity;
    let context = |source| failed(&name, source);
    let mut queue = PgQueue::new(&source.url, &source.table)
        .and_then(|q| q.with_batch(source.batch))
        .and_then(|q| q.with_claim_lease(source.claim_lease))
        .and_then(|q| q.with_max_deliveries(source.max_deliveries))
        .and_then(|q| q.with_retry(source.retry))
        .and_then(|q| q.with_consumer_name(&format!("{name}-{identity}")))
        .map_err(|e| context(e.into()))?
        .with_poll_interval(source.poll_interval)
        .with_link(cx.link);
    if let Some(table) = &source.dead_letter_table {
        queue = queue
            .with_dead_letter_table(table)
            .map_err(|e| context(e.into()))?;
    }
    queue.create_tables().await.map_err(|e| context(e.into()))?;
    let table = source.table.clone();
    Ok(Box::pin(async move {
        let stats = queue
            .run(control, never_invalid(), |message| {
                let from = format!("{table}#{}", message.id);
                Report::new(&inbox, &emit, &name).kept(from, message.payload)
            })
            .await;
        tracing::info!("endpoint {name}: {stats:?}");
    }))
}

//! `kind = "mysql-binlog"`: one elected reader of the binlog,
//! checkpointed under its fence, in one module: the `[[endpoints]]` entry
//! as written, its check with [`guard_endpoints::mysql`]'s own rules (so
//! a configuration that loads builds its reader), the validated source,
//! what `check` prints of it and its assembly. Refused, naming the
//! feature, in a build without `mysql`.

use guard_core::retry::RetryPolicy;
use serde::Deserialize;

#[cfg(feature = "mysql")]
use super::{Assembly, Content, Event, Refused, Task, elected_scope, failed, never_invalid};
use crate::config::check::{Env, expand, retry};
use crate::config::raw;
use crate::config::{ConfigError, RedactedUrl, Source, invalid};
#[cfg(feature = "mysql")]
use crate::error::GatewayError;
#[cfg(feature = "mysql")]
use guard_endpoints::mysql::{BinlogReader, ColumnValue, Start, json_array};

/// `kind = "mysql-binlog"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinlogSource {
    /// The server (`mysql://user:password@host:port/database`).
    pub url: RedactedUrl,
    /// The server id the reader registers with (derived from the name
    /// unless given).
    pub server_id: Option<u32>,
    /// Where a reader without a checkpoint starts.
    pub start: BinlogStart,
    /// A checkpoint after this many transactions.
    pub checkpoint_every: u32,
    /// The checkpoints table (the default unless given).
    pub checkpoint_table: Option<String>,
    /// The dead-letter table (the default unless given).
    pub dead_letter_table: Option<String>,
    /// Retries of a failing change.
    pub retry: RetryPolicy,
}

/// Where a binlog reader without a checkpoint starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinlogStart {
    /// The server's current end of the binlog.
    Current,
    /// The server's first binlog still kept.
    Beginning,
}

/// A `kind = "mysql-binlog"` entry of `[[endpoints]]` as written (an unknown key
/// is refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BinlogEntry {
    pub name: String,
    pub url: String,
    pub server_id: Option<u32>,
    pub start: Option<raw::BinlogStart>,
    pub checkpoint_every: Option<u32>,
    pub checkpoint_table: Option<String>,
    pub dead_letter_table: Option<String>,
    pub retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub limit: Option<String>,
    pub limit_key: Option<String>,
    pub when_limited: Option<raw::WhenLimited>,
    pub max_wait_ms: Option<u64>,
    pub max_payload_bytes: Option<u64>,
}

/// `kind = "mysql-binlog"`.
#[cfg(feature = "mysql")]
pub(crate) fn resolve(
    m: &BinlogEntry,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Source, ConfigError> {
    use crate::config::check::refused_url;
    use guard_endpoints::mysql::{BinlogError, BinlogReader};
    let refused = |field: &str, e: BinlogError| crate::config::check::refused(field, key, &e);
    let url = RedactedUrl::new(expand(&key("url"), &m.url, env)?, &m.url);
    // The reader's own checks, on a reader that is never run (no locker).
    let unguarded = guard_std::GuardConfig::new();
    let scope = unguarded
        .scope("endpoint/binlog")
        .map_err(|e| invalid(key("name"), format!("{:?}", m.name), e.to_string()))?;
    let reader = BinlogReader::new(&url, &m.name, &unguarded, &scope)
        .map_err(|e| refused_url(key, &url, &m.url, &e))?;
    let reader = match m.server_id {
        Some(id) => reader
            .with_server_id(id)
            .map_err(|e| refused("server_id", e))?,
        None => reader,
    };
    let reader = match &m.checkpoint_table {
        Some(table) => reader
            .with_checkpoint_table(table)
            .map_err(|e| refused("checkpoint_table", e))?,
        None => reader,
    };
    let reader = match &m.dead_letter_table {
        Some(table) => reader
            .with_dead_letter_table(table)
            .map_err(|e| refused("dead_letter_table", e))?,
        None => reader,
    };
    let checkpoint_every = m.checkpoint_every.unwrap_or(1);
    reader
        .with_checkpoint_every(checkpoint_every)
        .map_err(|e| refused("checkpoint_every", e))?;
    Ok(Source::MysqlBinlog(BinlogSource {
        url,
        server_id: m.server_id,
        start: match m.start {
            None | Some(raw::BinlogStart::Current) => BinlogStart::Current,
            Some(raw::BinlogStart::Beginning) => BinlogStart::Beginning,
        },
        checkpoint_every,
        checkpoint_table: m.checkpoint_table.clone(),
        dead_letter_table: m.dead_letter_table.clone(),
        retry: retry(m.retries, m.retry_delay_ms, key)?,
    }))
}

/// `kind = "mysql-binlog"`: refused in this build.
#[cfg(not(feature = "mysql"))]
pub(crate) fn resolve(
    m: &BinlogEntry,
    key: &dyn Fn(&str) -> String,
    _env: Env<'_>,
) -> Result<Source, ConfigError> {
    retry(m.retries, m.retry_delay_ms, key)?;
    Err(crate::config::check::unsupported(
        "mysql-binlog",
        "mysql",
        key,
    ))
}

/// What `check` prints of a binlog source.
#[cfg(feature = "mysql")]
pub(super) fn describe(_source: &BinlogSource) -> String {
    "mysql-binlog, elected reader".to_owned()
}

/// The elected reader of a binlog.
#[cfg(feature = "mysql")]
pub(super) fn start(cx: Assembly<'_>, source: &BinlogSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let (built, timing) = (cx.built, cx.timing);
    let context = |source| failed(&name, source);
    let ready = cx.ready;
    let scope = |kind: &str| elected_scope(built, ready, kind, &name);
    let scope = scope(super::kind::BINLOG)?;
    let mut reader = BinlogReader::new(&source.url, &name, &built.guards, &scope)
        .and_then(|r| r.with_lock_service(&built.lock_service))
        .and_then(|r| r.with_guard_settings(timing))
        .and_then(|r| r.with_checkpoint_every(source.checkpoint_every))
        .and_then(|r| r.with_retry(source.retry))
        .map_err(|e| context(e.into()))?
        .with_start(match source.start {
            BinlogStart::Current => Start::Current,
            BinlogStart::Beginning => Start::Beginning,
        })
        .with_link(cx.link);
    if let Some(id) = source.server_id {
        reader = reader.with_server_id(id).map_err(|e| context(e.into()))?;
    }
    if let Some(table) = &source.checkpoint_table {
        reader = reader
            .with_checkpoint_table(table)
            .map_err(|e| context(e.into()))?;
    }
    if let Some(table) = &source.dead_letter_table {
        reader = reader
            .with_dead_letter_table(table)
            .map_err(|e| context(e.into()))?;
    }
    Ok(Box::pin(async move {
        let stats = reader
            .run(control, never_invalid(), |change| {
                let (inbox, emit, name) = (inbox.clone(), emit.clone(), name.clone());
                async move {
                    let from = format!(
                        "{}.{}@{}#{}",
                        change.database, change.table, change.position, change.row
                    );
                    let image = |row: &Option<Vec<ColumnValue>>| {
                        row.as_deref().map_or_else(|| "-".to_owned(), json_array)
                    };
                    let (before, after) = (image(&change.before), image(&change.after));
                    inbox
                        .check_message(&from, before.len() + after.len(), change.lease.as_ref())
                        .await?;
                    // Sent on as one JSON object, a missing image null.
                    fn json(image: &str) -> &str {
                        if image == "-" { "null" } else { image }
                    }
                    let payload = format!(
                        "{{\"kind\":\"{}\",\"before\":{},\"after\":{}}}",
                        change.kind.name(),
                        json(&before),
                        json(&after)
                    );
                    inbox
                        .forward(
                            Some(&from),
                            &from,
                            payload.as_bytes(),
                            change.lease.as_ref(),
                        )
                        .await?;
                    emit(Event::Received {
                        endpoint: name,
                        from,
                        fence: Some(change.fence),
                        content: Content::Fields(vec![
                            ("kind".to_owned(), change.kind.name().to_owned()),
                            ("before".to_owned(), before),
                            ("after".to_owned(), after),
                        ]),
                    });
                    Ok::<(), Refused>(())
                }
            })
            .await;
        tracing::info!("endpoint {name}: {stats:?}");
    }))
}

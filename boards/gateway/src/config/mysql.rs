//! `kind = "mysql-binlog"`: checked with [`guard_endpoints::mysql`]'s own rules, so
//! a configuration that loads builds its reader. Refused, naming the
//! feature, in a build without `mysql`.

use super::check::{Env, expand, retry};
use super::raw;
use super::{BinlogSource, BinlogStart, ConfigError, RedactedUrl, Source, invalid};

/// `kind = "mysql-binlog"`.
#[cfg(feature = "mysql")]
pub(super) fn source(
    m: &raw::MysqlBinlog,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<Source, ConfigError> {
    use super::check::refused_url;
    use guard_endpoints::mysql::{BinlogError, BinlogReader};
    let refused = |field: &str, e: BinlogError| super::check::refused(field, key, &e);
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
pub(super) fn source(
    m: &raw::MysqlBinlog,
    key: &dyn Fn(&str) -> String,
    _env: Env<'_>,
) -> Result<Source, ConfigError> {
    retry(m.retries, m.retry_delay_ms, key)?;
    Err(super::check::unsupported("mysql-binlog", "mysql", key))
}

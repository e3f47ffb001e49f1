//! `[locker] kind = "postgres"`: checked with guard-postgres's own rules,
//! so a configuration that loads builds its locker. Refused, naming the
//! feature, in a build without `postgres`.

use std::time::Duration;

use super::check::{Env, MAX_TIMEOUT_MS, bounded, expand};
use super::raw;
use super::{ConfigError, RedactedUrl, invalid};

/// `[locker] kind = "postgres"`: a lease table, checked with
/// guard-postgres's own rules.
#[cfg(feature = "postgres")]
pub(super) fn locker(l: &raw::Locker, env: Env<'_>) -> Result<super::Locker, ConfigError> {
    use guard_postgres::{PgLockError, PgLocker, sql::DEFAULT_TABLE};
    let key = |field: &str| format!("locker.{field}");
    let refused = |field: &str, e: PgLockError| match e {
        PgLockError::InvalidInput { value, rule, .. } => {
            super::check::refused_value(field, &key, &value, &rule)
        }
        other => invalid(key(field), "set", other.to_string()),
    };
    let url = l.url.as_deref().ok_or_else(|| {
        invalid(
            "locker.url",
            "missing",
            "a PostgreSQL URL such as \"postgres://app@127.0.0.1:5432/app\"",
        )
    })?;
    let as_written = url;
    let url = expand("locker.url", url, env)?;
    let table = l.table.as_deref().unwrap_or(DEFAULT_TABLE);
    // guard-postgres's default unless set: a connect there is several
    // round trips (authentication, settings, prepared statements).
    let timeout = match l.request_timeout_ms {
        None => guard_postgres::DEFAULT_REQUEST_TIMEOUT,
        // At most half the locker's default purge grace.
        Some(ms) => Duration::from_millis(bounded(
            "locker.request_timeout_ms",
            ms,
            u64::try_from(guard_postgres::DEFAULT_PURGE_GRACE.as_millis() / 2)
                .unwrap_or(MAX_TIMEOUT_MS),
            "milliseconds",
        )?),
    };
    PgLocker::new(&url)
        .map_err(|e| match e {
            // The value as written: an expanded one may hold a secret.
            PgLockError::InvalidInput { rule, .. } => invalid(
                "locker.url",
                format!("{:?}", guard_postgres::server::redacted(as_written)),
                format!("a PostgreSQL URL or key=value string ({rule})"),
            ),
            other => refused("url", other),
        })?
        .with_table(table)
        .map_err(|e| refused("table", e))?
        .with_request_timeout(timeout)
        .map_err(|e| refused("request_timeout_ms", e))?;
    Ok(super::Locker::Postgres(super::PostgresLocker {
        url: RedactedUrl::with_shown(url, guard_postgres::server::redacted(as_written)),
        table: table.to_owned(),
        request_timeout: timeout,
    }))
}

/// `[locker] kind = "postgres"`: refused in this build.
#[cfg(not(feature = "postgres"))]
pub(super) fn locker(_l: &raw::Locker, _env: Env<'_>) -> Result<super::Locker, ConfigError> {
    Err(super::check::unsupported(
        "postgres",
        "postgres",
        &|field| format!("locker.{field}"),
    ))
}

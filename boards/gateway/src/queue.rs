//! `[sinks.queue]`: store-and-forward on disk in front of a sink.
//!
//! A sink with a queue takes a message once it is in the queue (guard-std's
//! [`DiskQueue`]), so its source acknowledges it then; a task per queue
//! forwards the queue to the sink in order
//! ([`forward`](guard_endpoints::sink::queued::forward)), riding out an
//! outage (the head waits, nothing is dropped) and dead-lettering only
//! what the sink refuses for good or as stale.
//!
//! ```toml
//! [[sinks]]
//! name = "uplink"
//! kind = "http"
//! url = "https://ingest.example.com/v1/readings"
//!
//! [sinks.queue]
//! dir = "/var/lib/guard/uplink"   # one directory per sink
//! max_bytes = 67108864            # 64 MiB on disk at most (the default)
//! sync = "interval"               # or "every-write"
//! sync_ms = 100                   # with "interval": the default
//! when_full = "wait"              # or "refuse"
//! full_wait_ms = 1000             # with "wait": how often a held-back sender looks again
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use guard_endpoints::sink::queued::{QueuedSink, WhenFull};
use guard_std::disk_queue::{DiskQueue, MIN_MAX_BYTES, QueueSettings, Recovery, SyncPolicy};
use serde::Deserialize;

use crate::config::check::{Env, MAX_TIMEOUT_MS, bounded, expand};
use crate::config::{ConfigError, invalid};
use crate::error::GatewayError;

/// A queue's bound unless configured: 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// The largest bound a queue takes: 1 TiB.
pub const MAX_MAX_BYTES: u64 = 1 << 40;
/// How often an `interval` queue syncs unless configured: 100 ms.
pub const DEFAULT_SYNC: Duration = Duration::from_millis(100);
/// How often a sender held back by a full `wait` queue looks again for
/// room (besides when forwarding frees some: a disk full of other files
/// frees up on its own time), unless configured: 1 s.
pub const DEFAULT_FULL_WAIT: Duration = Duration::from_secs(1);

/// `[sinks.queue]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueueEntry {
    pub dir: String,
    pub max_bytes: Option<u64>,
    pub sync: Option<String>,
    pub sync_ms: Option<u64>,
    pub when_full: Option<String>,
    pub full_wait_ms: Option<u64>,
}

/// A sink's queue, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkQueue {
    /// Its directory (one per sink).
    pub dir: PathBuf,
    /// Bound, segments and sync policy.
    pub settings: QueueSettings,
    /// What a full queue does with a message.
    pub when_full: WhenFull,
}

/// Checks a `[sinks.queue]` table; `key` names its fields.
pub(crate) fn resolve(
    entry: &QueueEntry,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
) -> Result<SinkQueue, ConfigError> {
    let dir = expand(&key("dir"), &entry.dir, env)?;
    if !std::path::Path::new(&dir).is_absolute() {
        return Err(invalid(
            key("dir"),
            format!("{dir:?}"),
            "an absolute path for the queue's files (not relative to wherever the gateway starts)",
        ));
    }
    let max_bytes = match entry.max_bytes {
        None => DEFAULT_MAX_BYTES,
        Some(n) if n < MIN_MAX_BYTES => {
            return Err(invalid(
                key("max_bytes"),
                n,
                format!("at least {MIN_MAX_BYTES} bytes"),
            ));
        }
        Some(n) => bounded(&key("max_bytes"), n, MAX_MAX_BYTES, "bytes")?,
    };
    let sync =
        match (entry.sync.as_deref(), entry.sync_ms) {
            (None | Some("interval"), None) => SyncPolicy::Every(DEFAULT_SYNC),
            (None | Some("interval"), Some(ms)) => SyncPolicy::Every(Duration::from_millis(
                bounded(&key("sync_ms"), ms, MAX_TIMEOUT_MS, "milliseconds")?,
            )),
            (Some("every-write"), None) => SyncPolicy::EveryWrite,
            (Some("every-write"), Some(ms)) => {
                return Err(invalid(
                    key("sync_ms"),
                    ms,
                    "no sync_ms with sync = \"every-write\" (every write is synced)",
                ));
            }
            (Some(other), _) => {
                return Err(invalid(
                    key("sync"),
                    format!("{other:?}"),
                    "`interval` (every sync_ms) or `every-write`",
                ));
            }
        };
    let settings = QueueSettings::new(max_bytes, sync)
        .map_err(|e| invalid(key("max_bytes"), max_bytes, e.to_string()))?;
    let when_full = match (entry.when_full.as_deref(), entry.full_wait_ms) {
        (None | Some("wait"), None) => WhenFull::Wait(DEFAULT_FULL_WAIT),
        (None | Some("wait"), Some(ms)) => WhenFull::Wait(Duration::from_millis(bounded(
            &key("full_wait_ms"),
            ms,
            MAX_TIMEOUT_MS,
            "milliseconds",
        )?)),
        (Some("refuse"), None) => WhenFull::Refuse,
        (Some("refuse"), Some(ms)) => {
            return Err(invalid(
                key("full_wait_ms"),
                ms,
                "no full_wait_ms with when_full = \"refuse\" (nothing waits)",
            ));
        }
        (Some(other), _) => {
            return Err(invalid(
                key("when_full"),
                format!("{other:?}"),
                "`wait` (hold the source back) or `refuse`",
            ));
        }
    };
    Ok(SinkQueue {
        dir: PathBuf::from(dir),
        settings,
        when_full,
    })
}

/// Opens a sink's queue: what recovery found is the caller's to report.
pub(crate) fn open(
    sink: &str,
    queue: &SinkQueue,
) -> Result<(Arc<QueuedSink>, Recovery), GatewayError> {
    let (disk, recovery) =
        DiskQueue::open(&queue.dir, queue.settings).map_err(|e| GatewayError::Sink {
            name: sink.to_owned(),
            source: e.into(),
        })?;
    let queued = QueuedSink::new(sink, disk, queue.when_full);
    queued.measure();
    Ok((Arc::new(queued), recovery))
}

/// What `check` prints of a queue.
pub(crate) fn describe(queue: &SinkQueue) -> String {
    let sync = match queue.settings.sync() {
        SyncPolicy::EveryWrite => "every write".to_owned(),
        SyncPolicy::Every(period) => format!("every {} ms", period.as_millis()),
    };
    let full = match queue.when_full {
        WhenFull::Wait(wait) => format!(
            "hold the sources back, looking again every {} ms",
            wait.as_millis()
        ),
        WhenFull::Refuse => "refuse".to_owned(),
    };
    format!(
        "queue {} (at most {} bytes, synced {sync}, when full: {full})",
        queue.dir.display(),
        queue.settings.max_bytes()
    )
}

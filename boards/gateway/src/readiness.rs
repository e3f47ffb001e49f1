//! What `/readyz` answers: ready once the replica has started (its
//! locker answered, its tasks running), and while every endpoint's source
//! reaches its server ([`Link`]); otherwise what it waits for. The same
//! is told to a service manager ([`Notifier`]) when one asks. It also
//! holds what the status view shows besides: which unit each lease key
//! is for, and the sinks' queues and the dead letters on disk.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use guard_endpoints::sink::queued::QueuedSink;

use crate::dead_letters::DeadLetterStore;

use guard_endpoints::link::Link;

use crate::service::Notifier;

/// A replica's readiness, shared by the replica and the metrics server.
#[derive(Debug, Default)]
pub struct Readiness {
    started: AtomicBool,
    /// Each source's link, and whether it connects at start (not on a
    /// promotion): such a link counts only once it has answered.
    links: Mutex<Vec<(Link, bool)>>,
    notifier: Option<Arc<Notifier>>,
    /// The unit each lease key is for (`endpoint:<name>`,
    /// `active:<name>`).
    owners: Mutex<BTreeMap<String, String>>,
    /// The Redis locker's key prefix, when the leases are held in Redis
    /// (where a key is stored otherwise than it is named).
    redis_prefix: Mutex<Option<String>>,
    /// The stores the status view reads.
    storage: Mutex<Storage>,
}

/// The sinks' queues and the dead letters on disk, as built.
#[derive(Default)]
pub struct Storage {
    /// Each sink's queue, by the sink's name.
    pub queues: Vec<(String, Arc<QueuedSink>)>,
    /// The dead letters on disk, if configured.
    pub dead_letters: Option<Arc<DeadLetterStore>>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field(
                "queues",
                &self.queues.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("dead_letters", &self.dead_letters.as_ref().map(|d| d.dir()))
            .finish()
    }
}

impl Readiness {
    /// Not started, no source.
    pub fn new() -> Self {
        Self::default()
    }

    /// Not started, no source; what it says is told to `notifier` too,
    /// while the replica runs.
    pub fn reporting_to(notifier: Notifier) -> Self {
        Readiness {
            notifier: Some(Arc::new(notifier)),
            ..Self::default()
        }
    }

    /// The service manager told, if any.
    pub fn notifier(&self) -> Option<&Arc<Notifier>> {
        self.notifier.as_ref()
    }

    /// The replica has started (`true`) or is stopping (`false`).
    pub fn set_started(&self, started: bool) {
        self.started.store(started, Ordering::Release);
    }

    /// Counts `link` in: not ready while it is down. A source that
    /// connects at start (`at_start`) is not ready until its first
    /// attempt has answered either; one that connects on a promotion (an
    /// elected source, which a standby never opens) only while it fails.
    /// A link of the same name replaces the one before it (an endpoint
    /// restarted by a reload).
    pub fn watch(&self, link: Link, at_start: bool) {
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        links.retain(|(watched, _)| watched.name() != link.name());
        links.push((link, at_start));
    }

    /// No longer counts the link named `name` (an endpoint a reload
    /// removed).
    pub fn forget(&self, name: &str) {
        self.links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(watched, _)| watched.name() != name);
    }

    /// Records that lease `key` is `unit`'s.
    pub fn lease_of(&self, unit: &str, key: &str) {
        self.owners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.to_owned(), unit.to_owned());
    }

    /// Records that the leases are held in Redis under `prefix`.
    pub fn leases_in_redis(&self, prefix: &str) {
        *self
            .redis_prefix
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(prefix.to_owned());
    }

    /// Lease `key` as the lock service holds it: in Redis, the lock's own
    /// key under the locker's prefix (`<prefix>{<domain>}:<last>`),
    /// elsewhere the key itself.
    pub fn stored_key(&self, key: &str) -> String {
        match &*self
            .redis_prefix
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            Some(prefix) => guard_redis::lock_keys(prefix, key)
                .map_or_else(|_| key.to_owned(), |(lock, _)| lock),
            None => key.to_owned(),
        }
    }

    /// The unit lease `key` is for, if this replica's.
    pub fn owner(&self, key: &str) -> Option<String> {
        self.owners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Shows `storage` in the status view.
    pub fn show(&self, storage: Storage) {
        *self.storage.lock().unwrap_or_else(PoisonError::into_inner) = storage;
    }

    /// Runs `read` on the stores shown.
    pub fn storage<T>(&self, read: impl FnOnce(&Storage) -> T) -> T {
        read(&self.storage.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Every source's link, with whether it connects at start.
    pub fn links(&self) -> Vec<(Link, bool)> {
        self.links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// What `link`'s source is waiting for, if anything: its last
    /// failure, or its first answer when it connects at start.
    pub fn waiting_on(link: &Link, at_start: bool) -> Option<String> {
        match link.failure() {
            Some(failure) => Some(format!("endpoint {}: {failure}", link.name())),
            None if at_start && !link.has_answered() => {
                Some(format!("endpoint {}: connecting", link.name()))
            }
            None => None,
        }
    }

    /// `Ok` when ready; else what the replica waits for, each source that
    /// cannot reach its server named with its last failure.
    pub fn check(&self) -> Result<(), String> {
        if !self.started.load(Ordering::Acquire) {
            return Err("connecting".to_owned());
        }
        let failing: Vec<String> = self
            .links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|(link, at_start)| Self::waiting_on(link, *at_start))
            .collect();
        if failing.is_empty() {
            Ok(())
        } else {
            Err(failing.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_key_is_shown_as_the_lock_service_holds_it() {
        let ready = Readiness::new();
        let key = "guard:active:consumer:owner=acme:name=sensors";
        assert_eq!(ready.stored_key(key), key, "elsewhere than Redis, as named");
        ready.leases_in_redis("prod1");
        assert_eq!(
            ready.stored_key(key),
            "prod1:{guard:active:consumer:owner=acme}:name=sensors"
        );
    }
}

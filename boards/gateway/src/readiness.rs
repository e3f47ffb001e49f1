//! What `/readyz` answers: ready once the replica has started (its
//! locker answered, its tasks running), and while every endpoint's source
//! reaches its server ([`Link`]); otherwise what it waits for. The same
//! is told to a service manager ([`Notifier`]) when one asks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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
    pub fn watch(&self, link: Link, at_start: bool) {
        self.links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((link, at_start));
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
            .filter_map(|(link, at_start)| match link.failure() {
                Some(failure) => Some(format!("endpoint {}: {failure}", link.name())),
                None if *at_start && !link.has_answered() => {
                    Some(format!("endpoint {}: connecting", link.name()))
                }
                None => None,
            })
            .collect();
        if failing.is_empty() {
            Ok(())
        } else {
            Err(failing.join("; "))
        }
    }
}

//! What `/readyz` answers: ready once the replica has started (its
//! locker answered, its tasks running), and while every endpoint's source
//! reaches its server ([`Link`]); otherwise what it waits for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use guard_endpoints::link::Link;

/// A replica's readiness, shared by the replica and the metrics server.
#[derive(Debug, Default)]
pub struct Readiness {
    started: AtomicBool,
    links: Mutex<Vec<Link>>,
}

impl Readiness {
    /// Not started, no source.
    pub fn new() -> Self {
        Self::default()
    }

    /// The replica has started (`true`) or is stopping (`false`).
    pub fn set_started(&self, started: bool) {
        self.started.store(started, Ordering::Release);
    }

    /// Counts `link` in: not ready while it is down.
    pub fn watch(&self, link: Link) {
        self.links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(link);
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
            .filter_map(|link| {
                link.failure()
                    .map(|failure| format!("endpoint {}: {failure}", link.name()))
            })
            .collect();
        if failing.is_empty() {
            Ok(())
        } else {
            Err(failing.join("; "))
        }
    }
}

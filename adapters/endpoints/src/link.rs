//! Whether a source reaches its server: what a replica's readiness is
//! made of, and the one place a source's connection losses are counted
//! and logged.
//!
//! Every source reports each failed connection (a connect refused, a
//! subscription refused, a connection that ended) and each success to its
//! [`Link`]: a failure is counted in `guard_source_disconnects_total{source}`,
//! sets `guard_source_up{source}` to 0 and is logged at most once per
//! interval with the count held back (a broker that is down for an hour
//! is one line a minute, not one a second); the next success sets it back
//! to 1 and is logged, also at most once per interval (a connection that
//! flaps is two lines an interval). A link starts up: a source that has not tried
//! yet (an elected standby, which subscribes only when it leads) is not
//! failing. A source that ends while it should run (a declaration the
//! server refuses for good, a subscription that cannot be made) is
//! [`Link::stopped`]: down for good, whatever its connection does after.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use guard_std::Throttle;

/// Failed connections of a source, by `source`.
pub const SOURCE_DISCONNECTS: &str = "guard_source_disconnects_total";
/// 1 while a source's last connection attempt succeeded (or none was
/// made), 0 while it fails, by `source`.
pub const SOURCE_UP: &str = "guard_source_up";

/// A source's connection state, shared by the source and whoever reports
/// readiness (cheap to clone).
///
/// ```
/// use guard_endpoints::link::Link;
///
/// let link = Link::new("telemetry");
/// assert!(link.is_up(), "nothing has failed yet");
/// ```
#[derive(Clone)]
pub struct Link(Arc<Inner>);

struct Inner {
    name: String,
    /// Whether it is down: read on every message of a source that reports
    /// each one, so no lock is taken while it is up.
    down: AtomicBool,
    /// Whether the source has stopped while it should run: no later
    /// success (a client's own reconnection) sets the link up again.
    stopped: AtomicBool,
    /// Whether any connection attempt has ended, either way: until then
    /// a source that connects at start is not known to reach its server.
    answered: AtomicBool,
    /// The last failure while the link is down.
    failing: Mutex<Option<String>>,
    /// The failures' log lines: one per interval.
    throttle: Throttle,
    /// The recoveries' log lines: one per interval too, so a connection
    /// that flaps is not a line a second either way.
    recoveries: Throttle,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("name", &self.0.name)
            .field("failing", &self.failure())
            .finish()
    }
}

impl Link {
    /// The link of source `name` (the label of its metrics), up, its
    /// metrics published.
    pub fn new(name: &str) -> Self {
        metrics::counter!(SOURCE_DISCONNECTS, "source" => name.to_owned()).increment(0);
        metrics::gauge!(SOURCE_UP, "source" => name.to_owned()).set(1.0);
        Link(Arc::new(Inner {
            name: name.to_owned(),
            down: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            answered: AtomicBool::new(false),
            failing: Mutex::new(None),
            throttle: Throttle::new(),
            recoveries: Throttle::new(),
        }))
    }

    /// The source's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Whether the source's last connection attempt succeeded, or none
    /// has failed.
    pub fn is_up(&self) -> bool {
        !self.0.down.load(Ordering::Acquire)
    }

    /// Whether the source has reported a connection attempt's outcome
    /// (a success or a failure) since it started.
    pub fn has_answered(&self) -> bool {
        self.0.answered.load(Ordering::Acquire)
    }

    fn answer(&self) {
        // Read first: a source reports a success per message, and a
        // store each time would bounce the cache line between cores.
        if !self.0.answered.load(Ordering::Relaxed) {
            self.0.answered.store(true, Ordering::Release);
        }
    }

    /// The last failure while the link is down.
    pub fn failure(&self) -> Option<String> {
        self.0
            .failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A connection (or subscription) is in place.
    pub(crate) fn up(&self) {
        self.answer();
        if self.is_up() {
            return;
        }
        // The flag changes under the lock, as in `down`: the two never
        // interleave into a link down with no failure or up with one.
        let was = {
            let mut failing = self
                .0
                .failing
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // A stopped source stays down (set under this lock).
            if self.0.stopped.load(Ordering::Acquire) {
                return;
            }
            self.0.down.store(false, Ordering::Release);
            failing.take()
        };
        if let Some(failure) = was {
            metrics::gauge!(SOURCE_UP, "source" => self.0.name.clone()).set(1.0);
            if let Some(held) = self.0.recoveries.admit() {
                tracing::info!(
                    "{}: connected again (after: {failure}; {held} more reconnections not logged)",
                    self.0.name
                );
            }
        }
    }

    /// A connection failed or ended with `error`; the source tries again
    /// (`then` says how, for the log).
    pub(crate) fn down(&self, error: &dyn fmt::Display, then: &str) {
        self.answer();
        let error = error.to_string();
        metrics::counter!(SOURCE_DISCONNECTS, "source" => self.0.name.clone()).increment(1);
        metrics::gauge!(SOURCE_UP, "source" => self.0.name.clone()).set(0.0);
        if let Some(held) = self.0.throttle.admit() {
            tracing::warn!(
                "{}: {error}; {then} ({held} more failures not logged)",
                self.0.name
            );
        }
        let mut failing = self
            .0
            .failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *failing = Some(error);
        self.0.down.store(true, Ordering::Release);
    }

    /// The source stopped while it should run, for `why` (which no retry
    /// fixes): the link is down for good, counted once and logged at
    /// error, so a replica whose endpoint ended is not ready.
    pub fn stopped(&self, why: &dyn fmt::Display) {
        self.answer();
        let failure = format!("stopped: {why}");
        metrics::counter!(SOURCE_DISCONNECTS, "source" => self.0.name.clone()).increment(1);
        metrics::gauge!(SOURCE_UP, "source" => self.0.name.clone()).set(0.0);
        tracing::error!("{}: {failure}", self.0.name);
        let mut failing = self
            .0
            .failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *failing = Some(failure);
        self.0.stopped.store(true, Ordering::Release);
        self.0.down.store(true, Ordering::Release);
    }

    /// Whether the source has stopped for good ([`Link::stopped`]).
    pub fn has_stopped(&self) -> bool {
        self.0.stopped.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_down_from_a_failure_to_the_next_success() {
        let link = Link::new("test");
        assert!(link.is_up());
        link.down(&"refused", "trying again");
        link.down(&"refused again", "trying again");
        assert_eq!(link.failure().as_deref(), Some("refused again"));
        let shared = link.clone();
        assert!(!shared.is_up(), "clones share the state");
        link.up();
        assert!(shared.is_up());
    }

    #[test]
    fn a_link_has_answered_after_its_first_outcome_either_way() {
        let (ok, failing) = (Link::new("ok"), Link::new("failing"));
        assert!(!ok.has_answered() && !failing.has_answered());
        ok.up();
        failing.down(&"refused", "trying again");
        assert!(ok.has_answered() && failing.has_answered());
    }

    #[test]
    fn a_flapping_link_logs_one_failure_and_one_recovery_per_interval() {
        let log = guard_testkit::SpanLog::new();
        let link = Link::new("flapping");
        tracing::subscriber::with_default(log.subscriber(), || {
            for _ in 0..100 {
                link.down(&"connection reset", "reconnecting");
                link.up();
            }
        });
        assert!(link.is_up());
        let logged = log.events();
        let of = |level| {
            logged
                .iter()
                .filter(|e| e.level == level && e.message.starts_with("flapping"))
                .count()
        };
        assert_eq!(
            (of(tracing::Level::WARN), of(tracing::Level::INFO)),
            (1, 1),
            "{logged:#?}"
        );
    }

    #[test]
    fn a_stopped_link_stays_down_whatever_succeeds_after() {
        let link = Link::new("test");
        link.stopped(&"queue declaration refused");
        link.up();
        assert!(!link.is_up());
        assert!(link.has_stopped());
        assert_eq!(
            link.failure().as_deref(),
            Some("stopped: queue declaration refused")
        );
    }
}

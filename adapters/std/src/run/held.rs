//! What every [`ActiveRunner`](super::ActiveRunner) of this process
//! competes for, and what it holds: for a read-only status view.
//!
//! A runner is listed from the start of its `run` (standing by) until it
//! returns; [`held`] reads each one's lease as its consumers would check
//! it, on the runner's own clock. Reading never changes a lease.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::Runtime;
use super::lease::LeaseCheck;

/// One lease key this process competes for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLease {
    /// The lease key.
    pub key: String,
    /// The fence, while this process leads (also past the renew
    /// deadline, until the runner demotes).
    pub fence: Option<u64>,
    /// Whether the lease may be acted on now: led and before its renew
    /// deadline.
    pub valid: bool,
    /// How long until the renew deadline (zero once it has passed), while
    /// this process leads: without a successful renewal by then, the
    /// runner demotes.
    pub renew_deadline_in: Option<Duration>,
}

/// Reads one runner's lease.
type Reader = Arc<dyn Fn() -> HeldLease + Send + Sync>;

/// Every runner running in this process, by an id of its listing.
static LISTED: Mutex<Vec<(u64, Reader)>> = Mutex::new(Vec::new());
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Removes its runner from the list when dropped (the run returned or
/// its future was dropped).
pub(crate) struct Listed(u64);

impl Drop for Listed {
    fn drop(&mut self) {
        listed().retain(|(id, _)| *id != self.0);
    }
}

fn listed() -> std::sync::MutexGuard<'static, Vec<(u64, Reader)>> {
    LISTED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Lists the runner of `key` whose lease `check` follows, until the
/// returned value is dropped.
pub(crate) fn list<R: Runtime>(key: &str, check: LeaseCheck<R>) -> Listed {
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let key = key.to_owned();
    let read: Reader = Arc::new(move || {
        // One lease and one clock read: the fields agree.
        let (lease, now) = (check.lease(), check.now());
        HeldLease {
            key: key.clone(),
            fence: lease.map(|l| l.fence()),
            valid: lease.and_then(|l| l.valid_at(now)).is_some(),
            renew_deadline_in: lease.map(|l| l.until().saturating_duration_since(now)),
        }
    });
    listed().push((id, read));
    Listed(id)
}

/// Every lease key this process's runners compete for, in the order they
/// started, with what each holds now.
///
/// ```
/// for lease in guard_std::run::held() {
///     println!("{} leading={} fence={:?}", lease.key, lease.valid, lease.fence);
/// }
/// ```
pub fn held() -> Vec<HeldLease> {
    // Read outside the list's lock: a reader takes its lease's own.
    let readers: Vec<Reader> = listed().iter().map(|(_, r)| r.clone()).collect();
    readers.iter().map(|read| read()).collect()
}

//! An application's shared state built from guard's types, as a user of
//! guard would write it, and (in `tests/loom.rs`) the loom model that
//! checks it under every interleaving of its threads.
//!
//! [`Gateway`] admits requests through a global [`AtomicTokenBucket`] and
//! a per-tenant [`SharedKeyed`] bucket; a request either limit refuses is
//! parked in a [`SharedDeadLetterQueue`] for a later retry, or handed back
//! when that queue is full (nothing is dropped). A maintenance job runs
//! under a [`LocalLocker`] lease, so one thread runs it at a time.
//! Outgoing webhooks go through a named limiter of a
//! [`RateLimiterRegistry`], which counts what it allowed and denied.
//!
//! Under `RUSTFLAGS="--cfg guard_loom"`, every one of these types takes
//! its atomics and locks from loom, and so does the application's own
//! counter (the two `use` lines below), so the application's
//! `loom::model` explores guard's code exactly as written together with
//! its own:
//!
//! ```text
//! RUSTFLAGS="--cfg guard_loom" cargo test --release -p guard-example-loom --test loom
//! ```

#[cfg(guard_loom)]
use loom::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
#[cfg(not(guard_loom))]
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use guard_core::dlq::SharedDeadLetterQueue;
use guard_core::limit::{
    AtomicTokenBucket, FullPolicy, Keyed, LimiterError, Rate, SharedKeyed, TokenBucket,
};
use guard_core::lock::{Token, Ttl};
use guard_core::slot::UnixMillis;
use guard_core::time::Instant;
use guard_std::ratelimit::{MemoryLimiter, RateLimiter, RateLimiterRegistry};
use guard_std::{LocalLocker, ManualClock};

/// What happened to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Admitted now.
    Admitted,
    /// Refused by a limit and parked in the dead-letter queue.
    Parked,
    /// Refused and the queue was full: the caller keeps the request.
    HandedBack(u32),
}

/// The per-tenant table: 8 tenants at most.
type Tenants = SharedKeyed<CriticalSectionRawMutex, u32, TokenBucket, 8>;

/// The shared state of a gateway's worker threads.
pub struct Gateway {
    global: AtomicTokenBucket,
    tenants: Tenants,
    parked: SharedDeadLetterQueue<CriticalSectionRawMutex, u32, &'static str, 2>,
    jobs: LocalLocker,
    /// Limits on outgoing calls by name: here "webhooks", per destination.
    limits: RateLimiterRegistry,
    /// The application's own statistic, shared like guard's types.
    admitted: AtomicU32,
}

impl Gateway {
    /// A gateway admitting a burst of `global` requests in all and of
    /// `per_tenant` for each tenant, refilling once a minute, and one
    /// webhook a minute to each destination.
    pub fn new(global: u32, per_tenant: u32) -> Result<Self, LimiterError> {
        let minute = Rate::per(1, Duration::from_secs(60));
        let tenant = TokenBucket::new(per_tenant, minute)?;
        // A manual clock: the model's time stands still, as `admit`'s does.
        let webhooks: Arc<dyn RateLimiter> = Arc::new(MemoryLimiter::<_, _, 8>::with_clock(
            TokenBucket::new(1, minute)?,
            8,
            FullPolicy::DenyNewKeys,
            ManualClock::new(UnixMillis(0)),
        ));
        Ok(Gateway {
            global: AtomicTokenBucket::new(TokenBucket::new(global, minute)?),
            tenants: SharedKeyed::new(Keyed::new(tenant, FullPolicy::DenyNewKeys)),
            parked: SharedDeadLetterQueue::new(),
            jobs: LocalLocker::new(),
            limits: RateLimiterRegistry::new([("webhooks".to_owned(), webhooks)]),
            admitted: AtomicU32::new(0),
        })
    }

    /// Admits request `id` of `tenant` at `now`: both limits must allow
    /// it; a refused one is parked, or handed back if the queue is full.
    pub fn admit(&self, tenant: u32, id: u32, now: Instant) -> Admission {
        // The tenant's limit first: a request its tenant may not make
        // does not spend a global token.
        let admitted =
            self.tenants.check(&tenant, now).is_allowed() && self.global.check(now).is_allowed();
        if admitted {
            // One read-modify-write: a load and a store would lose a count
            // between two workers (the loom model finds it: checked).
            self.admitted.fetch_add(1, Ordering::Relaxed);
            return Admission::Admitted;
        }
        match self.parked.add(id, Some("rate limited"), 1, now) {
            Ok(()) => Admission::Parked,
            Err(back) => Admission::HandedBack(back.into_element()),
        }
    }

    /// Requests admitted so far.
    pub fn admitted(&self) -> u32 {
        self.admitted.load(Ordering::Relaxed)
    }

    /// The parked requests, oldest first (taking them out).
    pub fn drain_parked(&self) -> Vec<u32> {
        std::iter::from_fn(|| self.parked.poll())
            .map(|failed| failed.into_element())
            .collect()
    }

    /// Whether a webhook to `destination` may be sent now (counted by the
    /// registry's named limiter either way).
    pub fn may_send_webhook(&self, destination: &str) -> bool {
        let Some(webhooks) = self.limits.get("webhooks") else {
            return false;
        };
        // The in-memory limiter decides without waiting.
        futures_lite::future::block_on(webhooks.check(destination))
            .is_ok_and(|decision| decision.is_allowed())
    }

    /// Webhooks allowed and denied so far, as the registry counted them.
    pub fn webhook_counts(&self) -> (u64, u64) {
        self.limits
            .get("webhooks")
            .map_or((0, 0), |named| (named.allowed(), named.denied()))
    }

    /// Takes the maintenance job's lease for `ttl`, if no one holds it.
    pub fn start_job(&self, ttl: Ttl) -> Option<Token> {
        self.jobs.try_lock_now("maintenance", ttl)
    }

    /// Ends the maintenance job.
    pub fn end_job(&self, token: &Token) -> bool {
        self.jobs.unlock_now("maintenance", token).is_ok()
    }
}

#[cfg(all(test, not(guard_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_refused_request_is_parked_then_handed_back_when_the_queue_is_full() {
        let gateway = Gateway::new(10, 1).unwrap();
        let now = Instant::from_millis(0);
        assert_eq!(gateway.admit(7, 1, now), Admission::Admitted);
        assert_eq!(gateway.admit(7, 2, now), Admission::Parked);
        assert_eq!(gateway.admit(7, 3, now), Admission::Parked);
        assert_eq!(gateway.admit(7, 4, now), Admission::HandedBack(4));
        assert_eq!(gateway.drain_parked(), vec![2, 3]);
    }

    #[test]
    fn one_webhook_a_minute_to_each_destination_counted_by_the_registry() {
        let gateway = Gateway::new(1, 1).unwrap();
        assert!(gateway.may_send_webhook("a"));
        assert!(!gateway.may_send_webhook("a"));
        assert!(gateway.may_send_webhook("b"));
        assert_eq!(gateway.webhook_counts(), (2, 1));
    }

    #[test]
    fn one_maintenance_job_at_a_time() {
        let gateway = Gateway::new(1, 1).unwrap();
        let ttl = Ttl::from_secs(60).unwrap();
        let token = gateway.start_job(ttl).unwrap();
        assert!(gateway.start_job(ttl).is_none());
        assert!(gateway.end_job(&token));
        assert!(gateway.start_job(ttl).is_some());
    }
}

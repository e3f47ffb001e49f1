//! Named limiters (counted per name) and the registry of them.

use std::collections::HashMap;
use std::sync::Arc;

use super::{KeysHeld, LimitResult, Quota, RateLimiter, ReconfigureError};
use tracing::Instrument as _;
use tracing::field::Empty;

use crate::metrics::{
    RL_ALLOWED, RL_DECISION_SECONDS, RL_DENIED, RL_KEYS, RL_KEYS_CAPACITY, RL_MAX_BYTES,
};
use crate::observe::timed;
use crate::sync::{AtomicU64, Ordering};

/// A limiter with a name: every decision is counted, in the limiter and
/// in the metrics `guard_rl_allowed_total{name}` /
/// `guard_rl_denied_total{name}`.
pub struct NamedRateLimiter {
    name: String,
    inner: Arc<dyn RateLimiter>,
    /// Whether its keys live on a shared backend (timed decisions).
    shared: bool,
    allowed: AtomicU64,
    denied: AtomicU64,
}

impl std::fmt::Debug for NamedRateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedRateLimiter")
            .field("name", &self.name)
            .field("allowed", &self.allowed())
            .field("denied", &self.denied())
            .finish()
    }
}

impl NamedRateLimiter {
    /// Names `inner`.
    pub fn new(name: impl Into<String>, inner: Arc<dyn RateLimiter>) -> Self {
        NamedRateLimiter {
            name: name.into(),
            shared: inner.keys_held().is_none(),
            inner,
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Decides one request for `key` and counts it.
    pub async fn check(&self, key: &str) -> LimitResult {
        self.check_n(key, 1).await
    }

    /// Decides a request of `cost` units for `key` and counts it (as one
    /// decision).
    ///
    /// In a span `limit` at debug (`name`, `key`, `cost`, `outcome`:
    /// `allowed`, `denied`, `error`); a limiter whose keys live on a
    /// shared backend is timed in `guard_rl_decision_seconds{name,
    /// outcome}` ([`crate::observe`]).
    pub async fn check_n(&self, key: &str, cost: u32) -> LimitResult {
        let span = tracing::debug_span!("limit", name = %self.name, key, cost, outcome = Empty);
        let decided = if self.shared {
            let (decided, seconds) = timed(&span, self.inner.check_n(key, cost)).await;
            metrics::histogram!(RL_DECISION_SECONDS, "name" => self.name.clone(), "outcome" => outcome_of(&decided))
                .record(seconds);
            decided
        } else {
            self.inner.check_n(key, cost).instrument(span.clone()).await
        };
        span.record("outcome", outcome_of(&decided));
        let decision = decided?;
        let (counter, metric) = if decision.is_allowed() {
            (&self.allowed, RL_ALLOWED)
        } else {
            (&self.denied, RL_DENIED)
        };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(metric, "name" => self.name.clone()).increment(1);
        Ok(decision)
    }

    /// The parameters every key is limited by now.
    pub fn quota(&self) -> Quota {
        self.inner.quota()
    }

    /// Replaces the parameters while the limiter serves, keeping every
    /// key; see [`RateLimiter::reconfigure`]. Logged.
    pub fn reconfigure(&self, quota: Quota) -> Result<(), ReconfigureError> {
        let before = self.inner.quota();
        self.inner.reconfigure(quota)?;
        tracing::info!(
            "rate limiter {}: quota {before:?} replaced by {quota:?}",
            self.name
        );
        Ok(())
    }

    /// The keys an in-process limiter holds; records them in
    /// `guard_rl_keys{name}`, `guard_rl_keys_capacity{name}` and
    /// `guard_rl_max_bytes{name}` too, so an exporter shows that the table
    /// stays within its bounds.
    pub fn keys_held(&self) -> Option<KeysHeld> {
        let held = self.inner.keys_held()?;
        metrics::gauge!(RL_KEYS, "name" => self.name.clone()).set(held.held as f64);
        metrics::gauge!(RL_KEYS_CAPACITY, "name" => self.name.clone()).set(held.capacity as f64);
        metrics::gauge!(RL_MAX_BYTES, "name" => self.name.clone()).set(held.max_bytes as f64);
        Some(held)
    }

    /// Requests admitted so far.
    pub fn allowed(&self) -> u64 {
        self.allowed.load(Ordering::Relaxed)
    }

    /// Requests refused so far.
    pub fn denied(&self) -> u64 {
        self.denied.load(Ordering::Relaxed)
    }
}

/// A decision's `outcome` label.
fn outcome_of(decided: &LimitResult) -> &'static str {
    match decided {
        Ok(decision) if decision.is_allowed() => "allowed",
        Ok(_) => "denied",
        Err(_) => "error",
    }
}

/// A fixed set of named limiters: built once, never changed (later
/// changes to the map it was built from have no effect).
#[derive(Clone, Debug, Default)]
pub struct RateLimiterRegistry {
    limiters: HashMap<String, Arc<NamedRateLimiter>>,
}

impl RateLimiterRegistry {
    /// Names and registers every limiter of `limiters`.
    pub fn new(limiters: impl IntoIterator<Item = (String, Arc<dyn RateLimiter>)>) -> Self {
        RateLimiterRegistry {
            limiters: limiters
                .into_iter()
                .map(|(name, limiter)| {
                    (name.clone(), Arc::new(NamedRateLimiter::new(name, limiter)))
                })
                .collect(),
        }
    }

    /// The limiter called `name`, if any.
    pub fn get(&self, name: &str) -> Option<&Arc<NamedRateLimiter>> {
        self.limiters.get(name)
    }

    /// Every limiter, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<NamedRateLimiter>> {
        self.limiters.values()
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.limiters.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// How many limiters are registered.
    pub fn len(&self) -> usize {
        self.limiters.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.limiters.is_empty()
    }
}

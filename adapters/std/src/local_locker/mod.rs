//! An in-process locker with fencing, and a claim store and a semaphore
//! beside it.

mod claims;
mod semaphore;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::PoisonError;
use std::time::Duration;

use guard_core::lock::{Renewal, SendLeaseRenewer, SendLocker, Token, TokenId, Ttl, UnlockError};
use guard_core::time::Instant;

use crate::clock::{Clock, SystemClock};
use crate::sync::{Mutex, MutexGuard};
use crate::token_ids::TokenIds;

/// How often expired keys are swept (the original's one minute).
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Held {
    id: TokenId,
    expires_at: Instant,
}

#[derive(Debug)]
struct State {
    held: HashMap<String, Held>,
    last_sweep: Option<Instant>,
    /// Claim records (see `claims`), swept with the locks.
    claims: HashMap<String, claims::Record>,
    /// Semaphores' permits (see `semaphore`), swept with the locks.
    permits: HashMap<String, Vec<semaphore::Permit>>,
    /// The last fence granted, to a lock or a claim attempt. One counter
    /// for every key: it strictly increases per key too, and survives the
    /// sweep of expired keys.
    last_fence: u64,
}

impl State {
    /// Forgets expired locks and claim records at most once per
    /// `interval`, so unique keys (schedule slots, message ids) do not
    /// accumulate.
    fn sweep(&mut self, now: Instant, interval: Duration) {
        let due = self
            .last_sweep
            .is_none_or(|last| now.saturating_duration_since(last) >= interval);
        if due {
            self.held.retain(|_, h| now < h.expires_at);
            self.claims.retain(|_, r| !r.forgotten(now));
            self.permits.retain(|_, held| {
                held.retain(|p| p.live(now));
                !held.is_empty()
            });
            self.last_sweep = Some(now);
        }
    }

    fn next_fence(&mut self) -> u64 {
        self.last_fence = self.last_fence.saturating_add(1);
        self.last_fence
    }
}

/// A [`Locker`](guard_core::lock::Locker) and lease renewer inside one
/// process: for a single replica, for tests, and as the reference the
/// other backends are compared with.
///
/// - A key is held until its TTL passes (at exactly `expires_at` it is free
///   again) or its token unlocks it.
/// - Every grant carries a fence greater than all earlier grants.
/// - Expired keys are swept lazily, at most once per sweep interval, on
///   an acquisition, so unique keys (schedule slots) do not accumulate.
/// - Safe to share between threads and tasks; its futures never wait.
///
/// It is also a [`ClaimStore`](guard_core::claim::ClaimStore) and a
/// [`Semaphore`](guard_core::semaphore::Semaphore) (records and permits
/// beside the locks, on the same clock and fence counter, swept with
/// them), the reference the other claim stores and semaphores are
/// compared with.
///
/// It never fails: its error type is [`Infallible`].
#[derive(Debug)]
pub struct LocalLocker<C: Clock = SystemClock> {
    state: Mutex<State>,
    ids: TokenIds,
    clock: C,
    sweep_interval: Duration,
}

impl LocalLocker<SystemClock> {
    /// A locker on the system clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock::new())
    }
}

impl Default for LocalLocker<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> LocalLocker<C> {
    /// A locker on `clock`.
    pub fn with_clock(clock: C) -> Self {
        LocalLocker {
            ids: TokenIds::new(),
            state: Mutex::new(State {
                held: HashMap::new(),
                claims: HashMap::new(),
                permits: HashMap::new(),
                last_sweep: None,
                last_fence: 0,
            }),
            clock,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
        }
    }

    /// Sweeps expired keys at most once per `interval`.
    pub fn with_sweep_interval(mut self, interval: Duration) -> Self {
        self.sweep_interval = interval;
        self
    }

    /// Keys currently stored (held or expired but not yet swept), claim
    /// records and semaphores included.
    pub fn stored_keys(&self) -> usize {
        let state = self.lock_state();
        state
            .held
            .len()
            .saturating_add(state.claims.len())
            .saturating_add(state.permits.len())
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        // No code path panics while holding the lock; if one ever did, the
        // map is still consistent (each update is one insert or remove).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The synchronous core of `try_lock`.
    pub fn try_lock_now(&self, key: &str, ttl: Ttl) -> Option<Token> {
        let now = self.clock.now();
        let mut state = self.lock_state();
        state.sweep(now, self.sweep_interval);
        if state.held.get(key).is_some_and(|h| now < h.expires_at) {
            return None;
        }
        let fence = state.next_fence();
        let id = self.ids.next_id();
        let expires_at = now.saturating_add(ttl.as_duration());
        state.held.insert(key.to_owned(), Held { id, expires_at });
        Some(Token::new(id, fence))
    }

    /// The synchronous core of `unlock`.
    pub fn unlock_now(&self, key: &str, token: &Token) -> Result<(), UnlockError<Infallible>> {
        let mut state = self.lock_state();
        match state.held.get(key) {
            Some(h) if h.id == *token.id() => {
                state.held.remove(key);
                Ok(())
            }
            _ => Err(UnlockError::NotHeld),
        }
    }

    /// The synchronous core of `renew`.
    pub fn renew_now(&self, key: &str, token: &Token, ttl: Ttl) -> Renewal {
        let now = self.clock.now();
        let mut state = self.lock_state();
        match state.held.get_mut(key) {
            Some(h) if h.id == *token.id() && now < h.expires_at => {
                h.expires_at = now.saturating_add(ttl.as_duration());
                Renewal::Held
            }
            _ => Renewal::Lost,
        }
    }
}

impl<C: Clock> SendLocker for LocalLocker<C> {
    type Error = Infallible;

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, Infallible> {
        Ok(self.try_lock_now(key, ttl))
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<Infallible>> {
        self.unlock_now(key, token)
    }
}

impl<C: Clock> SendLeaseRenewer for LocalLocker<C> {
    async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, Infallible> {
        Ok(self.renew_now(key, token, ttl))
    }
}

crate::impl_dyn_locker!([C: Clock + 'static] LocalLocker<C>);

/// The last fence granted to any key (one counter for every key): never
/// below a key's own last one.
impl<C: Clock + Sync> crate::LastFence for LocalLocker<C> {
    type Error = std::convert::Infallible;

    async fn last_fence(&self, _key: &str) -> Result<Option<u64>, Self::Error> {
        let last = self.lock_state().last_fence;
        Ok((last > 0).then_some(last))
    }
}

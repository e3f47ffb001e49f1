//! `LocalLocker` as a [`Semaphore`]: permits in the locker's table, on
//! its clock, fences from its one counter.

use std::convert::Infallible;

use guard_core::lock::{Renewal, Token, TokenId, Ttl, UnlockError};
use guard_core::semaphore::{Permits, SendSemaphore};
use guard_core::time::Instant;

use super::LocalLocker;
use crate::clock::Clock;

/// One live (or not yet swept) permit: its token id and the end of its
/// lease (exclusive, as a lock's).
#[derive(Debug)]
pub(super) struct Permit {
    id: TokenId,
    until: Instant,
}

impl Permit {
    pub(super) fn live(&self, now: Instant) -> bool {
        now < self.until
    }
}

impl<C: Clock> LocalLocker<C> {
    /// The synchronous core of `try_acquire`.
    pub fn try_acquire_now(&self, key: &str, permits: Permits, lease: Ttl) -> Option<Token> {
        let now = self.clock.now();
        let mut state = self.lock_state();
        state.sweep(now, self.sweep_interval);
        let held = state.permits.entry(key.to_owned()).or_default();
        // Ended permits count no more: forget them now, whatever the sweep.
        held.retain(|p| p.live(now));
        if held.len() >= permits.get() as usize {
            return None;
        }
        let id = self.ids.next_id();
        held.push(Permit {
            id,
            until: now.saturating_add(lease.as_duration()),
        });
        Some(Token::new(id, state.next_fence()))
    }

    /// The synchronous core of `renew` of a permit.
    pub fn renew_permit_now(&self, key: &str, token: &Token, lease: Ttl) -> Renewal {
        let now = self.clock.now();
        let mut state = self.lock_state();
        let permit = state
            .permits
            .get_mut(key)
            .and_then(|held| held.iter_mut().find(|p| p.id == *token.id() && p.live(now)));
        match permit {
            Some(permit) => {
                permit.until = now.saturating_add(lease.as_duration());
                Renewal::Held
            }
            None => Renewal::Lost,
        }
    }

    /// The synchronous core of `release` of a permit.
    pub fn release_permit_now(
        &self,
        key: &str,
        token: &Token,
    ) -> Result<(), UnlockError<Infallible>> {
        let now = self.clock.now();
        let mut state = self.lock_state();
        let Some(held) = state.permits.get_mut(key) else {
            return Err(UnlockError::NotHeld);
        };
        let Some(at) = held.iter().position(|p| p.id == *token.id() && p.live(now)) else {
            return Err(UnlockError::NotHeld);
        };
        held.swap_remove(at);
        if held.is_empty() {
            state.permits.remove(key);
        }
        Ok(())
    }

    /// The synchronous core of `holders`.
    pub fn holders_now(&self, key: &str) -> u32 {
        let now = self.clock.now();
        let state = self.lock_state();
        let live = state
            .permits
            .get(key)
            .map_or(0, |held| held.iter().filter(|p| p.live(now)).count());
        u32::try_from(live).unwrap_or(u32::MAX)
    }
}

/// Permits beside the locks and claims, on the same clock and fence
/// counter, swept with them: the reference the other semaphores are
/// compared with.
impl<C: Clock> SendSemaphore for LocalLocker<C> {
    type Error = Infallible;

    async fn try_acquire(
        &self,
        key: &str,
        permits: Permits,
        lease: Ttl,
    ) -> Result<Option<Token>, Infallible> {
        Ok(self.try_acquire_now(key, permits, lease))
    }

    async fn renew(&self, key: &str, token: &Token, lease: Ttl) -> Result<Renewal, Infallible> {
        Ok(self.renew_permit_now(key, token, lease))
    }

    async fn release(&self, key: &str, token: &Token) -> Result<(), UnlockError<Infallible>> {
        self.release_permit_now(key, token)
    }

    async fn holders(&self, key: &str) -> Result<u32, Infallible> {
        Ok(self.holders_now(key))
    }
}

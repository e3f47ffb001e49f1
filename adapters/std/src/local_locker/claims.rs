//! `LocalLocker` as a [`ClaimStore`]: claim records in the locker's
//! table, on its clock, fences from its one counter.

use std::convert::Infallible;

use guard_core::claim::{Begin, SendClaimStore, Settled, Start};
use guard_core::lock::{Renewal, Token, TokenId, Ttl};
use guard_core::time::Instant;

use super::LocalLocker;
use crate::clock::Clock;

/// Where a record is in its life.
#[derive(Debug)]
enum Phase {
    /// An attempt's lease runs until `until` (exclusive, as a lock's).
    Running {
        until: Instant,
    },
    Failed,
    Done {
        result: Vec<u8>,
    },
}

/// One delivery's record.
#[derive(Debug)]
pub(super) struct Record {
    phase: Phase,
    id: TokenId,
    attempt: u32,
    /// Forgotten from this instant on: `keep` after the last write, and
    /// never before a running lease ends.
    forget_at: Instant,
}

impl Record {
    pub(super) fn forgotten(&self, now: Instant) -> bool {
        now >= self.forget_at
    }

    /// The running attempt of `token`, if it holds the record.
    fn held_by(&self, token: &Token) -> bool {
        matches!(self.phase, Phase::Running { .. }) && self.id == *token.id()
    }
}

impl<C: Clock> LocalLocker<C> {
    /// The synchronous core of `try_begin`.
    pub fn try_begin_now(&self, key: &str, lease: Ttl, keep: Ttl, result: &mut [u8]) -> Begin {
        let now = self.clock.now();
        let mut state = self.lock_state();
        state.sweep(now, self.sweep_interval);
        let (after, last_attempt) = match state.claims.get(key).filter(|r| !r.forgotten(now)) {
            None => (Start::Fresh, 0),
            Some(record) => match &record.phase {
                Phase::Done { result: stored } => return Begin::done_with(stored, result),
                Phase::Running { until } if now < *until => {
                    return Begin::Running {
                        lease_left: until.saturating_duration_since(now),
                    };
                }
                Phase::Running { .. } => (Start::AfterExpiry, record.attempt),
                Phase::Failed => (Start::AfterFailure, record.attempt),
            },
        };
        let fence = state.next_fence();
        let id = self.ids.next_id();
        let attempt = last_attempt.saturating_add(1);
        let lease = lease.as_duration();
        state.claims.insert(
            key.to_owned(),
            Record {
                phase: Phase::Running {
                    until: now.saturating_add(lease),
                },
                id,
                attempt,
                forget_at: now.saturating_add(lease.max(keep.as_duration())),
            },
        );
        Begin::Started {
            token: Token::new(id, fence),
            attempt,
            after,
        }
    }

    /// The synchronous core of `extend`.
    pub fn extend_now(&self, key: &str, token: &Token, lease: Ttl) -> Renewal {
        let now = self.clock.now();
        let mut state = self.lock_state();
        let Some(record) = state.claims.get_mut(key) else {
            return Renewal::Lost;
        };
        match record.phase {
            Phase::Running { ref mut until } if record.id == *token.id() && now < *until => {
                *until = now.saturating_add(lease.as_duration());
                record.forget_at = record.forget_at.max(*until);
                Renewal::Held
            }
            _ => Renewal::Lost,
        }
    }

    /// The synchronous core of `complete` (`Some(result)`) and `fail`
    /// (`None`).
    pub fn settle_now(
        &self,
        key: &str,
        token: &Token,
        keep: Ttl,
        result: Option<&[u8]>,
    ) -> Settled {
        let now = self.clock.now();
        let mut state = self.lock_state();
        match state.claims.get_mut(key) {
            Some(record) if !record.forgotten(now) && record.held_by(token) => {
                record.phase = match result {
                    Some(result) => Phase::Done {
                        result: result.to_vec(),
                    },
                    None => Phase::Failed,
                };
                record.forget_at = now.saturating_add(keep.as_duration());
                Settled::Recorded
            }
            _ => Settled::Superseded,
        }
    }
}

impl<C: Clock> SendClaimStore for LocalLocker<C> {
    type Error = Infallible;

    async fn try_begin(
        &self,
        key: &str,
        lease: Ttl,
        keep: Ttl,
        result: &mut [u8],
    ) -> Result<Begin, Infallible> {
        Ok(self.try_begin_now(key, lease, keep, result))
    }

    async fn extend(&self, key: &str, token: &Token, lease: Ttl) -> Result<Renewal, Infallible> {
        Ok(self.extend_now(key, token, lease))
    }

    async fn complete(
        &self,
        key: &str,
        token: &Token,
        keep: Ttl,
        result: &[u8],
    ) -> Result<Settled, Infallible> {
        Ok(self.settle_now(key, token, keep, Some(result)))
    }

    async fn fail(&self, key: &str, token: &Token, keep: Ttl) -> Result<Settled, Infallible> {
        Ok(self.settle_now(key, token, keep, None))
    }
}

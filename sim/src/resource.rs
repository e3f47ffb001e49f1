//! The protected resource: it records every side effect with its fence
//! and, when fencing is on, rejects those older than the newest it saw.
//!
//! Each effect also carries the number of the lease grant its writer leads
//! under (the order in which the lock service granted the leader key), which
//! a real resource does not see but lets the simulator check the fences
//! themselves: one fence per grant, and fences in grant order.

use std::collections::HashMap;

use crate::clock::Nanos;

/// What became of one side effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Applied; its fence was the newest seen (or fencing is off and it was).
    Accepted,
    /// Applied although a newer fence had been seen: fencing is off and a
    /// stale leader wrote.
    AcceptedStale,
    /// Refused: a newer fence had been seen.
    RejectedStale,
}

/// One recorded side effect, for the timeline.
#[derive(Clone, Copy, Debug)]
pub struct Effect {
    /// When it reached the resource (true time).
    pub at: Nanos,
    /// Who sent it.
    pub replica: usize,
    /// Its fence.
    pub fence: u64,
    /// What the resource did.
    pub verdict: Verdict,
}

/// The resource every leader writes to, and the ledger of slot runs.
#[derive(Debug)]
pub struct Resource {
    fencing: bool,
    newest_fence: u64,
    /// The grant of the newest fence's first writer.
    newest_grant: Option<u64>,
    /// The grant that first wrote with each fence: a second grant writing
    /// with one fence means the lock service handed that fence out twice.
    writers: HashMap<u64, u64>,
    /// Side effects, in arrival order (capped for the timeline).
    pub effects: Vec<Effect>,
    /// Counts by verdict.
    pub accepted: u64,
    /// Stale effects applied (fencing off).
    pub accepted_stale: u64,
    /// Stale effects refused (fencing on).
    pub rejected_stale: u64,
    /// Effects by a second grant under an already used fence.
    pub fence_reused: u64,
    /// Effects whose fence is out of grant order against the newest
    /// accepted: a newer grant's fence below it, or an older grant's above
    /// it (the lock service's fences went backwards).
    pub fence_out_of_order: u64,
    /// Runs per scheduled slot (Unix ms of the slot).
    pub slot_runs: HashMap<u64, u32>,
    /// A user handler's effects accepted, by identity (how many times).
    pub user_seen: HashMap<u64, u32>,
    /// A user handler's leader effects refused as stale (fencing on).
    pub user_rejected_stale: u64,
    /// A user handler's stale leader effects applied (fencing off).
    pub user_accepted_stale: u64,
    /// The first identities accepted twice, in the order seen.
    pub user_duplicate_ids: Vec<u64>,
}

/// The most duplicate identities listed; the count goes on beyond it.
const DUPLICATES_LISTED: usize = 20;

/// The most side effects kept for the timeline; counts go on beyond it.
const EFFECTS_KEPT: usize = 20_000;

impl Resource {
    /// A resource that enforces fences when `fencing` is true.
    pub fn new(fencing: bool) -> Self {
        Resource {
            fencing,
            newest_fence: 0,
            newest_grant: None,
            writers: HashMap::new(),
            effects: Vec::new(),
            accepted: 0,
            accepted_stale: 0,
            rejected_stale: 0,
            fence_reused: 0,
            fence_out_of_order: 0,
            slot_runs: HashMap::new(),
            user_seen: HashMap::new(),
            user_rejected_stale: 0,
            user_accepted_stale: 0,
            user_duplicate_ids: Vec::new(),
        }
    }

    /// A side effect of `replica`, leading under lease grant number `grant`
    /// with `fence`, arrives.
    pub fn write(&mut self, at: Nanos, replica: usize, fence: u64, grant: u64) -> Verdict {
        let verdict = self.judge(fence, grant);
        match verdict {
            Verdict::Accepted => self.accepted += 1,
            Verdict::AcceptedStale => self.accepted_stale += 1,
            Verdict::RejectedStale => self.rejected_stale += 1,
        }
        if self.effects.len() < EFFECTS_KEPT {
            self.effects.push(Effect {
                at,
                replica,
                fence,
                verdict,
            });
        }
        verdict
    }

    /// The fence check every leader's side effect passes: refused (or,
    /// with fencing off, applied and counted) below the newest fence;
    /// the fence bookkeeping that finds a lock service handing out a fence
    /// twice or out of order.
    fn judge(&mut self, fence: u64, grant: u64) -> Verdict {
        // One fence, one grant: the invariant a fence derivation must keep.
        let first = *self.writers.entry(fence).or_insert(grant);
        if first != grant {
            self.fence_reused += 1;
        }
        // Fences in grant order: a stale leader's fence is lower *and* its
        // grant older; anything else means the fences went backwards.
        if let Some(newest) = self.newest_grant
            && fence != self.newest_fence
            && (fence < self.newest_fence) != (grant < newest)
        {
            self.fence_out_of_order += 1;
        }
        if fence < self.newest_fence {
            if self.fencing {
                Verdict::RejectedStale
            } else {
                Verdict::AcceptedStale
            }
        } else {
            if fence > self.newest_fence || self.newest_grant.is_none() {
                self.newest_fence = fence;
                self.newest_grant = Some(grant);
            }
            Verdict::Accepted
        }
    }

    /// A user handler's side effect arrives: a leader's (with its fence
    /// and grant, judged as [`Resource::write`] judges) or a slot's
    /// (`None`: applied as it comes). An identity applied before counts
    /// as a duplicate.
    pub fn user_effect(&mut self, leader: Option<(u64, u64)>, identity: u64) -> Verdict {
        let verdict = match leader {
            Some((fence, grant)) => self.judge(fence, grant),
            None => Verdict::Accepted,
        };
        match verdict {
            Verdict::RejectedStale => {
                self.user_rejected_stale += 1;
                return verdict;
            }
            Verdict::AcceptedStale => self.user_accepted_stale += 1,
            Verdict::Accepted => {}
        }
        let seen = self.user_seen.entry(identity).or_insert(0);
        *seen += 1;
        if *seen > 1 && self.user_duplicate_ids.len() < DUPLICATES_LISTED {
            self.user_duplicate_ids.push(identity);
        }
        verdict
    }

    /// A user handler's effects applied, and those applied more than once.
    pub fn user_counts(&self) -> (u64, u64) {
        let applied = self.user_seen.values().map(|&n| u64::from(n)).sum();
        let duplicates = self
            .user_seen
            .values()
            .map(|&n| u64::from(n.saturating_sub(1)))
            .sum();
        (applied, duplicates)
    }

    /// A scheduled slot ran.
    pub fn run_slot(&mut self, slot_ms: u64) {
        *self.slot_runs.entry(slot_ms).or_insert(0) += 1;
    }

    /// Slots run more than once.
    pub fn duplicate_runs(&self) -> u64 {
        self.slot_runs
            .values()
            .map(|&n| u64::from(n.saturating_sub(1)))
            .sum()
    }
}

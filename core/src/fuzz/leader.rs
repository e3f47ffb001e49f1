//! A leader's handler under an `ActiveGuard`, against a simulated lock
//! service, along fuzzer-chosen steps.

use core::time::Duration;

use super::Violation;
use crate::guard::{
    Action, ActiveConfig, ActiveConfigError, ActiveGuard, ActiveTiming, DemoteReason, Done,
};
use crate::lock::{Renewal, Token, TokenId};
use crate::time::Instant;

/// One thing that happens in a [`LeaderHarness`] run. Drawn with weights
/// (mostly time, answers and work; a stop is rare, since nothing happens
/// after it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaderStep {
    /// Time passes by this many 32nds of the lease's TTL (up to about
    /// eight TTLs: a scale that fits every timing); the guard's timer
    /// fires if it is due.
    Wait(u8),
    /// The locker call in flight reaches the lock service and is answered
    /// as the service decides now (a late arrival: the worst case for the
    /// renew deadline).
    Answer,
    /// The locker call in flight fails (an error reply or a time-out).
    Fail,
    /// A rival replica asks the lock service for the lease, and writes to
    /// the resource with its fence if it gets it.
    Rival,
    /// The rival releases the lease, if it holds it.
    RivalReleases,
    /// The lock service fails over and forgets the lease (asynchronous
    /// replication's limit: the guard may act on until its renew deadline,
    /// and the resource's fence check is what keeps that harmless).
    ServiceForgets,
    /// Your handler is offered a unit of work; it gets it only while the
    /// guard's lease is valid, as a runtime checks it before each call.
    Work,
    /// Your code asks the guard to step down.
    Demote,
    /// The replica stops.
    Stop,
}

impl<'a> arbitrary::Arbitrary<'a> for LeaderStep {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u.int_in_range(0..=99u8)? {
            0..=29 => LeaderStep::Wait(u.arbitrary()?),
            30..=54 => LeaderStep::Answer,
            55..=74 => LeaderStep::Work,
            75..=81 => LeaderStep::Fail,
            82..=87 => LeaderStep::Rival,
            88..=91 => LeaderStep::RivalReleases,
            92..=94 => LeaderStep::ServiceForgets,
            95..=98 => LeaderStep::Demote,
            _ => LeaderStep::Stop,
        })
    }
}

/// A unit of work handed to a [`LeaderHandler`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    /// The lease's fence: send it with every side effect. It is the
    /// promotion's fence, or, with a locker that cannot renew (which
    /// acquires again each interval), a higher one.
    pub fence: u64,
    /// The harness's clock.
    pub now: Instant,
    /// The renew deadline the guard acts until.
    pub until: Instant,
}

/// Your code, as an elected consumer runs it.
pub trait LeaderHandler {
    /// The guard made this replica the leader with `fence`.
    fn promoted(&mut self, fence: u64);

    /// The guard stopped this replica leading.
    fn demoted(&mut self, reason: DemoteReason);

    /// A unit of work while leading; returns whether it made a side effect
    /// (sent to the harness's fenced resource with `work.fence`).
    fn work(&mut self, work: Work) -> bool;
}

/// What a [`LeaderHarness`] run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaderReport {
    /// Promotions of the replica.
    pub promotions: u32,
    /// Work handed to the handler.
    pub work: u32,
    /// Side effects the resource accepted.
    pub accepted: u32,
    /// Side effects the resource refused for a fence below one it had
    /// accepted (after a failover forgot the lease and the rival took it).
    pub refused_stale: u32,
}

/// Who holds the lease at the simulated lock service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holder {
    Us(TokenId),
    Rival,
}

/// The lock service: one lease with its expiry on the harness's clock (no
/// drift between the two), and a fence counter that survives failovers
/// (fences derived as `guard_core::lock::redis` derives them).
#[derive(Debug)]
struct Service {
    holder: Option<(Holder, Instant)>,
    fence: u64,
    /// The service forgot our lease since it last granted it to us: the
    /// guard may still act until its deadline (the documented limit).
    forgot: bool,
    grants: u8,
    /// Leases last their TTL divided by this: 1, except where the
    /// harness's own tests break the service to show a broken promise is
    /// caught.
    shrink: u32,
}

impl Service {
    fn live(&self, now: Instant) -> Option<Holder> {
        self.holder
            .filter(|(_, expires)| *expires > now)
            .map(|(who, _)| who)
    }

    fn grant(&mut self, who: Holder, now: Instant, ttl: Duration) -> Option<u64> {
        if self.live(now).is_some() {
            return None;
        }
        self.fence = self.fence.saturating_add(1);
        self.holder = Some((who, self.expiry(now, ttl)));
        Some(self.fence)
    }

    /// When a lease granted or renewed at `now` for `ttl` expires.
    fn expiry(&self, now: Instant, ttl: Duration) -> Instant {
        now.saturating_add(ttl.checked_div(self.shrink).unwrap_or(ttl))
    }
}

/// Runs one replica's [`ActiveGuard`] and your [`LeaderHandler`] against a
/// simulated lock service and a fenced resource; see [`super`].
#[derive(Debug)]
pub struct LeaderHarness {
    guard: ActiveGuard,
    timing: ActiveTiming,
    renewable: bool,
    now: Instant,
    service: Service,
    /// The one locker call in flight (the guard sends one at a time).
    in_flight: Option<Action>,
    promoted: Option<u64>,
    highest_promoted: u64,
    /// The highest fence the resource accepted.
    resource: u64,
    report: LeaderReport,
}

impl LeaderHarness {
    /// A standby with `config`'s timing (an error if it cannot work);
    /// `renewable`: whether the simulated locker renews in place.
    pub fn new(config: ActiveConfig, renewable: bool) -> Result<Self, ActiveConfigError> {
        let timing = config.validate()?;
        let now = Instant::from_secs(1_000);
        let Ok(guard) = ActiveGuard::new(timing, renewable, now);
        Ok(LeaderHarness {
            guard,
            timing,
            renewable,
            now,
            service: Service {
                holder: None,
                fence: 0,
                forgot: false,
                grants: 0,
                shrink: 1,
            },
            in_flight: None,
            promoted: None,
            highest_promoted: 0,
            resource: 0,
            report: LeaderReport::default(),
        })
    }

    /// Runs `steps`, checking guard's promises to `handler` after each:
    /// work only between `Promote` and `Demote`, only while the lock
    /// service holds the lease for it (with a renewing locker, unless a
    /// failover forgot the lease), fences above every earlier
    /// promotion's, callbacks paired.
    pub fn run(
        mut self,
        steps: &[LeaderStep],
        handler: &mut impl LeaderHandler,
    ) -> Result<LeaderReport, Violation> {
        self.guard.handle_timeout(self.now);
        self.drain(0, handler)?;
        for (i, step) in steps.iter().enumerate() {
            self.step(i, *step, handler)?;
        }
        Ok(self.report)
    }

    fn step(
        &mut self,
        i: usize,
        step: LeaderStep,
        handler: &mut impl LeaderHandler,
    ) -> Result<(), Violation> {
        let now = self.now;
        let ttl = self.timing.ttl().as_duration();
        match step {
            LeaderStep::Wait(n) => {
                // Division by a constant: cannot fail.
                let wait = ttl
                    .saturating_mul(u32::from(n))
                    .checked_div(32)
                    .unwrap_or_default();
                self.now = now.saturating_add(wait);
                if self.guard.poll_timeout().is_some_and(|due| due <= self.now) {
                    self.guard.handle_timeout(self.now);
                }
            }
            LeaderStep::Answer => {
                if let Some(action) = self.in_flight.take() {
                    let done = self.answer(action, now, ttl);
                    self.guard.handle(now, done);
                }
            }
            LeaderStep::Fail => {
                if let Some(action) = self.in_flight.take() {
                    let done = match action {
                        Action::Acquire => Done::acquired(Err::<Option<Token>, ()>(())),
                        Action::Renew(_) => Done::renewed(Err::<Renewal, ()>(())),
                        _ => Done::Released(false),
                    };
                    self.guard.handle(now, done);
                }
            }
            LeaderStep::Rival => {
                if let Some(fence) = self.service.grant(Holder::Rival, now, ttl) {
                    // The rival acts at once with its fence.
                    self.resource = self.resource.max(fence);
                }
            }
            LeaderStep::RivalReleases => {
                if self.service.live(now) == Some(Holder::Rival) {
                    self.service.holder = None;
                }
            }
            LeaderStep::ServiceForgets => {
                self.service.holder = None;
                self.service.forgot = true;
            }
            LeaderStep::Work => self.offer_work(i, handler)?,
            LeaderStep::Demote => self.guard.demote(now),
            LeaderStep::Stop => self.guard.stop(now),
        }
        self.drain(i, handler)
    }

    /// The lock service's answer to `action` at `now`.
    fn answer(&mut self, action: Action, now: Instant, ttl: Duration) -> Done {
        match action {
            Action::Acquire => {
                let id = TokenId([self.service.grants; 16]);
                let granted = self.service.grant(Holder::Us(id), now, ttl);
                if granted.is_some() {
                    self.service.grants = self.service.grants.wrapping_add(1);
                    self.service.forgot = false;
                }
                Done::acquired(Ok::<_, ()>(granted.map(|fence| Token::new(id, fence))))
            }
            Action::Renew(token) => {
                let held = self.service.live(now) == Some(Holder::Us(*token.id()));
                if held {
                    let expires = self.service.expiry(now, ttl);
                    self.service.holder = Some((Holder::Us(*token.id()), expires));
                }
                let renewal = if held { Renewal::Held } else { Renewal::Lost };
                Done::renewed(Ok::<_, ()>(renewal))
            }
            Action::Release(token) => {
                if self.service.live(now) == Some(Holder::Us(*token.id())) {
                    self.service.holder = None;
                }
                Done::Released(true)
            }
            // Not locker calls: never in flight.
            Action::Promote { .. } | Action::Demote(_) => Done::Released(false),
        }
    }

    fn offer_work(&mut self, i: usize, handler: &mut impl LeaderHandler) -> Result<(), Violation> {
        let now = self.now;
        // As a runtime checks the published lease before each call.
        let Some(lease) = self.guard.lease() else {
            return Ok(());
        };
        let Some(fence) = lease.valid_at(now) else {
            return Ok(());
        };
        // With a locker that cannot renew, the leader acquires again each
        // interval and its fence moves up without a new promotion.
        if self.promoted.is_none_or(|promoted| fence < promoted) {
            return Err(Violation::WorkWhileNotPromoted { step: i });
        }
        // Without renewal the leader releases and acquires again each
        // interval, a takeover window the original had: documented, so
        // only a renewing locker is held to the lease here.
        let ours = matches!(self.service.live(now), Some(Holder::Us(_)));
        if !ours && !self.service.forgot && self.renewable {
            return Err(Violation::WorkWithoutLease { step: i, fence });
        }
        self.report.work = self.report.work.saturating_add(1);
        let work = Work {
            fence,
            now,
            until: lease.until(),
        };
        if handler.work(work) {
            if fence >= self.resource {
                self.resource = fence;
                self.report.accepted = self.report.accepted.saturating_add(1);
            } else {
                self.report.refused_stale = self.report.refused_stale.saturating_add(1);
            }
        }
        Ok(())
    }

    /// Carries out the guard's actions: locker calls go in flight, the
    /// callbacks go to the handler, checked.
    fn drain(&mut self, i: usize, handler: &mut impl LeaderHandler) -> Result<(), Violation> {
        while let Some(action) = self.guard.poll_action() {
            match action {
                Action::Acquire | Action::Renew(_) | Action::Release(_) => {
                    self.in_flight = Some(action);
                }
                Action::Promote { fence } => {
                    if self.promoted.is_some() {
                        return Err(Violation::Unpaired { step: i });
                    }
                    if fence <= self.highest_promoted {
                        return Err(Violation::FenceNotIncreasing {
                            step: i,
                            before: self.highest_promoted,
                            after: fence,
                        });
                    }
                    self.highest_promoted = fence;
                    self.promoted = Some(fence);
                    self.report.promotions = self.report.promotions.saturating_add(1);
                    handler.promoted(fence);
                }
                Action::Demote(reason) => {
                    if self.promoted.take().is_none() {
                        return Err(Violation::Unpaired { step: i });
                    }
                    handler.demoted(reason);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::Ttl;

    struct Worker;

    impl LeaderHandler for Worker {
        fn promoted(&mut self, _fence: u64) {}
        fn demoted(&mut self, _reason: DemoteReason) {}
        fn work(&mut self, _work: Work) -> bool {
            true
        }
    }

    fn harness() -> LeaderHarness {
        let config = ActiveConfig::new()
            .with_ttl(Ttl::from_millis(3_000).unwrap())
            .with_interval(Duration::from_millis(1_000));
        LeaderHarness::new(config, true).unwrap()
    }

    /// Promoted at 0 s; at 1.5 s the renewal is in flight and the guard's
    /// deadline (2.7 s) not reached: work is handed over.
    const STEPS: [LeaderStep; 3] = [LeaderStep::Answer, LeaderStep::Wait(16), LeaderStep::Work];

    #[test]
    fn work_within_the_lease_keeps_the_promise() {
        let report = harness().run(&STEPS, &mut Worker).unwrap();
        assert_eq!((report.promotions, report.work), (1, 1));
    }

    #[test]
    fn a_service_that_expires_leases_at_half_their_ttl_is_caught() {
        // The guard acts for its TTL, the service holds the lease for half
        // of it: the work at 1.5 s is done without a lease.
        let mut broken = harness();
        broken.service.shrink = 2;
        assert_eq!(
            broken.run(&STEPS, &mut Worker),
            Err(Violation::WorkWithoutLease { step: 2, fence: 1 })
        );
    }
}

//! The ActiveGuard's invariants as a checker over random event sequences,
//! for the property test and the fuzz target alike.

use std::time::Duration;

use guard_core::guard::{Action, ActiveGuard, ActiveTiming, Done};
use guard_core::lock::{Renewal, Token, TokenId, UnlockError};
use guard_core::time::Instant;

/// Something that happens to a replica: time passes, a backend answers,
/// the consumer or the operator acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(fuzzing, derive(arbitrary::Arbitrary))]
pub enum Event {
    /// Time moves on by this many milliseconds, then the timeout fires.
    Timeout(u16),
    /// An acquire was granted (with a new fence).
    Granted,
    /// An acquire found the key held.
    Held,
    /// An acquire failed.
    AcquireFailed,
    /// A renewal kept the lease.
    RenewHeld,
    /// A renewal lost it.
    RenewLost,
    /// A release finished (or failed).
    Released(bool),
    /// The consumer failed to start.
    PromoteFailed,
    /// The consumer asks to step down.
    Demote,
    /// The replica stops.
    Stop,
}

/// Drives one `ActiveGuard` and checks after every event that promotes
/// and demotes alternate, that the lease it leads with is released only
/// after its demote (with renewals), that a leader never acts past its
/// renew deadline, and that at most one backend operation is in flight.
pub struct Checker {
    guard: ActiveGuard,
    timing: ActiveTiming,
    renewable: bool,
    now: Instant,
    fence: u64,
    promoted: bool,
    leading_fence: Option<u64>,
    outstanding: Option<Action>,
    last_success_send: Option<Instant>,
    sent_at: Instant,
}

impl Checker {
    /// A standby with the default timing.
    pub fn new(renewable: bool) -> Self {
        let now = Instant::from_secs(100);
        let timing = ActiveTiming::new();
        let Ok(guard) = ActiveGuard::new(timing, renewable, now);
        Checker {
            guard,
            timing,
            renewable,
            now,
            fence: 0,
            promoted: false,
            leading_fence: None,
            outstanding: None,
            last_success_send: None,
            sent_at: now,
        }
    }

    /// Applies `ev`; an `Err` names the broken invariant. Backend answers
    /// arrive as a locker returns them, through guard-core's mapping.
    pub fn apply(&mut self, ev: Event) -> Result<(), String> {
        let (g, now) = (&mut self.guard, self.now);
        match ev {
            Event::Timeout(step) => {
                self.now = now + Duration::from_millis(u64::from(step));
                g.handle_timeout(self.now);
            }
            Event::Granted => {
                self.fence += 1;
                let token = Token::new(TokenId([self.fence as u8; 16]), self.fence);
                g.handle(now, Done::acquired(Ok::<_, ()>(Some(token))));
            }
            Event::Held => g.handle(now, Done::acquired(Ok::<_, ()>(None))),
            Event::AcquireFailed => g.handle(now, Done::acquired(Err::<Option<Token>, _>(()))),
            Event::RenewHeld => g.handle(now, Done::renewed(Ok::<_, ()>(Renewal::Held))),
            Event::RenewLost => g.handle(now, Done::renewed(Ok::<_, ()>(Renewal::Lost))),
            Event::Released(ok) => g.handle(
                now,
                Done::released(if ok {
                    Ok(())
                } else {
                    Err(UnlockError::<()>::NotHeld)
                }),
            ),
            Event::PromoteFailed => g.handle_promote_failed(now),
            Event::Demote => g.demote(now),
            Event::Stop => g.stop(now),
        }
        // Results for operations that were not outstanding are ignored by
        // the machine; track what it actually asked for.
        let answered = matches!(
            (ev, self.outstanding),
            (
                Event::Granted | Event::Held | Event::AcquireFailed,
                Some(Action::Acquire)
            ) | (Event::RenewHeld | Event::RenewLost, Some(Action::Renew(_)))
                | (Event::Released(_), Some(Action::Release(_)))
        );
        if answered {
            if matches!(
                (ev, self.outstanding),
                (Event::Granted, Some(Action::Acquire))
                    | (Event::RenewHeld, Some(Action::Renew(_)))
            ) {
                self.last_success_send = Some(self.sent_at);
            }
            self.outstanding = None;
        }
        while let Some(action) = self.guard.poll_action() {
            match action {
                Action::Promote { fence } => {
                    if self.promoted {
                        return Err("promoted twice".into());
                    }
                    self.promoted = true;
                    self.leading_fence = Some(fence);
                }
                Action::Demote(_) => {
                    if !self.promoted {
                        return Err("demoted without a promotion".into());
                    }
                    self.promoted = false;
                }
                Action::Acquire | Action::Renew(_) | Action::Release(_) => {
                    if self.outstanding.is_some() {
                        return Err(format!(
                            "two operations in flight: {:?} and {action:?}",
                            self.outstanding
                        ));
                    }
                    // Demote before releasing the lease it leads with.
                    // (Without renewals the leader's release-and-reacquire
                    // cycle is the original's documented takeover window.)
                    if let Action::Release(t) = action
                        && self.renewable
                        && self.promoted
                        && Some(t.fence()) == self.leading_fence
                    {
                        return Err("released the leading lease while still consuming".into());
                    }
                    self.outstanding = Some(action);
                    self.sent_at = self.now;
                }
            }
        }
        if self.promoted != self.guard.is_active() {
            return Err("is_active disagrees with the callbacks".into());
        }
        if self.promoted {
            let send = self.last_success_send.ok_or("a leader without a success")?;
            if self.now >= send + self.timing.renew_deadline() {
                return Err("acting past the renew deadline".into());
            }
        }
        Ok(())
    }
}

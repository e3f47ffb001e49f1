//! The renewals of one held lock while a job runs: when to renew, and
//! until when the holder may act (a watchdog, as Redisson's), time passed
//! in.
//!
//! Guarantees:
//! - The holder may act until `send time of its last successful acquire
//!   or renew + ttl - drift` ([`ActiveTiming::renew_deadline`]), and never
//!   after: [`Watchdog::lease`] is `None` from then on, even if a renewal
//!   is still in flight (a backend that stopped answering).
//! - A renewal is asked for every interval (ttl / 3 by default) after
//!   the last one was sent, one at a time.
//! - A renewal the backend refused ([`Renewal::Lost`]) ends the hold at
//!   once; one that failed (an error) is retried at the next interval,
//!   and ends the hold only when the deadline passes, so a blip of the
//!   backend shorter than the margin costs nothing.
//! - Once lost, the hold never comes back.

use core::time::Duration;

use crate::guard::{ActiveTiming, Lease};
use crate::lock::{Renewal, Token};
use crate::time::Instant;

/// Why a [`Watchdog`] stopped holding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum HoldLost {
    /// A renewal found the lock gone or held by another token.
    Lost,
    /// No renewal succeeded before the deadline (the backend failed or
    /// did not answer).
    Deadline,
}

/// The hold on one acquired lock; see the module documentation.
#[derive(Clone, Debug)]
pub struct Watchdog {
    timing: ActiveTiming,
    token: Token,
    lease: Lease,
    next_renew: Instant,
    /// When the renewal in flight was sent.
    in_flight: Option<Instant>,
    lost: Option<HoldLost>,
}

impl Watchdog {
    /// The hold of `token`, whose acquire was sent at `acquired_at`.
    pub fn new(timing: ActiveTiming, token: Token, acquired_at: Instant) -> Self {
        Watchdog {
            lease: Lease::new(
                token.fence(),
                acquired_at.saturating_add(timing.renew_deadline()),
            ),
            next_renew: acquired_at.saturating_add(timing.interval()),
            timing,
            token,
            in_flight: None,
            lost: None,
        }
    }

    /// The token the lock is held by (to renew and to release it).
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The fence and the deadline to act by, while held.
    pub fn lease(&self) -> Option<Lease> {
        match self.lost {
            None => Some(self.lease),
            Some(_) => None,
        }
    }

    /// Why the hold ended, once it has.
    pub fn lost(&self) -> Option<HoldLost> {
        self.lost
    }

    /// When to call [`poll_renew`](Self::poll_renew) or
    /// [`handle_timeout`](Self::handle_timeout) next: the next renewal, or
    /// the deadline while one is in flight; `None` once lost.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.lost.is_some() {
            return None;
        }
        let deadline = self.lease.until();
        Some(match self.in_flight {
            Some(_) => deadline,
            None if self.next_renew < deadline => self.next_renew,
            None => deadline,
        })
    }

    /// The token to renew, if a renewal is due at `now` and none is in
    /// flight; the renewal counts as sent at `now`.
    pub fn poll_renew(&mut self, now: Instant) -> Option<Token> {
        self.handle_timeout(now);
        if self.lost.is_some() || self.in_flight.is_some() || now < self.next_renew {
            return None;
        }
        self.in_flight = Some(now);
        Some(self.token)
    }

    /// Ends the hold if its deadline has passed at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        // The lease's own check: the holder may act strictly before `until`.
        if self.lost.is_none() && self.lease.valid_at(now).is_none() {
            self.lost = Some(HoldLost::Deadline);
        }
    }

    /// The answer to the renewal in flight, received at `now`.
    pub fn handle_renewed<E>(&mut self, now: Instant, result: Result<Renewal, E>) {
        let Some(sent) = self.in_flight.take() else {
            return;
        };
        match result {
            // Measured from the send time: the server's TTL started no
            // earlier than that.
            Ok(Renewal::Held) if self.lost.is_none() => {
                self.lease = Lease::new(
                    self.token.fence(),
                    sent.saturating_add(self.timing.renew_deadline()),
                );
                self.next_renew = sent.saturating_add(self.timing.interval());
            }
            Ok(Renewal::Held) => {}
            Ok(Renewal::Lost) => {
                self.lost.get_or_insert(HoldLost::Lost);
            }
            Err(_) => self.next_renew = now.saturating_add(retry_after(self.timing)),
        }
        self.handle_timeout(now);
    }
}

/// After a failed renewal: the next interval.
const fn retry_after(timing: ActiveTiming) -> Duration {
    timing.interval()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::ActiveConfig;
    use crate::lock::{TokenId, Ttl};

    fn timing() -> ActiveTiming {
        // 3 s lease, renewed every second, 300 ms drift: act until 2.7 s.
        ActiveConfig::new()
            .with_ttl(Ttl::from_secs(3).unwrap())
            .validate()
            .unwrap()
    }

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    #[test]
    fn renewals_every_interval_extend_the_deadline_from_their_send_time() {
        let mut dog = Watchdog::new(timing(), Token::new(TokenId([1; 16]), 7), ms(0));
        assert_eq!(dog.lease().unwrap().until(), ms(2_700));
        assert_eq!(dog.poll_timeout(), Some(ms(1_000)));
        assert_eq!(dog.poll_renew(ms(999)), None);
        assert!(dog.poll_renew(ms(1_000)).is_some());
        assert_eq!(dog.poll_renew(ms(1_001)), None, "one at a time");
        assert_eq!(
            dog.poll_timeout(),
            Some(ms(2_700)),
            "the deadline while in flight"
        );
        dog.handle_renewed::<()>(ms(1_400), Ok(Renewal::Held));
        assert_eq!(dog.lease().unwrap().until(), ms(3_700));
        assert_eq!(dog.lease().unwrap().fence(), 7);
        assert_eq!(dog.poll_timeout(), Some(ms(2_000)));
    }

    #[test]
    fn a_renewal_that_never_answers_ends_the_hold_at_the_deadline() {
        let mut dog = Watchdog::new(timing(), Token::new(TokenId([1; 16]), 7), ms(0));
        assert!(dog.poll_renew(ms(1_000)).is_some());
        dog.handle_timeout(ms(2_699));
        assert!(dog.lease().is_some());
        dog.handle_timeout(ms(2_700));
        assert_eq!(dog.lease(), None);
        assert_eq!(dog.lost(), Some(HoldLost::Deadline));
        // A late success does not bring it back.
        dog.handle_renewed::<()>(ms(2_800), Ok(Renewal::Held));
        assert_eq!(dog.lease(), None);
        assert_eq!(dog.poll_timeout(), None);
    }

    #[test]
    fn a_refused_renewal_ends_the_hold_and_a_failed_one_is_retried() {
        let mut dog = Watchdog::new(timing(), Token::new(TokenId([1; 16]), 7), ms(0));
        assert!(dog.poll_renew(ms(1_000)).is_some());
        dog.handle_renewed(ms(1_010), Err("connection reset"));
        assert!(dog.lease().is_some(), "an error alone is not a loss");
        assert_eq!(dog.poll_timeout(), Some(ms(2_010)));
        assert!(dog.poll_renew(ms(2_010)).is_some());
        dog.handle_renewed::<()>(ms(2_020), Ok(Renewal::Lost));
        assert_eq!(dog.lost(), Some(HoldLost::Lost));
        assert_eq!(dog.poll_renew(ms(5_000)), None);
    }
}

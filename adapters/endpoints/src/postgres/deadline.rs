//! The local deadline of a claimed batch: the consumer-side half of the
//! claim's lease.

use std::time::{Duration, Instant};

/// The local deadline of one claimed batch, on this process's monotonic
/// clock: no row of the batch is handed to the handler from then on.
///
/// The server starts a claim's lease (`now() + lease`) after it received
/// the claim, which is after `sent_at`: the deadline `sent_at + lease -
/// margin` comes before the lease ends on the server as long as the two
/// clocks disagree by less than the margin over one lease. The margin is
/// a tenth of the lease, as for the leases of the elected endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClaimDeadline {
    at: Option<Instant>,
}

impl ClaimDeadline {
    /// The deadline of a claim for `lease` sent at `sent_at`.
    pub(crate) fn new(sent_at: Instant, lease: Duration) -> Self {
        ClaimDeadline {
            at: sent_at.checked_add(lease.saturating_sub(Self::margin(lease))),
        }
    }

    /// The margin kept for clock disagreement: a tenth of the lease.
    pub(crate) fn margin(lease: Duration) -> Duration {
        lease / 10
    }

    /// Whether a row may still be handed to the handler at `now`.
    pub(crate) fn allows_start(&self, now: Instant) -> bool {
        // An instant past what the clock can hold is never reached.
        self.at.is_none_or(|at| now < at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_comes_a_tenth_of_the_lease_early() {
        let sent = Instant::now();
        let deadline = ClaimDeadline::new(sent, Duration::from_secs(10));
        assert!(deadline.allows_start(sent));
        assert!(deadline.allows_start(sent + Duration::from_millis(8_999)));
        assert!(!deadline.allows_start(sent + Duration::from_secs(9)));
        assert!(!deadline.allows_start(sent + Duration::from_secs(60)));
    }
}

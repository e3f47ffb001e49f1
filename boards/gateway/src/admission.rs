//! Rate limits that act: every message of a limited endpoint passes its
//! limiter before the handler sees it.
//!
//! A refused message waits for the time the limiter names and asks again,
//! up to the endpoint's `max_wait`; then, or at once with
//! `when_limited = "dead-letter"`, it is refused for good and the caller
//! dead-letters it. Nothing is dropped: a stream entry goes to its
//! dead-letter stream (or stays pending), a broadcast message to the
//! endpoint's in-memory dead letters ([`DEAD_LETTERS`]). A limiter that
//! cannot answer (a Redis backend down) refuses, saying why.
//!
//! A message costs one unit, or its payload's size in bytes under a policy
//! with `cost = "bytes"` ([`Admission::counting`]): a metered uplink's
//! quota of bytes a day.
//!
//! ```
//! # smol::block_on(async {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use guard_core::limit::{FullPolicy, Rate, TokenBucket};
//! use guard_gateway::admission::{Admission, Verdict};
//! use guard_gateway::config::WhenLimited;
//! use guard_std::ratelimit::{MemoryLimiter, NamedRateLimiter};
//!
//! let bucket = TokenBucket::new(1, Rate::per(1, Duration::from_secs(60)))?;
//! let limiter = NamedRateLimiter::new("uplink", Arc::new(MemoryLimiter::new(bucket, 16, FullPolicy::DenyNewKeys)));
//! let gate = Admission::new(Arc::new(limiter), WhenLimited::DeadLetter);
//! assert!(matches!(gate.admit("sensors", 12).await, Verdict::Admitted));
//! assert!(matches!(gate.admit("sensors", 12).await, Verdict::Refused(_)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # });
//! ```

use guard_std::run::CallerRuntime;
use guard_std::run::Runtime as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use guard_core::limit::Decision;
use guard_std::ratelimit::{LimitError, NamedRateLimiter};

use crate::config::{Cost, WhenLimited};

/// Why a message was not admitted.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Refusal {
    /// The limiter still refused after the endpoint's longest wait (zero
    /// with `when_limited = "dead-letter"`).
    Limited {
        /// How long the message waited.
        waited: Duration,
    },
    /// The limiter could not decide: its backend failed or the message
    /// costs more than the quota, with this error (shared, so a refusal
    /// stays `Clone`; it is also the source).
    LimiterFailed(Arc<LimitError>),
    /// The caller's condition failed before the message took anything of
    /// the quota ([`Admission::admit_while`]: the lease it was read under
    /// ended while it waited): no unit was spent on it.
    Withdrawn,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Limited { waited } => write!(f, "rate limited (waited {waited:?})"),
            Refusal::LimiterFailed(e) => write!(f, "the rate limiter gave no decision: {e}"),
            Refusal::Withdrawn => {
                f.write_str("the lease it was read under ended while it waited for the limiter")
            }
        }
    }
}

impl std::error::Error for Refusal {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Refusal::Limited { .. } | Refusal::Withdrawn => None,
            Refusal::LimiterFailed(e) => Some(&**e),
        }
    }
}

/// The outcome of [`Admission::admit`].
#[derive(Clone, Debug)]
pub enum Verdict {
    /// Hand the message to the handler.
    Admitted,
    /// Do not: dead-letter it.
    Refused(Refusal),
}

/// One endpoint's limiter and what to do when it refuses.
#[derive(Clone, Debug)]
pub struct Admission {
    limiter: Arc<NamedRateLimiter>,
    when_limited: WhenLimited,
    cost: Cost,
}

impl Admission {
    /// Messages pass `limiter` (its decisions counted under its name);
    /// a refused one waits or not as `when_limited` says.
    /// Each message costs one unit.
    pub fn new(limiter: Arc<NamedRateLimiter>, when_limited: WhenLimited) -> Self {
        Admission {
            limiter,
            when_limited,
            cost: Cost::Messages,
        }
    }

    /// Messages cost what `cost` says: one unit each, or their size in
    /// bytes.
    #[must_use]
    pub fn counting(mut self, cost: Cost) -> Self {
        self.cost = cost;
        self
    }

    /// The units a message of `size` bytes costs. A size beyond the
    /// largest cost is that cost: more than any quota, refused as such.
    fn units(&self, size: usize) -> u32 {
        match self.cost {
            Cost::Messages => 1,
            Cost::Bytes => u32::try_from(size).unwrap_or(u32::MAX),
        }
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        self.limiter.name()
    }

    /// Asks until the limiter admits a message of `size` bytes for `key`,
    /// however long that takes (back-pressure, for a message that has
    /// nowhere else to go); only a failing limiter ends it, with its error
    /// (a message that costs more than the whole quota among them).
    pub async fn admit_eventually(&self, key: &str, size: usize) -> Result<(), Refusal> {
        self.admit_eventually_while(key, size, || true).await
    }

    /// [`admit_eventually`](Self::admit_eventually), asking `may_take`
    /// immediately before each request to the limiter: once it says no,
    /// [`Refusal::Withdrawn`], with nothing of the quota taken (a deposed
    /// leader's message spends nothing of a quota the replicas share).
    pub async fn admit_eventually_while(
        &self,
        key: &str,
        size: usize,
        may_take: impl Fn() -> bool,
    ) -> Result<(), Refusal> {
        let units = self.units(size);
        loop {
            if !may_take() {
                return Err(Refusal::Withdrawn);
            }
            match self
                .limiter
                .check_n(key, units)
                .await
                .map(|report| report.decision)
            {
                Ok(Decision::Allowed) => return Ok(()),
                Ok(Decision::Denied { retry_after }) => {
                    CallerRuntime.sleep(retry_after).await;
                }
                Err(e) => return Err(Refusal::LimiterFailed(Arc::new(e))),
            }
        }
    }

    /// Asks the limiter for a message of `size` bytes for `key`, waiting
    /// between refusals for the time it names, as long as the policy
    /// allows.
    pub async fn admit(&self, key: &str, size: usize) -> Verdict {
        self.admit_while(key, size, || true).await
    }

    /// [`admit`](Self::admit), asking `may_take` immediately before each
    /// request to the limiter (the first one too): once it says no,
    /// refused as [`Refusal::Withdrawn`], with nothing of the quota taken.
    /// An elected endpoint passes its lease's validity: a message that
    /// waits in a limiter while its lease ends takes no token.
    pub async fn admit_while(
        &self,
        key: &str,
        size: usize,
        may_take: impl Fn() -> bool,
    ) -> Verdict {
        let units = self.units(size);
        let started = Instant::now();
        let max_wait = match self.when_limited {
            WhenLimited::Wait(max) => max,
            WhenLimited::DeadLetter => Duration::ZERO,
        };
        loop {
            if !may_take() {
                return Verdict::Refused(Refusal::Withdrawn);
            }
            match self
                .limiter
                .check_n(key, units)
                .await
                .map(|report| report.decision)
            {
                Ok(Decision::Allowed) => return Verdict::Admitted,
                Ok(Decision::Denied { retry_after }) => {
                    let waited = started.elapsed();
                    // Waiting past the bound would only end in a refusal.
                    if waited.saturating_add(retry_after) > max_wait {
                        return Verdict::Refused(Refusal::Limited { waited });
                    }
                    CallerRuntime.sleep(retry_after).await;
                }
                Err(e) => return Verdict::Refused(Refusal::LimiterFailed(Arc::new(e))),
            }
        }
    }
}

/// Refused messages a broadcast endpoint keeps in memory (in a
/// `guard_std::MeteredDeadLetterQueue`: bounded in letters and in bytes,
/// `guard_dlq_size{topic}` and `guard_dlq_bytes{topic}` kept up to date, a
/// full queue hands the message back).
pub const DEAD_LETTERS: usize = 1024;

/// A message an endpoint could not hand over: where it came from, its
/// payload and the fence it was read under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undelivered {
    /// The channel or topic.
    pub from: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// The fence of the lease it was read under, if elected.
    pub fence: Option<u64>,
}

impl Undelivered {
    /// What a dead letter of this message with `why` costs in memory:
    /// its origin, payload and reason, all kept whole, and the letter's
    /// own fixed size.
    pub fn weight(letter: &guard_core::dlq::FailedElement<Undelivered, String>) -> usize {
        let message = letter.element();
        std::mem::size_of_val(letter)
            + message.from.len()
            + message.payload.len()
            + letter.error().map_or(0, String::len)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use guard_core::limit::{FullPolicy, Rate, TokenBucket};
    use guard_std::ratelimit::MemoryLimiter;

    use super::*;

    /// One message per 300 ms, waiting up to 5 s.
    fn gate() -> Admission {
        let bucket = TokenBucket::new(1, Rate::per(1, Duration::from_millis(300))).unwrap();
        let limiter = MemoryLimiter::new(bucket, 16, FullPolicy::DenyNewKeys);
        Admission::new(
            Arc::new(NamedRateLimiter::new("uplink", Arc::new(limiter))),
            WhenLimited::Wait(Duration::from_secs(5)),
        )
    }

    #[test]
    fn a_message_whose_lease_ends_while_it_waits_takes_nothing_of_the_quota() {
        smol::block_on(async {
            let gate = gate();
            assert!(matches!(gate.admit("k", 1).await, Verdict::Admitted));
            // The next waits for the token; its lease ends on the second
            // question, during the wait, before the token comes.
            let asked = Cell::new(0);
            let valid = || {
                asked.set(asked.get() + 1);
                asked.get() < 2
            };
            let verdict = gate.admit_while("k", 1, valid).await;
            assert!(
                matches!(verdict, Verdict::Refused(Refusal::Withdrawn)),
                "{verdict:?}"
            );
            // The token it waited for is still there for the next holder.
            let started = Instant::now();
            assert!(matches!(gate.admit("k", 1).await, Verdict::Admitted));
            assert!(
                started.elapsed() < Duration::from_millis(250),
                "the withdrawn message spent a token: the next waited {:?}",
                started.elapsed()
            );
            let eventually = gate.admit_eventually_while("k", 1, || false).await;
            assert!(
                matches!(eventually, Err(Refusal::Withdrawn)),
                "{eventually:?}"
            );
        });
    }
}

//! A circuit breaker: stop calling a service that is failing, try it again
//! after a while with a few trial calls, and go back to normal when they
//! pass.
//!
//! The states and rules are Resilience4j's, checked against its own test
//! scenarios (`core/tests/breaker.rs`), with the time passed in:
//!
//! - **Closed**: every call is permitted and its outcome recorded in a
//!   window ([`CountWindow`]: the last `N` calls; [`TimeWindow`]: the calls
//!   of the last `N` seconds). Once the window holds at least
//!   `minimum_calls` calls, the breaker opens when the share of failures
//!   reaches `failure_rate` percent, or the share of slow calls (calls that
//!   took longer than `slow_call_duration`, failed or not) reaches
//!   `slow_call_rate` percent.
//! - **Open**: no call is permitted; the refusal says how long until the
//!   breaker half-opens, `wait_in_open` after it opened. The move is made
//!   by the first request for a permission after that (time is passed in,
//!   nothing runs on its own).
//! - **Half-open**: `half_open_calls` trial calls are permitted, no more.
//!   When all of them have ended, the breaker closes (with an empty window)
//!   if their failure and slow rates are below the thresholds, and opens
//!   again otherwise. With `max_wait_in_half_open` set, a half-open breaker
//!   whose trials have not all ended by then opens again.
//! - **Disabled** permits everything and records nothing; **forced open**
//!   permits nothing; both stay until the caller moves the breaker.
//!
//! Each permission is a [`Permit`] that names the state it was given in: an
//! outcome that arrives after the breaker has moved on (a slow call that
//! started while closed and ends after it opened) is not counted in the
//! new state's decision. Rates are compared in integers (`failures × 100 ≥
//! rate × calls`): no floating point.
//!
//! ```
//! use core::time::Duration;
//! use guard_core::breaker::{BreakerConfig, CircuitBreaker, CountWindow, State};
//! use guard_core::time::Instant;
//!
//! let config = BreakerConfig::new()
//!     .with_minimum_calls(4)
//!     .with_failure_rate(50)
//!     .with_wait_in_open(Duration::from_secs(30));
//! let mut breaker = CircuitBreaker::new(config, CountWindow::<10>::new())?;
//! let t = Instant::from_secs(100);
//! for failed in [false, true, false, true] {
//!     let permit = breaker.try_acquire(t).unwrap();
//!     breaker.on_result(permit, t, failed);
//! }
//! // Two failures in four calls: 50%, the threshold.
//! assert_eq!(breaker.state(), State::Open);
//! let refused = breaker.try_acquire(t + Duration::from_secs(10)).unwrap_err();
//! assert_eq!(refused.retry_after, Some(Duration::from_secs(20)));
//! // Thirty seconds on, a trial call is permitted.
//! assert!(breaker.try_acquire(t + Duration::from_secs(30)).is_ok());
//! assert_eq!(breaker.state(), State::HalfOpen);
//! # Ok::<(), guard_core::breaker::InvalidBreakerConfig>(())
//! ```

pub mod redis;
mod snapshot;
mod window;

pub use snapshot::{InvalidSnapshot, SnapshotReader, SnapshotWriter, WindowSnapshot};
pub use window::{CallWindow, CountWindow, Tally, TimeWindow};

use core::fmt;
use core::time::Duration;

use crate::time::Instant;

/// The state of a breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum State {
    /// Calls are permitted and judged.
    Closed,
    /// No call is permitted until the wait is over.
    Open,
    /// A bounded number of trial calls is permitted.
    HalfOpen,
    /// Calls are permitted and not judged.
    Disabled,
    /// No call is permitted until the caller moves the breaker.
    ForcedOpen,
}

impl State {
    /// The state's name, as Resilience4j writes it.
    pub const fn name(self) -> &'static str {
        match self {
            State::Closed => "CLOSED",
            State::Open => "OPEN",
            State::HalfOpen => "HALF_OPEN",
            State::Disabled => "DISABLED",
            State::ForcedOpen => "FORCED_OPEN",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A move from one state to another: what events and metrics report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Transition {
    /// The state left.
    pub from: State,
    /// The state entered.
    pub to: State,
}

/// Parameters a breaker cannot work with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum InvalidBreakerConfig {
    /// A rate threshold is a percentage from 1 to 100.
    RateOutOfRange {
        /// Which threshold: `"failure_rate"` or `"slow_call_rate"`.
        parameter: &'static str,
        /// The value given.
        value: u8,
    },
    /// `minimum_calls` must be at least 1.
    ZeroMinimumCalls,
    /// `half_open_calls` must be at least 1.
    ZeroHalfOpenCalls,
    /// `wait_in_open` must be longer than zero.
    ZeroWaitInOpen,
    /// `slow_call_duration` must be longer than zero.
    ZeroSlowCallDuration,
}

impl fmt::Display for InvalidBreakerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidBreakerConfig::RateOutOfRange { parameter, value } => write!(
                f,
                "circuit breaker {parameter}: {value}: a threshold is a percentage from 1 to 100"
            ),
            InvalidBreakerConfig::ZeroMinimumCalls => {
                f.write_str("circuit breaker minimum_calls: 0: it must be at least 1")
            }
            InvalidBreakerConfig::ZeroHalfOpenCalls => {
                f.write_str("circuit breaker half_open_calls: 0: it must be at least 1")
            }
            InvalidBreakerConfig::ZeroWaitInOpen => {
                f.write_str("circuit breaker wait_in_open: 0: an open breaker must wait")
            }
            InvalidBreakerConfig::ZeroSlowCallDuration => {
                f.write_str("circuit breaker slow_call_duration: 0: every call would be slow")
            }
        }
    }
}

impl core::error::Error for InvalidBreakerConfig {}

/// A breaker's thresholds and waits; see the module notes. The defaults
/// are Resilience4j's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct BreakerConfig {
    failure_rate: u8,
    slow_call_rate: u8,
    slow_call_duration: Duration,
    minimum_calls: u32,
    half_open_calls: u32,
    wait_in_open: Duration,
    max_wait_in_half_open: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl BreakerConfig {
    /// Resilience4j's defaults: failure rate 50%, slow call rate 100%, slow
    /// beyond 60 s, at least 100 calls, 10 trial calls, 60 s open, no limit
    /// on the half-open wait.
    pub const fn new() -> Self {
        BreakerConfig {
            failure_rate: 50,
            slow_call_rate: 100,
            slow_call_duration: Duration::from_secs(60),
            minimum_calls: 100,
            half_open_calls: 10,
            wait_in_open: Duration::from_secs(60),
            max_wait_in_half_open: Duration::ZERO,
        }
    }

    /// Opens at this share of failed calls, in percent (1 to 100).
    pub const fn with_failure_rate(mut self, percent: u8) -> Self {
        self.failure_rate = percent;
        self
    }

    /// Opens at this share of slow calls, in percent (1 to 100).
    pub const fn with_slow_call_rate(mut self, percent: u8) -> Self {
        self.slow_call_rate = percent;
        self
    }

    /// A call is slow when it takes longer than this.
    pub const fn with_slow_call_duration(mut self, duration: Duration) -> Self {
        self.slow_call_duration = duration;
        self
    }

    /// The calls a closed breaker's window must hold before it judges them
    /// (at most the window's size, for a count window).
    pub const fn with_minimum_calls(mut self, calls: u32) -> Self {
        self.minimum_calls = calls;
        self
    }

    /// The trial calls of a half-open breaker.
    pub const fn with_half_open_calls(mut self, calls: u32) -> Self {
        self.half_open_calls = calls;
        self
    }

    /// How long an open breaker refuses before it half-opens.
    pub const fn with_wait_in_open(mut self, wait: Duration) -> Self {
        self.wait_in_open = wait;
        self
    }

    /// How long a half-open breaker waits for its trials before it opens
    /// again; zero (the default) waits for as long as they take.
    pub const fn with_max_wait_in_half_open(mut self, wait: Duration) -> Self {
        self.max_wait_in_half_open = wait;
        self
    }

    /// The failure rate threshold, in percent.
    pub const fn failure_rate(&self) -> u8 {
        self.failure_rate
    }

    /// The slow call rate threshold, in percent.
    pub const fn slow_call_rate(&self) -> u8 {
        self.slow_call_rate
    }

    /// The duration beyond which a call is slow.
    pub const fn slow_call_duration(&self) -> Duration {
        self.slow_call_duration
    }

    /// Whether a call that took `took` is slow: longer than
    /// `slow_call_duration` (Resilience4j's rule: a call of exactly the
    /// threshold is not slow).
    pub fn is_slow(&self, took: Duration) -> bool {
        took > self.slow_call_duration
    }

    /// The calls a closed breaker judges over at the least.
    pub const fn minimum_calls(&self) -> u32 {
        self.minimum_calls
    }

    /// The trial calls of a half-open breaker.
    pub const fn half_open_calls(&self) -> u32 {
        self.half_open_calls
    }

    /// How long an open breaker refuses.
    pub const fn wait_in_open(&self) -> Duration {
        self.wait_in_open
    }

    /// How long a half-open breaker waits for its trials (zero: no limit).
    pub const fn max_wait_in_half_open(&self) -> Duration {
        self.max_wait_in_half_open
    }

    /// The first parameter no breaker can work with, if any.
    pub const fn validate(&self) -> Result<(), InvalidBreakerConfig> {
        if self.failure_rate == 0 || self.failure_rate > 100 {
            return Err(InvalidBreakerConfig::RateOutOfRange {
                parameter: "failure_rate",
                value: self.failure_rate,
            });
        }
        if self.slow_call_rate == 0 || self.slow_call_rate > 100 {
            return Err(InvalidBreakerConfig::RateOutOfRange {
                parameter: "slow_call_rate",
                value: self.slow_call_rate,
            });
        }
        if self.minimum_calls == 0 {
            return Err(InvalidBreakerConfig::ZeroMinimumCalls);
        }
        if self.half_open_calls == 0 {
            return Err(InvalidBreakerConfig::ZeroHalfOpenCalls);
        }
        if self.wait_in_open.is_zero() {
            return Err(InvalidBreakerConfig::ZeroWaitInOpen);
        }
        if self.slow_call_duration.is_zero() {
            return Err(InvalidBreakerConfig::ZeroSlowCallDuration);
        }
        Ok(())
    }

    /// Whether `tally` reaches either threshold.
    const fn exceeded(&self, tally: Tally) -> bool {
        tally.calls > 0
            && (reaches(tally.failures, tally.calls, self.failure_rate)
                || reaches(tally.slow, tally.calls, self.slow_call_rate))
    }
}

/// Whether `count` of `calls` is at least `percent` percent, exactly:
/// `count × 100 ≥ percent × calls` (both sides below 2⁴⁰).
const fn reaches(count: u32, calls: u32, percent: u8) -> bool {
    (count as u64).saturating_mul(100) >= (percent as u64).saturating_mul(calls as u64)
}

/// Permission for one call, to be handed back with its outcome.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a permit's outcome must be reported (on_result or on_ignored)"]
pub struct Permit {
    started: Instant,
    /// The state the permission was given in.
    epoch: u32,
}

impl Permit {
    /// When the call was permitted: a slow call is timed from here.
    pub const fn started(&self) -> Instant {
        self.started
    }

    /// The permit as two numbers (when it started, and the state it was
    /// given in), for a breaker whose state lives elsewhere: guard-redis's
    /// shared breaker keeps them to report the outcome again when another
    /// replica's write came first. [`Permit::from_parts`] is the inverse.
    pub const fn into_parts(self) -> (Instant, u32) {
        (self.started, self.epoch)
    }

    /// The permit [`Permit::into_parts`] gave. A permit made up (of a
    /// state the breaker never was in) is not counted.
    pub const fn from_parts(started: Instant, epoch: u32) -> Permit {
        Permit { started, epoch }
    }
}

/// A call the breaker does not permit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NotPermitted {
    /// The state that refused.
    pub state: State,
    /// How long until an open breaker half-opens; `None` when no wait
    /// says (half-open with every trial out, forced open).
    pub retry_after: Option<Duration>,
}

impl fmt::Display for NotPermitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "circuit breaker is {}: call not permitted", self.state)?;
        match self.retry_after {
            Some(wait) => write!(f, " (half-opens in {} ms)", wait.as_millis()),
            None => Ok(()),
        }
    }
}

impl core::error::Error for NotPermitted {}

/// What a breaker has seen: its current window or trials, and its
/// refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Metrics {
    /// The calls being judged: the window's while closed, the trials'
    /// while half-open, those last judged while open.
    pub tally: Tally,
    /// The calls `tally` must hold to be judged: `minimum_calls` (at most
    /// a count window's size) for a window, `half_open_calls` for trials.
    pub minimum_calls: u32,
    /// Calls refused since the breaker was built.
    pub not_permitted: u64,
}

impl Metrics {
    /// The failure rate in percent, rounded down; `None` while the calls
    /// judged are fewer than `minimum_calls` (Resilience4j's `-1`).
    pub fn failure_rate(&self) -> Option<u32> {
        self.rate(self.tally.failures)
    }

    /// The slow call rate in percent, rounded down; `None` while the calls
    /// judged are fewer than `minimum_calls`.
    pub fn slow_call_rate(&self) -> Option<u32> {
        self.rate(self.tally.slow)
    }

    fn rate(&self, count: u32) -> Option<u32> {
        let calls = self.tally.calls;
        if calls < self.minimum_calls {
            return None;
        }
        let percent = u64::from(count)
            .saturating_mul(100)
            .checked_div(u64::from(calls))?;
        u32::try_from(percent.min(100)).ok()
    }
}

/// Where the state machine is, with what each state keeps.
#[derive(Clone, Copy, Debug)]
enum Phase {
    Closed,
    Open {
        since: Instant,
    },
    HalfOpen {
        since: Instant,
        handed: u32,
        trials: Tally,
    },
    Disabled,
    ForcedOpen,
}

/// A circuit breaker over window `W`; see the module notes.
#[derive(Clone, Debug)]
pub struct CircuitBreaker<W> {
    config: BreakerConfig,
    window: W,
    phase: Phase,
    /// Counts the states entered, so that a permit from an earlier one is
    /// known (wrapping: four billion moves apart is the same epoch).
    epoch: u32,
    /// The calls the breaker last judged (the window's or the trials'),
    /// with the minimum they were judged against: an open breaker's
    /// metrics.
    last_tally: Tally,
    last_minimum: u32,
    not_permitted: u64,
}

impl<W> CircuitBreaker<W> {
    /// The parameters.
    pub const fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// The state as of the last reading (an open breaker whose wait is
    /// over says `Open` until asked for a permission).
    pub const fn state(&self) -> State {
        match self.phase {
            Phase::Closed => State::Closed,
            Phase::Open { .. } => State::Open,
            Phase::HalfOpen { .. } => State::HalfOpen,
            Phase::Disabled => State::Disabled,
            Phase::ForcedOpen => State::ForcedOpen,
        }
    }
}

impl<W: CallWindow> CircuitBreaker<W> {
    /// A closed breaker with `config`, judging over `window`.
    pub fn new(config: BreakerConfig, window: W) -> Result<Self, InvalidBreakerConfig> {
        config.validate()?;
        Ok(CircuitBreaker {
            config,
            window,
            phase: Phase::Closed,
            epoch: 0,
            last_tally: Tally::default(),
            last_minimum: 0,
            not_permitted: 0,
        })
    }

    /// What the breaker is judging, and its refusals.
    pub fn metrics(&mut self, now: Instant) -> Metrics {
        let (tally, minimum_calls) = match self.phase {
            Phase::Closed => (self.window.tally(now), self.closed_minimum()),
            Phase::HalfOpen { trials, .. } => (trials, self.config.half_open_calls),
            _ => (self.last_tally, self.last_minimum),
        };
        Metrics {
            tally,
            minimum_calls,
            not_permitted: self.not_permitted,
        }
    }

    fn closed_minimum(&self) -> u32 {
        match self.window.capacity() {
            Some(size) => self.config.minimum_calls.min(size),
            None => self.config.minimum_calls,
        }
    }

    /// Permission for a call at `now`, or why not. An open breaker whose
    /// wait is over half-opens here; a half-open one past its
    /// `max_wait_in_half_open` opens again here.
    pub fn try_acquire(&mut self, now: Instant) -> Result<Permit, NotPermitted> {
        let refuse = |breaker: &mut Self, retry_after| {
            breaker.not_permitted = breaker.not_permitted.saturating_add(1);
            Err(NotPermitted {
                state: breaker.state(),
                retry_after,
            })
        };
        if let Phase::Open { since } = self.phase {
            let until = since.saturating_add(self.config.wait_in_open);
            if now < until {
                return refuse(self, Some(until.saturating_duration_since(now)));
            }
            self.half_open(now);
        }
        if let Phase::HalfOpen { since, .. } = self.phase {
            let max_wait = self.config.max_wait_in_half_open;
            if !max_wait.is_zero() && now >= since.saturating_add(max_wait) {
                self.enter(Phase::Open { since: now });
                return refuse(self, Some(self.config.wait_in_open));
            }
        }
        match &mut self.phase {
            Phase::Closed | Phase::Disabled => Ok(self.permit(now)),
            Phase::HalfOpen { handed, .. } if *handed < self.config.half_open_calls => {
                *handed = handed.saturating_add(1);
                Ok(self.permit(now))
            }
            Phase::HalfOpen { .. } | Phase::ForcedOpen => refuse(self, None),
            // Still open: refused above.
            Phase::Open { .. } => refuse(self, Some(self.config.wait_in_open)),
        }
    }

    /// Records the outcome of the call `permit` allowed, ended at `now`:
    /// failed or not, slow if it took longer than `slow_call_duration`. The
    /// move this makes, if any, comes back. An outcome from a permit of an
    /// earlier state is not counted.
    pub fn on_result(&mut self, permit: Permit, now: Instant, failed: bool) -> Option<Transition> {
        if permit.epoch != self.epoch {
            return None;
        }
        let slow = self
            .config
            .is_slow(now.saturating_duration_since(permit.started));
        match &mut self.phase {
            Phase::Closed => {
                self.window.record(now, failed, slow);
                let tally = self.window.tally(now);
                let minimum = self.closed_minimum();
                (self.last_tally, self.last_minimum) = (tally, minimum);
                if tally.calls >= minimum && self.config.exceeded(tally) {
                    return Some(self.enter(Phase::Open { since: now }));
                }
                None
            }
            Phase::HalfOpen { trials, .. } => {
                *trials = trials.with(failed, slow);
                let trials = *trials;
                if trials.calls < self.config.half_open_calls {
                    return None;
                }
                (self.last_tally, self.last_minimum) = (trials, self.config.half_open_calls);
                if self.config.exceeded(trials) {
                    Some(self.enter(Phase::Open { since: now }))
                } else {
                    self.window.clear();
                    Some(self.enter(Phase::Closed))
                }
            }
            Phase::Open { .. } | Phase::Disabled | Phase::ForcedOpen => None,
        }
    }

    /// Hands back a permit whose call is not to be judged (an error the
    /// caller's classifier ignores): a half-open breaker may give the trial
    /// to another call.
    pub fn on_ignored(&mut self, permit: Permit) {
        if permit.epoch != self.epoch {
            return;
        }
        if let Phase::HalfOpen { handed, .. } = &mut self.phase {
            *handed = handed.saturating_sub(1);
        }
    }

    /// Moves to closed, with an empty window.
    pub fn close(&mut self) -> Transition {
        self.window.clear();
        self.enter(Phase::Closed)
    }

    /// Moves to open, as of `now`.
    pub fn open(&mut self, now: Instant) -> Transition {
        self.enter(Phase::Open { since: now })
    }

    /// Moves to half-open, as of `now`: `half_open_calls` fresh trials.
    pub fn half_open(&mut self, now: Instant) -> Transition {
        self.enter(Phase::HalfOpen {
            since: now,
            handed: 0,
            trials: Tally::default(),
        })
    }

    /// Moves to forced open: nothing is permitted until the next move.
    pub fn force_open(&mut self) -> Transition {
        self.enter(Phase::ForcedOpen)
    }

    /// Moves to disabled: everything is permitted and nothing judged.
    pub fn disable(&mut self) -> Transition {
        self.enter(Phase::Disabled)
    }

    fn permit(&self, now: Instant) -> Permit {
        Permit {
            started: now,
            epoch: self.epoch,
        }
    }

    fn enter(&mut self, phase: Phase) -> Transition {
        let from = self.state();
        self.phase = phase;
        self.epoch = self.epoch.wrapping_add(1);
        Transition {
            from,
            to: self.state(),
        }
    }
}

//! Single active consumer by lease: a sans-IO state machine.
//!
//! The machine never performs IO and never reads a clock. A runtime drives
//! it in a loop:
//!
//! 1. wait until [`ActiveGuard::poll_timeout`] (or a result, or a stop);
//! 2. call [`ActiveGuard::handle_timeout`], or [`ActiveGuard::handle`] with
//!    the [`Done`] built from the locker's result (the mapping from lock
//!    results to machine inputs lives here, once, not in each runtime);
//! 3. execute every [`Action`] from [`ActiveGuard::poll_action`] in order.
//!
//! At most one backend operation is in flight at a time; a spurious timeout
//! is a no-op. The timing is validated once, into an [`ActiveTiming`]; a
//! machine built from one cannot fail.
//!
//! Guarantees:
//! - **Renew deadline.** A leader demotes itself once no acquire or renew
//!   sent at `t` has succeeded by `t + ttl - drift`, even if the backend
//!   never answers: it stops acting before the server can have expired its
//!   lease (with clocks that drift by less than `drift` per `ttl`).
//! - **The lease is checkable where the side effect happens.**
//!   [`ActiveGuard::lease`] is the fence and that same deadline while
//!   promoted, `None` otherwise; a runtime publishes it after every step
//!   into a [`SharedLease`](super::SharedLease) that the consumer checks on
//!   its own clock before every handler call, so work queued across a pause
//!   is refused before the runtime has even processed the timeout.
//! - **Callbacks pair up.** Every `Promote` is followed by at most one
//!   `Demote`; no `Demote` without a `Promote`.
//! - **Demote before release.** On stop, explicit demotion and a failed
//!   promotion, `Demote` comes before the `Release`, so the old leader has
//!   stopped consuming when a standby can take over.
//! - **No leaked lease.** A grant or renewal that arrives after the machine
//!   no longer wants it is released; the renew-less fallback (release, then
//!   acquire again) replaces its token rather than keeping two.

use core::fmt;
use core::time::Duration;

use heapless::Deque;

use super::Lease;
#[cfg(doc)]
use crate::lock::{LeaseRenewer, Locker};
use crate::lock::{Renewal, Token, Ttl, UnlockError};
use crate::time::Instant;

/// Why the leader stops acting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum DemoteReason {
    /// A renewal said the lease is gone (expired, or another token holds
    /// it); the lease is not released (it may belong to someone else now).
    LeaseLost,
    /// A renewal failed at the backend (unreachable, an error reply): the
    /// lease may still be ours, but that cannot be known, so the leader
    /// stops acting as if it were lost (the original's rule). It is not
    /// released; it expires on the server.
    RenewFailed,
    /// No renewal succeeded before the renew deadline.
    RenewDeadline,
    /// The promotion callback failed.
    PromoteFailed,
    /// The consumer asked to step down ([`ActiveGuard::demote`]).
    Requested,
    /// The guard is stopping.
    Stopping,
}

/// What the runtime must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Action {
    /// `try_lock(key, ttl)`; report with [`ActiveGuard::handle_acquired`].
    Acquire,
    /// `renew(key, token, ttl)`; report with [`ActiveGuard::handle_renewed`].
    Renew(Token),
    /// `unlock(key, token)`; report with [`ActiveGuard::handle_released`].
    Release(Token),
    /// Start consuming: this replica leads with this fence. Report a
    /// failure to start with [`ActiveGuard::handle_promote_failed`].
    Promote {
        /// The fencing number of the lease.
        fence: u64,
    },
    /// Stop consuming.
    Demote(DemoteReason),
}

/// The coarse state, for logs and gauges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Phase {
    /// Not leading; trying to acquire every interval.
    Standby,
    /// Promoted and holding the lease.
    Leader,
    /// Stop requested; finishing the hand-over.
    Stopping,
    /// Done: nothing more will be emitted.
    Stopped,
}

/// Parameters of an [`ActiveGuard`].
///
/// Defaults follow the original: a 15 s lease and an interval of ttl / 3
/// (5 s) for both renewing and standby polls. Setting the TTL lowers the
/// interval to ttl / 3 if it was larger (it is not raised); setting the
/// interval clamps it to ttl / 3. The result does not depend on the order
/// of the calls. The drift margin defaults to ttl / 10.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ActiveConfig {
    ttl: Ttl,
    interval: Duration,
    drift: Option<Duration>,
}

impl Default for ActiveConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// The original's lease length.
pub const DEFAULT_ACTIVE_TTL: Duration = Duration::from_secs(15);

impl ActiveConfig {
    /// A 15 s lease renewed every 5 s.
    pub const fn new() -> Self {
        ActiveConfig {
            ttl: Ttl::from_valid(DEFAULT_ACTIVE_TTL),
            interval: Duration::from_secs(5),
            drift: None,
        }
    }

    /// The lease length; lowers the interval to ttl / 3 if it was larger.
    pub const fn with_ttl(mut self, ttl: Ttl) -> Self {
        self.ttl = ttl;
        let cap = third(ttl);
        if self.interval.is_zero() || self.interval.as_nanos() > cap.as_nanos() {
            self.interval = cap;
        }
        self
    }

    /// The renew and standby poll interval, clamped to ttl / 3; zero is
    /// ignored.
    pub const fn with_interval(mut self, interval: Duration) -> Self {
        if interval.is_zero() {
            return self;
        }
        let cap = third(self.ttl);
        self.interval = if interval.as_nanos() > cap.as_nanos() {
            cap
        } else {
            interval
        };
        self
    }

    /// How much earlier than `ttl` after sending a renewal the leader gives
    /// up: the most the clocks of the replica and the lock service may
    /// drift apart over one lease, plus scheduling slack. With a
    /// replicated lock service whose expiries are absolute (Redis), add
    /// the largest skew between its nodes' clocks: after a failover, or a
    /// step of the serving node's clock, a lease ends that much earlier
    /// (the spin model in `sim/spin` shows the margin must cover both).
    pub const fn with_drift(mut self, drift: Duration) -> Self {
        self.drift = Some(drift);
        self
    }

    /// The lease length.
    pub const fn ttl(&self) -> Ttl {
        self.ttl
    }

    /// The renew and poll interval.
    pub const fn interval(&self) -> Duration {
        self.interval
    }

    /// The drift margin.
    pub const fn drift(&self) -> Duration {
        match self.drift {
            Some(d) => d,
            None => {
                Duration::from_nanos(crate::time::nanos_saturating(self.ttl.as_duration()) / 10)
            }
        }
    }

    /// How long after sending a successful acquire or renew the leader may
    /// act: `ttl - drift`.
    pub const fn renew_deadline(&self) -> Duration {
        self.ttl.as_duration().saturating_sub(self.drift())
    }

    /// Checks that a renewal can happen before the deadline
    /// (`drift < ttl` and `interval < ttl - drift`) and returns the timing
    /// as validated: the only way to an [`ActiveTiming`].
    pub const fn validate(&self) -> Result<ActiveTiming, ActiveConfigError> {
        if self.drift().as_nanos() >= self.ttl.as_duration().as_nanos() {
            return Err(ActiveConfigError::DriftNotBelowTtl);
        }
        if self.interval.as_nanos() >= self.renew_deadline().as_nanos() {
            return Err(ActiveConfigError::IntervalNotBelowDeadline);
        }
        Ok(ActiveTiming { config: *self })
    }
}

/// An [`ActiveConfig`] that passed [`ActiveConfig::validate`]: a renewal
/// can happen before the renew deadline. Validated once, where the
/// settings are given; an [`ActiveGuard`] built from it cannot fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ActiveTiming {
    config: ActiveConfig,
}

// The defaults are valid, so `ActiveTiming::new` needs no check at run time.
const _: () = assert!(ActiveConfig::new().validate().is_ok());

impl Default for ActiveTiming {
    fn default() -> Self {
        Self::new()
    }
}

impl ActiveTiming {
    /// The defaults of [`ActiveConfig::new`] (a 15 s lease renewed every
    /// 5 s, 1.5 s drift), valid by construction.
    pub const fn new() -> Self {
        ActiveTiming {
            config: ActiveConfig::new(),
        }
    }

    /// The settings it was validated from.
    pub const fn config(&self) -> &ActiveConfig {
        &self.config
    }

    /// The lease length.
    pub const fn ttl(&self) -> Ttl {
        self.config.ttl()
    }

    /// The renew and poll interval.
    pub const fn interval(&self) -> Duration {
        self.config.interval()
    }

    /// The drift margin.
    pub const fn drift(&self) -> Duration {
        self.config.drift()
    }

    /// How long after sending a successful acquire or renew the leader may
    /// act: `ttl - drift`, longer than the interval.
    pub const fn renew_deadline(&self) -> Duration {
        self.config.renew_deadline()
    }
}

impl TryFrom<ActiveConfig> for ActiveTiming {
    type Error = ActiveConfigError;

    /// [`ActiveConfig::validate`].
    fn try_from(config: ActiveConfig) -> Result<Self, Self::Error> {
        config.validate()
    }
}

impl From<ActiveTiming> for ActiveConfig {
    fn from(timing: ActiveTiming) -> Self {
        timing.config
    }
}

const fn third(ttl: Ttl) -> Duration {
    Duration::from_nanos(crate::time::nanos_saturating(ttl.as_duration()) / 3)
}

/// An [`ActiveConfig`] whose timing cannot work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ActiveConfigError {
    /// The drift margin must be shorter than the TTL.
    DriftNotBelowTtl,
    /// The interval must be shorter than `ttl - drift`, or the leader would
    /// demote before its first renewal.
    IntervalNotBelowDeadline,
}

impl fmt::Display for ActiveConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ActiveConfigError::DriftNotBelowTtl => {
                "active guard drift must be shorter than its ttl"
            }
            ActiveConfigError::IntervalNotBelowDeadline => {
                "active guard interval must be shorter than ttl - drift"
            }
        })
    }
}

impl core::error::Error for ActiveConfigError {}

/// What a release is for, which decides what follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
enum ReleaseFor {
    /// Stop, explicit demotion, failed promotion: then standby (or stopped).
    Handover,
    /// The renew-less fallback: then acquire again.
    Cycle,
    /// A grant nobody wants any more: nothing follows.
    Unwanted,
}

/// The one backend operation in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
enum InFlight {
    Acquire { sent_at: Instant, reacquire: bool },
    Renew { sent_at: Instant, token: Token },
    Release { purpose: ReleaseFor },
}

/// Outcome of an acquisition, as the runtime reports it; built from
/// [`Locker::try_lock`]'s result with [`From`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Acquired {
    /// Granted with this token.
    Granted(Token),
    /// Held by another replica.
    Held,
    /// The backend failed (the runtime logs the error).
    Failed,
}

impl<E> From<Result<Option<Token>, E>> for Acquired {
    /// `Ok(Some(token))` is [`Granted`](Acquired::Granted), `Ok(None)`
    /// [`Held`](Acquired::Held), an error [`Failed`](Acquired::Failed).
    fn from(result: Result<Option<Token>, E>) -> Self {
        match result {
            Ok(Some(token)) => Acquired::Granted(token),
            Ok(None) => Acquired::Held,
            Err(_) => Acquired::Failed,
        }
    }
}

/// Outcome of a renewal, as the runtime reports it; built from
/// [`LeaseRenewer::renew`]'s result with [`From`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Renewed {
    /// Still ours.
    Held,
    /// Gone or held by another token.
    Lost,
    /// The backend failed: the leader demotes as if the lease were lost,
    /// as in the original, and says so ([`DemoteReason::RenewFailed`]).
    Failed,
}

impl<E> From<Result<Renewal, E>> for Renewed {
    /// [`Renewal::Held`] is [`Held`](Renewed::Held), [`Renewal::Lost`]
    /// [`Lost`](Renewed::Lost), an error [`Failed`](Renewed::Failed).
    fn from(result: Result<Renewal, E>) -> Self {
        match result {
            Ok(Renewal::Held) => Renewed::Held,
            Ok(Renewal::Lost) => Renewed::Lost,
            Err(_) => Renewed::Failed,
        }
    }
}

/// The result of the one backend operation in flight, as
/// [`ActiveGuard::handle`] takes it. A runtime builds it from what its
/// locker returned (logging an error first, if it logs):
///
/// | action              | locker result                          | `Done`                               |
/// |---------------------|----------------------------------------|--------------------------------------|
/// | [`Action::Acquire`] | `try_lock`: `Ok(Some(token))`          | `Acquired(Acquired::Granted(token))` |
/// |                     | `Ok(None)`                             | `Acquired(Acquired::Held)`           |
/// |                     | `Err(_)`                               | `Acquired(Acquired::Failed)`         |
/// | [`Action::Renew`]   | `renew`: `Ok(Renewal::Held)`           | `Renewed(Renewed::Held)`             |
/// |                     | `Ok(Renewal::Lost)`                    | `Renewed(Renewed::Lost)`             |
/// |                     | `Err(_)`                               | `Renewed(Renewed::Failed)`           |
/// | [`Action::Release`] | `unlock`: `Ok(())`                     | `Released(true)`                     |
/// |                     | `Err(NotHeld)` or `Err(Backend(_))`    | `Released(false)`                    |
///
/// A call the runtime gave up on (a time-out) counts as failed:
/// `Acquired::Failed`, `Renewed::Failed`, `Released(false)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Done {
    /// An [`Action::Acquire`] finished; see [`ActiveGuard::handle_acquired`].
    Acquired(Acquired),
    /// An [`Action::Renew`] finished; see [`ActiveGuard::handle_renewed`].
    Renewed(Renewed),
    /// An [`Action::Release`] finished: whether the lease was released;
    /// see [`ActiveGuard::handle_released`].
    Released(bool),
}

impl Done {
    /// The result of [`Locker::try_lock`] for an [`Action::Acquire`].
    pub fn acquired<E>(result: Result<Option<Token>, E>) -> Self {
        Done::Acquired(result.into())
    }

    /// The result of [`LeaseRenewer::renew`] for an [`Action::Renew`].
    pub fn renewed<E>(result: Result<Renewal, E>) -> Self {
        Done::Renewed(result.into())
    }

    /// The result of [`Locker::unlock`] for an [`Action::Release`]: released
    /// only if `Ok` (a lease not held, or a backend failure, is not).
    pub fn released<E>(result: Result<(), UnlockError<E>>) -> Self {
        Done::Released(result.is_ok())
    }
}

impl From<Acquired> for Done {
    fn from(result: Acquired) -> Self {
        Done::Acquired(result)
    }
}

impl From<Renewed> for Done {
    fn from(result: Renewed) -> Self {
        Done::Renewed(result)
    }
}

/// One replica's side of single-active election; see the module notes.
#[derive(Clone, Debug)]
pub struct ActiveGuard {
    timing: ActiveTiming,
    renewable: bool,
    /// The lease token held; `None` between the release and the re-acquire
    /// of the renew-less fallback.
    token: Option<Token>,
    /// Promoted: `Promote` emitted and no `Demote` since.
    promoted: bool,
    /// While promoted: the fence of the newest grant of this leadership
    /// (the renew-less fallback's re-acquisitions raise it).
    leader_fence: u64,
    /// While promoted: the renew deadline, send time of the last successful
    /// acquire or renew + ttl - drift. It belongs to the leadership, not to
    /// the token, so it also bounds the renew-less fallback's window.
    act_until: Option<Instant>,
    in_flight: Option<InFlight>,
    /// Release the token as soon as nothing is in flight.
    release_when_idle: bool,
    next_attempt: Instant,
    stopping: bool,
    stopped: bool,
    /// At most: one backend operation, one Promote or Demote, and one more
    /// Demote + Release pair from a stop; eight is ample.
    actions: Deque<Action, 8>,
}

impl ActiveGuard {
    /// A standby that tries to acquire at once (at `now`). `renewable`
    /// says whether the locker can renew in place; without it the leader
    /// releases and re-acquires each interval (a takeover window, as in the
    /// original).
    ///
    /// `timing` is an [`ActiveTiming`], validated already: the error type
    /// is then [`Infallible`](core::convert::Infallible), so
    /// `let Ok(guard) = ActiveGuard::new(timing, renewable, now);` needs
    /// no other arm. An [`ActiveConfig`] is validated here
    /// ([`ActiveConfigError`] if its timing cannot work).
    pub fn new<T: TryInto<ActiveTiming>>(
        timing: T,
        renewable: bool,
        now: Instant,
    ) -> Result<Self, T::Error> {
        Ok(ActiveGuard {
            timing: timing.try_into()?,
            renewable,
            token: None,
            promoted: false,
            leader_fence: 0,
            act_until: None,
            in_flight: None,
            release_when_idle: false,
            next_attempt: now,
            stopping: false,
            stopped: false,
            actions: Deque::new(),
        })
    }

    /// The parameters.
    pub const fn config(&self) -> &ActiveConfig {
        self.timing.config()
    }

    /// The parameters, as validated.
    pub const fn timing(&self) -> &ActiveTiming {
        &self.timing
    }

    /// Whether this replica should be consuming (promoted, not demoted).
    pub const fn is_active(&self) -> bool {
        self.promoted
    }

    /// The fence of the lease held, if any.
    pub fn fence(&self) -> Option<u64> {
        self.token.map(|t| t.fence())
    }

    /// The lease this replica may act on, if promoted: the fence of its
    /// newest grant and the renew deadline. Runtimes publish it after
    /// every step into a [`SharedLease`](super::SharedLease) that the
    /// consumer checks before every handler call.
    pub fn lease(&self) -> Option<Lease> {
        match self.act_until {
            Some(until) if self.promoted => Some(Lease::new(self.leader_fence, until)),
            _ => None,
        }
    }

    /// The coarse state.
    pub const fn phase(&self) -> Phase {
        if self.stopped {
            Phase::Stopped
        } else if self.stopping {
            Phase::Stopping
        } else if self.promoted {
            Phase::Leader
        } else {
            Phase::Standby
        }
    }

    /// The next action to execute, in order.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When to call [`Self::handle_timeout`] next; `None` when only a
    /// result (or nothing, once stopped) can move the machine.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.stopped {
            return None;
        }
        let attempt = (self.in_flight.is_none() && !self.stopping).then_some(self.next_attempt);
        match (attempt, self.act_until) {
            (Some(a), Some(d)) => Some(a.min(d)),
            (a, d) => a.or(d),
        }
    }

    /// Time has reached `now`: enforce the renew deadline, then start the
    /// next acquire or renew if one is due. Early calls do nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.stopped {
            return;
        }
        if self.act_until.is_some_and(|deadline| now >= deadline) {
            // Stop acting before the server-side lease can have expired:
            // deadline = send time of the last success + ttl - drift. The
            // token is dropped, not released: the backend is not answering,
            // and the lease expires on the server within `drift`.
            self.token = None;
            self.release_when_idle = false;
            self.demote_with(DemoteReason::RenewDeadline);
            self.next_attempt = now.saturating_add(self.timing.interval());
            self.finish_stop_if_idle();
        }
        if self.in_flight.is_some() || self.stopping || now < self.next_attempt {
            return;
        }
        match self.token {
            Some(token) if self.renewable => {
                self.in_flight = Some(InFlight::Renew {
                    sent_at: now,
                    token,
                });
                self.push(Action::Renew(token));
            }
            Some(token) => {
                // Renew-less fallback: release, then acquire again.
                self.token = None;
                self.start_release(token, ReleaseFor::Cycle);
            }
            None => {
                self.in_flight = Some(InFlight::Acquire {
                    sent_at: now,
                    reacquire: false,
                });
                self.push(Action::Acquire);
            }
        }
    }

    /// Reports the result of the backend operation in flight: dispatches
    /// to [`Self::handle_acquired`], [`Self::handle_renewed`] or
    /// [`Self::handle_released`].
    pub fn handle(&mut self, now: Instant, done: Done) {
        match done {
            Done::Acquired(result) => self.handle_acquired(now, result),
            Done::Renewed(result) => self.handle_renewed(now, result),
            Done::Released(released) => self.handle_released(now, released),
        }
    }

    /// Reports the result of an [`Action::Acquire`].
    pub fn handle_acquired(&mut self, now: Instant, result: Acquired) {
        let Some(InFlight::Acquire { sent_at, reacquire }) = self.in_flight else {
            // Not asked for: never keep a grant nobody is waiting for.
            if let Acquired::Granted(token) = result {
                self.release_unwanted(token);
            }
            return;
        };
        self.in_flight = None;
        let deadline = sent_at.saturating_add(self.timing.renew_deadline());
        // A re-acquire continues a leadership that may have ended meanwhile.
        let continues = reacquire && self.promoted;
        match result {
            Acquired::Granted(token) if self.stopping || (reacquire && !self.promoted) => {
                // A re-acquire whose leadership ended while it was in
                // flight (demoted, failed promotion): give the grant back
                // and wait one interval, so a standby goes first.
                self.next_attempt = now.saturating_add(self.timing.interval());
                self.start_release(token, ReleaseFor::Unwanted);
            }
            Acquired::Granted(token) if now >= deadline => {
                // Granted so late that the lease may expire on the server
                // before anything could be done with it: never act on it.
                self.demote_with(DemoteReason::RenewDeadline);
                self.next_attempt = now.saturating_add(self.timing.interval());
                self.start_release(token, ReleaseFor::Unwanted);
            }
            Acquired::Granted(token) => {
                self.token = Some(token);
                self.act_until = Some(deadline);
                self.leader_fence = token.fence();
                self.next_attempt = sent_at.saturating_add(self.timing.interval());
                if !continues {
                    self.promoted = true;
                    self.push(Action::Promote {
                        fence: token.fence(),
                    });
                }
            }
            Acquired::Held | Acquired::Failed => {
                if continues {
                    // Another replica took the key in the renew-less window.
                    self.demote_with(DemoteReason::LeaseLost);
                }
                self.next_attempt = now.saturating_add(self.timing.interval());
            }
        }
        self.after_result();
    }

    /// Reports the result of an [`Action::Renew`].
    pub fn handle_renewed(&mut self, now: Instant, result: Renewed) {
        let Some(InFlight::Renew { sent_at, token }) = self.in_flight else {
            return;
        };
        self.in_flight = None;
        let still_ours = self.token == Some(token);
        let deadline = sent_at.saturating_add(self.timing.renew_deadline());
        match result {
            Renewed::Held if still_ours && self.promoted && now < deadline => {
                self.act_until = Some(deadline);
                self.next_attempt = sent_at.saturating_add(self.timing.interval());
            }
            // Renewed for a leadership that is over (stopped, demoted, or
            // too late to act on): stop acting and give the lease back.
            Renewed::Held => {
                self.demote_with(DemoteReason::RenewDeadline);
                self.token = None;
                self.release_when_idle = false;
                self.next_attempt = now.saturating_add(self.timing.interval());
                self.release_unwanted(token);
            }
            Renewed::Lost | Renewed::Failed => {
                if still_ours {
                    // Lost: demote without releasing, the key may be
                    // someone else's now.
                    self.token = None;
                    self.release_when_idle = false;
                    self.demote_with(if result == Renewed::Lost {
                        DemoteReason::LeaseLost
                    } else {
                        DemoteReason::RenewFailed
                    });
                }
                self.next_attempt = now.saturating_add(self.timing.interval());
            }
        }
        self.after_result();
    }

    /// Reports the result of an [`Action::Release`] (`released` is false
    /// when the unlock failed or found another holder).
    pub fn handle_released(&mut self, now: Instant, released: bool) {
        let Some(InFlight::Release { purpose }) = self.in_flight else {
            return;
        };
        self.in_flight = None;
        match purpose {
            ReleaseFor::Cycle if released && self.promoted && !self.stopping => {
                // Renew-less fallback: the old token is gone; take a new one.
                // The leadership's deadline still runs from the last success.
                self.in_flight = Some(InFlight::Acquire {
                    sent_at: now,
                    reacquire: true,
                });
                self.push(Action::Acquire);
            }
            ReleaseFor::Cycle => {
                if !released {
                    self.demote_with(DemoteReason::LeaseLost);
                }
                self.next_attempt = now.saturating_add(self.timing.interval());
            }
            ReleaseFor::Handover => {
                // Wait one interval so that a standby, not this replica, is
                // the next to acquire.
                self.next_attempt = now.saturating_add(self.timing.interval());
            }
            ReleaseFor::Unwanted => {}
        }
        self.after_result();
    }

    /// Reports that the consumer failed to start after
    /// [`Action::Promote`]: demote, then release the lease.
    pub fn handle_promote_failed(&mut self, _now: Instant) {
        self.step_down(DemoteReason::PromoteFailed);
    }

    /// The consumer asks to step down (its subscription died while the
    /// lease was still renewing): demote first, then release, so a standby
    /// takes over at once. A no-op unless leading.
    pub fn demote(&mut self, _now: Instant) {
        self.step_down(DemoteReason::Requested);
    }

    /// Stops the guard: demote if leading, release the lease, then
    /// [`Phase::Stopped`].
    pub fn stop(&mut self, _now: Instant) {
        if self.stopping || self.stopped {
            return;
        }
        self.stopping = true;
        self.step_down(DemoteReason::Stopping);
        self.finish_stop_if_idle();
    }

    fn step_down(&mut self, reason: DemoteReason) {
        if !self.promoted {
            return;
        }
        self.demote_with(reason);
        if self.token.is_some() {
            self.release_when_idle = true;
            self.flush_pending_release();
        }
    }

    /// Emits `Demote` once per promotion; a demoted replica has no deadline.
    fn demote_with(&mut self, reason: DemoteReason) {
        if self.promoted {
            self.promoted = false;
            self.act_until = None;
            self.push(Action::Demote(reason));
        }
    }

    fn after_result(&mut self) {
        self.flush_pending_release();
        self.finish_stop_if_idle();
    }

    fn flush_pending_release(&mut self) {
        if self.release_when_idle && self.in_flight.is_none() {
            self.release_when_idle = false;
            if let Some(token) = self.token.take() {
                self.start_release(token, ReleaseFor::Handover);
            }
        }
    }

    fn start_release(&mut self, token: Token, purpose: ReleaseFor) {
        self.in_flight = Some(InFlight::Release { purpose });
        self.push(Action::Release(token));
    }

    fn release_unwanted(&mut self, token: Token) {
        if self.in_flight.is_none() {
            self.start_release(token, ReleaseFor::Unwanted);
        }
        // Otherwise the grant is left to expire: one operation at a time.
    }

    fn finish_stop_if_idle(&mut self) {
        if self.stopping
            && self.in_flight.is_none()
            && self.token.is_none()
            && !self.release_when_idle
        {
            self.stopped = true;
        }
    }

    fn push(&mut self, action: Action) {
        // Bounded by construction (see the field); a refused push would
        // mean a runtime that never polls, and the state stays consistent.
        let _ = self.actions.push_back(action);
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for ActiveGuard {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "ActiveGuard {{ phase: {}, fence: {}, next_attempt: {} }}",
            self.phase(),
            self.fence(),
            self.next_attempt
        )
    }
}

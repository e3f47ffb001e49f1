//! Runs guard-core's `ActiveGuard` state machine on embassy-time: one
//! active consumer per key across devices and servers sharing a locker.

use core::future::Future;
use core::time::Duration;

use embassy_futures::select::{Either, Either3, select, select3};
use embassy_sync::blocking_mutex::raw::RawMutex;
use embassy_sync::signal::Signal;
use embassy_time::Timer;
use guard_core::guard::{
    Action, ActiveConfig, ActiveConfigError, ActiveGuard, ActiveTiming, DemoteReason, Done, Phase,
    SharedLease,
};
use guard_core::lock::{LeaseRenewer, Token, Ttl};

use crate::time::{now, to_embassy};

/// The original's limit on a release (and on any backend call once stop
/// was asked).
pub const DEFAULT_RELEASE_TIMEOUT: Duration = Duration::from_secs(3);

/// Stops a running [`ActiveRunner`] or asks its leader to step down; share
/// it by reference (it can live in a `static`).
pub struct ActiveControl<M: RawMutex> {
    stop: Signal<M, ()>,
    demote: Signal<M, ()>,
    lease: SharedLease<M>,
}

impl<M: RawMutex> Default for ActiveControl<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M: RawMutex> ActiveControl<M> {
    /// A control nobody has signalled.
    pub const fn new() -> Self {
        ActiveControl {
            stop: Signal::new(),
            demote: Signal::new(),
            lease: SharedLease::new(),
        }
    }

    /// The fence, if the runner leads and its renew deadline has not
    /// passed on embassy-time's clock; `None` means: do not act. Call it
    /// immediately before every side effect of the leader (handing a
    /// message to its handler, a write): work that was queued across a
    /// stall is refused once the deadline has passed, even before the
    /// runner has demoted.
    pub fn lease_fence(&self) -> Option<u64> {
        self.lease.check(now())
    }

    /// Stops the runner: a leader demotes, then releases.
    pub fn stop(&self) {
        self.stop.signal(());
    }

    /// Asks a leading runner to step down (demote, then release) so a
    /// standby takes over; it keeps running as a standby.
    pub fn demote(&self) {
        self.demote.signal(());
    }
}

/// What interrupted a wait.
enum Heard {
    Timeout,
    Stop,
    Demote,
}

/// One device's single-active consumer for a lease key.
///
/// [`run`](Self::run) calls `on_promoted(fence)` when this device leads
/// (an error there demotes and releases) and `on_demoted(reason)` when it
/// must stop consuming: lease lost, renew deadline passed (even while a
/// renewal hangs), explicit demotion or stop. Each promotion gets at most
/// one demotion. Backend calls are awaited one at a time. The consumer
/// checks [`ActiveControl::lease_fence`] before each side effect;
/// `on_promoted` is not called once the deadline has passed (a stall
/// between the grant and the callback), and that promotion gets no
/// `on_demoted`.
#[derive(Clone, Copy, Debug)]
pub struct ActiveRunner<'k> {
    key: &'k str,
    timing: ActiveTiming,
    release_timeout: Duration,
}

impl<'k> ActiveRunner<'k> {
    /// A runner for lease `key` (from `guard_core::lock::active_key`) with
    /// `settings` (validated here, once).
    pub fn new(key: &'k str, settings: ActiveConfig) -> Result<Self, ActiveConfigError> {
        Ok(ActiveRunner {
            key,
            timing: settings.validate()?,
            release_timeout: DEFAULT_RELEASE_TIMEOUT,
        })
    }

    /// How long backend calls may take once stop was asked.
    pub fn with_release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout;
        self
    }

    /// Runs until `control` stops it (and the hand-over is done or timed
    /// out); see the type's documentation.
    pub async fn run<L, M, P, PF, E, D, DF>(
        &self,
        locker: &L,
        control: &ActiveControl<M>,
        mut on_promoted: P,
        mut on_demoted: D,
    ) where
        L: LeaseRenewer,
        M: RawMutex,
        P: FnMut(u64) -> PF,
        PF: Future<Output = Result<(), E>>,
        D: FnMut(DemoteReason) -> DF,
        DF: Future<Output = ()>,
    {
        let ttl = self.timing.ttl();
        // From validated timing: the error type is `Infallible`.
        let Ok(mut machine) = ActiveGuard::new(self.timing, true, now());
        let mut give_up_at: Option<guard_core::time::Instant> = None;
        // A promotion whose callback was not called (deadline passed
        // first): its demotion is not reported either (callbacks pair up).
        let mut promotion_skipped = false;
        loop {
            // Published after every step, before any callback, so the
            // consumer never acts on a lease the machine dropped.
            control.lease.publish(machine.lease());
            while let Some(action) = machine.poll_action() {
                let op = match action {
                    Action::Promote { .. }
                        if machine.lease().and_then(|l| l.valid_at(now())).is_none() =>
                    {
                        // Woken past the deadline between the grant and
                        // this call: never start acting late.
                        promotion_skipped = true;
                        machine.handle_timeout(now());
                        control.lease.publish(machine.lease());
                        continue;
                    }
                    Action::Promote { fence } => {
                        if on_promoted(fence).await.is_err() {
                            machine.handle_promote_failed(now());
                            control.lease.publish(machine.lease());
                        }
                        continue;
                    }
                    Action::Demote(_) if promotion_skipped => {
                        promotion_skipped = false;
                        continue;
                    }
                    Action::Demote(reason) => {
                        control.lease.publish(None);
                        on_demoted(reason).await;
                        continue;
                    }
                    Action::Acquire => Op::Acquire,
                    Action::Renew(token) => Op::Renew(token),
                    Action::Release(token) => Op::Release(token),
                };
                let call = call(locker, self.key, ttl, op);
                let Some(done) = self
                    .drive(
                        call,
                        &mut machine,
                        control,
                        &mut on_demoted,
                        &mut give_up_at,
                    )
                    .await
                else {
                    return; // stop asked and the backend did not answer in time
                };
                machine.handle(now(), done);
                control.lease.publish(machine.lease());
            }
            if machine.phase() == Phase::Stopped {
                return;
            }
            let heard = self.wait(&machine, control, give_up_at).await;
            if !self.take(heard, &mut machine, control, &mut give_up_at) {
                return;
            }
        }
    }

    /// Feeds what was heard to the machine; false when it is time to give
    /// up (stop was asked and the release timeout has passed).
    fn take<M: RawMutex>(
        &self,
        heard: Heard,
        machine: &mut ActiveGuard,
        control: &ActiveControl<M>,
        give_up_at: &mut Option<guard_core::time::Instant>,
    ) -> bool {
        match heard {
            Heard::Timeout if give_up_at.is_some_and(|g| now() >= g) => return false,
            Heard::Timeout => machine.handle_timeout(now()),
            Heard::Stop => {
                *give_up_at = Some(now().saturating_add(self.release_timeout));
                machine.stop(now());
            }
            Heard::Demote => machine.demote(now()),
        }
        control.lease.publish(machine.lease());
        true
    }

    /// Waits for the machine's next deadline, the give-up time or a
    /// command.
    async fn wait<M: RawMutex>(
        &self,
        machine: &ActiveGuard,
        control: &ActiveControl<M>,
        give_up_at: Option<guard_core::time::Instant>,
    ) -> Heard {
        let deadline = match (machine.poll_timeout(), give_up_at) {
            (Some(t), Some(g)) => Some(t.min(g)),
            (t, g) => t.or(g),
        };
        let timer = async {
            match deadline {
                Some(at) => Timer::at(to_embassy(at)).await,
                None => core::future::pending().await,
            }
        };
        let stop = async {
            if give_up_at.is_some() {
                // Stop was heard already.
                core::future::pending::<()>().await;
            }
            control.stop.wait().await;
        };
        match select3(timer, stop, control.demote.wait()).await {
            Either3::First(()) => Heard::Timeout,
            Either3::Second(()) => Heard::Stop,
            Either3::Third(()) => Heard::Demote,
        }
    }

    /// Awaits one backend call while still serving the machine's
    /// deadlines and the commands: a renew deadline passing during a hung
    /// renewal demotes at once. `None` if stop was asked and the call did
    /// not finish within the release timeout.
    async fn drive<M, D, DF>(
        &self,
        call: impl Future<Output = Done>,
        machine: &mut ActiveGuard,
        control: &ActiveControl<M>,
        on_demoted: &mut D,
        give_up_at: &mut Option<guard_core::time::Instant>,
    ) -> Option<Done>
    where
        M: RawMutex,
        D: FnMut(DemoteReason) -> DF,
        DF: Future<Output = ()>,
    {
        let mut call = core::pin::pin!(call);
        loop {
            let heard = match select(call.as_mut(), self.wait(machine, control, *give_up_at)).await
            {
                Either::First(done) => return Some(done),
                Either::Second(heard) => heard,
            };
            if !self.take(heard, machine, control, give_up_at) {
                return None;
            }
            // With a call in flight the machine asks for no other call;
            // it may demote (deadline passed, stop, request).
            while let Some(action) = machine.poll_action() {
                if let Action::Demote(reason) = action {
                    on_demoted(reason).await;
                }
            }
        }
    }
}

/// A backend call the machine asked for.
enum Op {
    Acquire,
    Renew(Token),
    Release(Token),
}

/// Makes the call; guard-core maps its result to the machine's input.
async fn call<L: LeaseRenewer>(locker: &L, key: &str, ttl: Ttl, op: Op) -> Done {
    match op {
        Op::Acquire => Done::acquired(locker.try_lock(key, ttl).await),
        Op::Renew(token) => Done::renewed(locker.renew(key, &token, ttl).await),
        Op::Release(token) => Done::released(locker.unlock(key, &token).await),
    }
}

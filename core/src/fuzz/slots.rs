//! A slot job's handler under `OnceGuard`, on two replicas with skewed
//! clocks and a simulated locker, along fuzzer-chosen steps.

use core::cell::{Cell, RefCell};
use core::fmt::Write as _;
use core::future::Future;
use core::pin::pin;
use core::task::{Context, Poll, Waker};
use core::time::Duration;

use heapless::{String, Vec};

use super::Violation;
use crate::guard::OnceGuard;
use crate::lock::{Locker, MAX_KEY_LEN, Scope, Token, TokenId, Ttl, UnlockError};
use crate::slot::{Every, SlotTimer, UnixMillis};
use crate::time::Instant;

/// One thing that happens in a [`SlotHarness`] run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, arbitrary::Arbitrary)]
pub enum SlotStep {
    /// Time passes by this many 16ths of the slot period (up to about
    /// sixteen periods).
    Wait(u8),
    /// Replica 0 (`false`) or 1 (`true`) wakes: if its slot timer is due,
    /// it claims the slot through `OnceGuard` and runs your handler if
    /// allowed.
    Fire(bool),
    /// The locker forgets every claim (a failover that lost them: a slot
    /// may then run again, the documented limit).
    LockerForgets,
}

/// How the two replicas and their claims are set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, arbitrary::Arbitrary)]
pub struct SlotSetup {
    /// The schedule.
    pub every: Every,
    /// How long a slot's claim is kept (the slot key's retention).
    pub key_ttl: Ttl,
    /// How far replica 1's wall clock is ahead of replica 0's, in ms.
    pub skew_ms: u16,
}

/// Your code, as a slot's job.
pub trait SlotHandler {
    /// Replica `replica` runs slot `slot_ms` (Unix ms) with the claim's
    /// `fence`.
    fn run(&mut self, replica: usize, slot_ms: u64, fence: Option<u64>);
}

/// What a [`SlotHarness`] run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotReport {
    /// Slots run.
    pub runs: u32,
    /// Claims refused (another replica had the slot).
    pub refused: u32,
}

/// Claims the harness's locker holds at once; more are refused as a
/// backend error (the guard then skips the slot: fail closed).
const CLAIMS: usize = 32;
/// Runs remembered for the at-most-once check.
const RUNS: usize = 256;

/// A locker in memory on the harness's clock.
#[derive(Debug)]
struct SimLocker {
    now: Cell<Instant>,
    claims: RefCell<Vec<(String<MAX_KEY_LEN>, Instant, Token), CLAIMS>>,
    fence: Cell<u64>,
    /// Claims last their TTL divided by this: 1, except where the
    /// harness's own tests break the locker to show a broken promise is
    /// caught.
    shrink: u32,
}

/// The simulated locker's table is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableFull;

impl core::fmt::Display for TableFull {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("the simulated locker holds no more claims")
    }
}

impl Locker for SimLocker {
    type Error = TableFull;

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, TableFull> {
        let now = self.now.get();
        let mut claims = self.claims.borrow_mut();
        claims.retain(|(_, expires, _)| *expires > now);
        if claims.iter().any(|(k, _, _)| k.as_str() == key) {
            return Ok(None);
        }
        let fence = self.fence.get().saturating_add(1);
        self.fence.set(fence);
        let ttl = ttl.as_duration();
        let kept = ttl.checked_div(self.shrink).unwrap_or(ttl);
        let token = Token::new(TokenId(fence.to_le_bytes().repeat_to_16()), fence);
        let mut name = String::new();
        name.push_str(key).map_err(|_| TableFull)?;
        claims
            .push((name, now.saturating_add(kept), token))
            .map_err(|_| TableFull)?;
        Ok(Some(token))
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<TableFull>> {
        let mut claims = self.claims.borrow_mut();
        let before = claims.len();
        claims.retain(|(k, _, t)| !(k.as_str() == key && t == token));
        if claims.len() == before {
            Err(UnlockError::NotHeld)
        } else {
            Ok(())
        }
    }
}

/// Eight bytes twice: a token id from a fence.
trait RepeatTo16 {
    fn repeat_to_16(self) -> [u8; 16];
}

impl RepeatTo16 for [u8; 8] {
    fn repeat_to_16(self) -> [u8; 16] {
        let mut id = [0u8; 16];
        for (slot, byte) in id.iter_mut().zip(self.iter().chain(self.iter())) {
            *slot = *byte;
        }
        id
    }
}

/// Polls a future that never waits (the simulated locker answers at once).
fn ready<F: Future>(future: F) -> Option<F::Output> {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

/// Runs two replicas' slot timers and `OnceGuard` claims with your
/// [`SlotHandler`] as the job; see [`super`].
#[derive(Debug)]
pub struct SlotHarness {
    setup: SlotSetup,
    locker: SimLocker,
}

/// The replicas' shared start: a round Unix time.
const START_MS: u64 = 1_700_000_000_000;

impl SlotHarness {
    /// Two replicas as `setup` says.
    pub fn new(setup: SlotSetup) -> Self {
        SlotHarness {
            setup,
            locker: SimLocker {
                now: Cell::new(Instant::from_secs(1_000)),
                claims: RefCell::new(Vec::new()),
                fence: Cell::new(0),
                shrink: 1,
            },
        }
    }

    fn wall(&self, replica: usize, elapsed: Duration) -> UnixMillis {
        let skew = if replica == 1 {
            u64::from(self.setup.skew_ms)
        } else {
            0
        };
        let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        UnixMillis::from_millis(START_MS.saturating_add(ms).saturating_add(skew))
    }

    /// Runs `steps`; a slot run twice is a [`Violation`] when no
    /// [`SlotStep::LockerForgets`] came between the two runs and the skew
    /// plus how late either replica fired stayed below the key's
    /// retention (the documented bound; beyond it a second run is the
    /// stated limit).
    pub fn run(
        self,
        steps: &[SlotStep],
        handler: &mut impl SlotHandler,
    ) -> Result<SlotReport, Violation> {
        let mut report = SlotReport::default();
        let Ok(scope) = Scope::new("fuzz").and_then(|s| s.segment("job", "slot")) else {
            return Ok(report);
        };
        let guard = OnceGuard::new(Some(&self.locker), scope).with_ttl(self.setup.key_ttl);
        let start = self.locker.now.get();
        let mut timers =
            [0, 1].map(|r| SlotTimer::new(self.setup.every, self.wall(r, Duration::ZERO)));
        // Each run's slot, how late its replica fired, and how many
        // forgets came before it (a forget erases the claims made before
        // it, not those made after).
        let mut ran: Vec<(u64, Duration, u32), RUNS> = Vec::new();
        let skew = Duration::from_millis(u64::from(self.setup.skew_ms));
        let retention = self.setup.key_ttl.as_duration();
        let mut forgets = 0u32;
        for (i, step) in steps.iter().enumerate() {
            let now = self.locker.now.get();
            match *step {
                SlotStep::Wait(n) => {
                    let period = self.setup.every.period();
                    let step = period
                        .saturating_mul(u32::from(n))
                        .checked_div(16)
                        .unwrap_or_default();
                    self.locker.now.set(now.saturating_add(step));
                }
                SlotStep::LockerForgets => {
                    self.locker.claims.borrow_mut().clear();
                    forgets = forgets.saturating_add(1);
                }
                SlotStep::Fire(second) => {
                    let replica = usize::from(second);
                    let wall = self.wall(replica, now.saturating_duration_since(start));
                    let Some(timer) = timers.get_mut(replica) else {
                        continue;
                    };
                    // As a runtime does: fire once the timer's instant came.
                    if timer.next_fire().is_none_or(|due| due > wall) {
                        continue;
                    }
                    let Some(slot) = timer.fire(wall) else {
                        continue;
                    };
                    let mut key: String<20> = String::new();
                    // A u64 fits in 20 digits.
                    let _ = write!(key, "{}", slot.as_millis());
                    let Some(Ok(outcome)) = ready(guard.allow(&key)) else {
                        continue;
                    };
                    if !outcome.is_allowed() {
                        report.refused = report.refused.saturating_add(1);
                        continue;
                    }
                    // The documented bound (README, "each slot's job runs
                    // at most once"): skew + lateness + claim latency below
                    // the retention. Timers here fire when due (never
                    // early) and claims take no time, so two claims of a
                    // slot are at most skew + the later firing's lateness
                    // apart, and within the bound the first claim is live.
                    let late = wall.saturating_duration_since(slot);
                    let twice = ran
                        .iter()
                        .find(|(s, _, before)| *s == slot.as_millis() && *before == forgets);
                    if let Some((_, first_late, _)) = twice {
                        let apart = skew.saturating_add(late.max(*first_late));
                        if apart < retention {
                            return Err(Violation::SlotTwice {
                                step: i,
                                slot_ms: slot.as_millis(),
                            });
                        }
                    }
                    // Past RUNS remembered runs the check covers the first.
                    let _ = ran.push((slot.as_millis(), late, forgets));
                    report.runs = report.runs.saturating_add(1);
                    handler.run(replica, slot.as_millis(), outcome.fence());
                }
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Job;

    impl SlotHandler for Job {
        fn run(&mut self, _replica: usize, _slot_ms: u64, _fence: Option<u64>) {}
    }

    fn setup() -> SlotSetup {
        SlotSetup {
            every: Every::new(Duration::from_millis(100)).unwrap(),
            key_ttl: Ttl::from_millis(500).unwrap(),
            skew_ms: 40,
        }
    }

    /// Replica 1 (40 ms ahead) claims the first slot at 100 ms, replica 0
    /// tries 6.25 ms later: skew + lateness 80 ms, below the 500 ms
    /// retention.
    const STEPS: [SlotStep; 4] = [
        SlotStep::Wait(16),
        SlotStep::Fire(true),
        SlotStep::Wait(1),
        SlotStep::Fire(false),
    ];

    #[test]
    fn within_the_bound_the_second_claim_is_refused() {
        let report = SlotHarness::new(setup()).run(&STEPS, &mut Job).unwrap();
        assert_eq!((report.runs, report.refused), (1, 1));
    }

    #[test]
    fn a_locker_that_keeps_claims_for_a_hundredth_of_their_ttl_is_caught() {
        let mut broken = SlotHarness::new(setup());
        broken.locker.shrink = 100;
        assert_eq!(
            broken.run(&STEPS, &mut Job),
            Err(Violation::SlotTwice {
                step: 3,
                slot_ms: START_MS + 100
            })
        );
    }

    #[test]
    fn a_forget_excuses_the_claims_it_erased_not_later_ones() {
        use SlotStep::*;
        let mut broken = SlotHarness::new(setup());
        broken.locker.shrink = 100;
        // The first slot runs twice across a forget (the stated limit);
        // the second slot, claimed after it, is still held to the bound.
        let steps = [
            Wait(16),
            Fire(true),
            LockerForgets,
            Wait(1),
            Fire(false),
            Wait(15),
            Fire(true),
            Wait(1),
            Fire(false),
        ];
        assert_eq!(
            broken.run(&steps, &mut Job),
            Err(Violation::SlotTwice {
                step: 8,
                slot_ms: START_MS + 200
            })
        );
    }
}

//! Runs a job once per planned slot across devices and servers sharing a
//! locker: each device's slot timer fires, and guard-core's `OnceGuard`
//! lets one of them run the slot.

use core::fmt::Write as _;
use core::future::Future;

use embassy_futures::select::{Either, select};
use embassy_sync::blocking_mutex::raw::RawMutex;
use embassy_sync::signal::Signal;
use embassy_time::Timer;
use guard_core::guard::{OnceGuard, OnceObserver};
use guard_core::lock::{KeyError, Locker};
use guard_core::slot::{Schedule, SlotTimer, UnixMillis};

use crate::time::duration_to_embassy;

/// What a slot run is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SlotRun {
    /// The planned slot (Unix milliseconds), the same on every device.
    pub slot: UnixMillis,
    /// The claim's fence (none without a locker or when failing open).
    pub fence: Option<u64>,
}

/// Runs `job` for each slot of `schedule` that `guard` allows, until
/// `stop` is signalled. `wall` reads the wall clock (from NTP, an RTC or
/// the network), since slots are wall-clock times shared by every device;
/// the wait until a slot runs on embassy-time. A slot is claimed under its
/// Unix milliseconds as the key, as guard-smol's scheduler does, so an MCU
/// and a server running the same schedule in the same scope share slots.
///
/// Returns how many slots this device ran, or the key error of a scope
/// that leaves no room for a slot key (at the first slot).
pub async fn run_slots<L, O, S, M, W, J, F>(
    guard: &OnceGuard<'_, L, O>,
    schedule: S,
    wall: W,
    stop: &Signal<M, ()>,
    mut job: J,
) -> Result<u64, KeyError>
where
    L: Locker + ?Sized,
    O: OnceObserver,
    S: Schedule,
    M: RawMutex,
    W: Fn() -> UnixMillis,
    J: FnMut(SlotRun) -> F,
    F: Future<Output = ()>,
{
    let mut timer = SlotTimer::new(schedule, wall());
    let mut ran = 0u64;
    while let Some(due) = timer.next_fire() {
        let wait = due.saturating_duration_since(wall());
        let sleep = Timer::after(duration_to_embassy(wait));
        if let Either::Second(()) = select(sleep, stop.wait()).await {
            return Ok(ran);
        }
        let Some(slot) = timer.fire(wall()) else {
            continue; // woke early (a clock step): wait again
        };
        let mut key = heapless::String::<20>::new();
        // u64 fits 20 digits: this cannot fail.
        write!(key, "{}", slot.as_millis()).ok();
        let outcome = guard.allow(&key).await?;
        if outcome.is_allowed() {
            ran = ran.saturating_add(1);
            job(SlotRun {
                slot,
                fence: outcome.fence(),
            })
            .await;
        }
    }
    Ok(ran)
}

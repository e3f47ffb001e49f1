//! The windows a closed breaker judges its calls over: the last `N` calls,
//! or the calls of the last `N` seconds.

use super::snapshot::{InvalidSnapshot, SnapshotReader, SnapshotWriter, WindowSnapshot};
use crate::time::Instant;

/// Calls counted together: how many, how many failed, how many were slow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Tally {
    /// Calls recorded.
    pub calls: u32,
    /// Of them, failures.
    pub failures: u32,
    /// Of them, slow calls (failed or not).
    pub slow: u32,
}

impl Tally {
    /// This tally with one more call.
    pub(crate) const fn with(self, failed: bool, slow: bool) -> Tally {
        Tally {
            calls: self.calls.saturating_add(1),
            failures: self.failures.saturating_add(failed as u32),
            slow: self.slow.saturating_add(slow as u32),
        }
    }

    /// This tally without one call it holds.
    const fn without(self, failed: bool, slow: bool) -> Tally {
        Tally {
            calls: self.calls.saturating_sub(1),
            failures: self.failures.saturating_sub(failed as u32),
            slow: self.slow.saturating_sub(slow as u32),
        }
    }

    const fn plus(self, other: Tally) -> Tally {
        Tally {
            calls: self.calls.saturating_add(other.calls),
            failures: self.failures.saturating_add(other.failures),
            slow: self.slow.saturating_add(other.slow),
        }
    }
}

/// Where a closed breaker records its calls. Implemented by
/// [`CountWindow`] and [`TimeWindow`].
pub trait CallWindow {
    /// Records a call that ended at `now`.
    fn record(&mut self, now: Instant, failed: bool, slow: bool);
    /// The calls the window holds at `now`.
    fn tally(&mut self, now: Instant) -> Tally;
    /// Forgets every call.
    fn clear(&mut self);
    /// The most calls the window can judge over, if it is bounded by a
    /// count (a breaker never waits for more calls than that).
    fn capacity(&self) -> Option<u32>;
}

/// The last `N` calls (Resilience4j's count-based window): a ring of one
/// byte a call, with its tally kept as calls come and go.
#[derive(Clone, Debug)]
pub struct CountWindow<const N: usize> {
    /// Bit 0: failed; bit 1: slow; bit 7: a call is there.
    ring: [u8; N],
    next: usize,
    tally: Tally,
}

const FAILED: u8 = 1;
const SLOW: u8 = 2;
const PRESENT: u8 = 0x80;

impl<const N: usize> CountWindow<N> {
    /// An empty window of the last `N` calls. `N` must be positive.
    pub const fn new() -> Self {
        const { assert!(N > 0, "a window of no calls judges nothing") };
        CountWindow {
            ring: [0; N],
            next: 0,
            tally: Tally {
                calls: 0,
                failures: 0,
                slow: 0,
            },
        }
    }
}

impl<const N: usize> Default for CountWindow<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> CallWindow for CountWindow<N> {
    fn record(&mut self, _now: Instant, failed: bool, slow: bool) {
        let Some(slot) = self.ring.get_mut(self.next) else {
            return;
        };
        if *slot & PRESENT != 0 {
            self.tally = self.tally.without(*slot & FAILED != 0, *slot & SLOW != 0);
        }
        *slot = PRESENT | if failed { FAILED } else { 0 } | if slow { SLOW } else { 0 };
        self.tally = self.tally.with(failed, slow);
        self.next = self.next.wrapping_add(1).checked_rem(N).unwrap_or(0);
    }

    fn tally(&mut self, _now: Instant) -> Tally {
        self.tally
    }

    fn clear(&mut self) {
        *self = Self::new();
    }

    fn capacity(&self) -> Option<u32> {
        Some(u32::try_from(N).unwrap_or(u32::MAX))
    }
}

/// The calls of the last `N` whole seconds (Resilience4j's time-based
/// window): one tally a second, on the seconds of the readings' clock.
/// At a reading in second `s` it holds the calls of seconds `s - N + 1`
/// to `s`.
#[derive(Clone, Debug)]
pub struct TimeWindow<const N: usize> {
    /// The tally of each second, at index `second % N`, with its second.
    seconds: [(u64, Tally); N],
}

impl<const N: usize> TimeWindow<N> {
    /// An empty window of the last `N` seconds. `N` must be positive.
    pub const fn new() -> Self {
        const { assert!(N > 0, "a window of no seconds judges nothing") };
        TimeWindow {
            // Second u64::MAX is never read: no bucket counts until written.
            seconds: [(
                u64::MAX,
                Tally {
                    calls: 0,
                    failures: 0,
                    slow: 0,
                },
            ); N],
        }
    }

    /// Whether second `second` lies in the window at second `now`.
    const fn holds(second: u64, now: u64) -> bool {
        second <= now && now.saturating_sub(second) < N as u64
    }
}

impl<const N: usize> Default for TimeWindow<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> CallWindow for TimeWindow<N> {
    fn record(&mut self, now: Instant, failed: bool, slow: bool) {
        let second = now.as_nanos() / 1_000_000_000;
        let index = usize::try_from(second.checked_rem(N as u64).unwrap_or(0)).unwrap_or(0);
        if let Some((at, tally)) = self.seconds.get_mut(index) {
            if *at != second {
                // The second a whole window ago: gone.
                *at = second;
                *tally = Tally::default();
            }
            *tally = tally.with(failed, slow);
        }
    }

    fn tally(&mut self, now: Instant) -> Tally {
        let now = now.as_nanos() / 1_000_000_000;
        self.seconds
            .iter()
            .filter(|(second, _)| Self::holds(*second, now))
            .fold(Tally::default(), |sum, (_, tally)| sum.plus(*tally))
    }

    fn clear(&mut self) {
        *self = Self::new();
    }

    fn capacity(&self) -> Option<u32> {
        None
    }
}

/// `N` (u32), the next slot (u32), then the ring, one byte a call; the
/// tally is recomputed from the ring when read.
impl<const N: usize> WindowSnapshot for CountWindow<N> {
    const ENCODED_LEN: usize = 8 + N;

    fn encode(&self, out: &mut SnapshotWriter<'_>) {
        out.u32(u32::try_from(N).unwrap_or(u32::MAX));
        out.u32(u32::try_from(self.next).unwrap_or(u32::MAX));
        out.bytes(&self.ring);
    }

    fn decode(input: &mut SnapshotReader<'_>) -> Result<Self, InvalidSnapshot> {
        if usize::try_from(input.u32()?).ok() != Some(N) {
            return Err(InvalidSnapshot::Field("count window size"));
        }
        let next = usize::try_from(input.u32()?).unwrap_or(usize::MAX);
        if next >= N {
            return Err(InvalidSnapshot::Field("count window position"));
        }
        let mut window = CountWindow::new();
        window.next = next;
        for (slot, &call) in window.ring.iter_mut().zip(input.bytes(N)?) {
            if call & !(PRESENT | FAILED | SLOW) != 0 || (call != 0 && call & PRESENT == 0) {
                return Err(InvalidSnapshot::Field("count window call"));
            }
            *slot = call;
            if call & PRESENT != 0 {
                window.tally = window.tally.with(call & FAILED != 0, call & SLOW != 0);
            }
        }
        Ok(window)
    }
}

/// `N` (u32), then each second's bucket: the second (u64) and its tally.
impl<const N: usize> WindowSnapshot for TimeWindow<N> {
    const ENCODED_LEN: usize = 4 + N * 20;

    fn encode(&self, out: &mut SnapshotWriter<'_>) {
        out.u32(u32::try_from(N).unwrap_or(u32::MAX));
        for (second, tally) in &self.seconds {
            out.u64(*second);
            out.tally(*tally);
        }
    }

    fn decode(input: &mut SnapshotReader<'_>) -> Result<Self, InvalidSnapshot> {
        if usize::try_from(input.u32()?).ok() != Some(N) {
            return Err(InvalidSnapshot::Field("time window size"));
        }
        let mut window = TimeWindow::new();
        for (index, bucket) in window.seconds.iter_mut().enumerate() {
            let second = input.u64()?;
            let tally = input.tally("time window bucket")?;
            // A bucket sits at its second modulo N (or is unwritten).
            let placed = second == u64::MAX
                || usize::try_from(second.checked_rem(N as u64).unwrap_or(0)).ok() == Some(index);
            if !placed {
                return Err(InvalidSnapshot::Field("time window bucket"));
            }
            *bucket = (second, tally);
        }
        Ok(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    #[test]
    fn a_count_window_holds_the_last_n_calls() {
        let mut w = CountWindow::<3>::new();
        let t = Instant::from_secs(1);
        w.record(t, true, false);
        w.record(t, false, true);
        assert_eq!(
            w.tally(t),
            Tally {
                calls: 2,
                failures: 1,
                slow: 1
            }
        );
        w.record(t, false, false);
        w.record(t, false, false); // the first call leaves
        assert_eq!(
            w.tally(t),
            Tally {
                calls: 3,
                failures: 0,
                slow: 1
            }
        );
        w.clear();
        assert_eq!(w.tally(t), Tally::default());
    }

    #[test]
    fn a_time_window_holds_the_calls_of_the_last_n_seconds() {
        let mut w = TimeWindow::<2>::new();
        let t = Instant::from_secs(10);
        w.record(t, true, false);
        w.record(t + Duration::from_millis(999), false, false);
        let next = t + Duration::from_secs(1);
        w.record(next, false, true);
        assert_eq!(
            w.tally(next),
            Tally {
                calls: 3,
                failures: 1,
                slow: 1
            }
        );
        // Second 10 leaves at second 12.
        let later = t + Duration::from_secs(2);
        assert_eq!(
            w.tally(later),
            Tally {
                calls: 1,
                failures: 0,
                slow: 1
            }
        );
        w.record(later, false, false);
        assert_eq!(
            w.tally(later),
            Tally {
                calls: 2,
                failures: 0,
                slow: 1
            }
        );
        // A reading before the calls sees none of the later ones.
        assert_eq!(w.tally(t - Duration::from_secs(5)), Tally::default());
        assert_eq!(w.tally(t + Duration::from_secs(60)), Tally::default());
    }
}

//! Each replica's own clock: an offset and a drift rate from true time.

use guard_core::slot::UnixMillis;
use guard_core::time::Instant;

/// True (simulated) time in nanoseconds since the start of the run.
pub type Nanos = u64;

/// The Unix time at which every run starts (2026-01-01T00:00:00Z), so wall
/// clocks and slots look like real ones.
pub const EPOCH_MS: u64 = 1_767_225_600_000;

/// A replica's clock: `local = true + offset + true * drift_ppm / 1e6`.
///
/// The monotonic reading (what the replica's ActiveGuard and limiters see)
/// and the wall reading (what its slot timer sees) both come from it, so a
/// skewed replica plans slots at the wrong true time and a drifting one
/// measures leases too long or too short, as a real one would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaClock {
    /// Offset from true time, in nanoseconds (positive: ahead).
    pub offset_ns: i64,
    /// Rate error in parts per million (positive: runs fast).
    pub drift_ppm: i64,
}

impl ReplicaClock {
    /// A clock exactly on true time.
    pub const EXACT: ReplicaClock = ReplicaClock {
        offset_ns: 0,
        drift_ppm: 0,
    };

    /// The local reading at true time `t`, in nanoseconds (never negative:
    /// a clock set before the run's start reads zero there).
    pub fn local_ns(&self, t: Nanos) -> u64 {
        let drift = i128::from(t) * i128::from(self.drift_ppm) / 1_000_000;
        let local = i128::from(t) + i128::from(self.offset_ns) + drift;
        u64::try_from(local.max(0)).unwrap_or(u64::MAX)
    }

    /// The monotonic reading: what `Instant` the replica's guard sees. The
    /// offset cancels out of every interval; only the drift matters.
    pub fn monotonic(&self, t: Nanos) -> Instant {
        let drift = i128::from(t) * i128::from(self.drift_ppm) / 1_000_000;
        Instant::from_nanos(u64::try_from(i128::from(t) + drift).unwrap_or(0))
    }

    /// The wall reading, for slots.
    pub fn wall(&self, t: Nanos) -> UnixMillis {
        UnixMillis(EPOCH_MS + self.local_ns(t) / 1_000_000)
    }

    /// The earliest true time at which the monotonic reading reaches `at`
    /// (to schedule a replica's timer in true time).
    pub fn true_time_of_monotonic(&self, at: Instant) -> Nanos {
        let local = u128::from(at.as_nanos());
        let rate = (1_000_000 + i128::from(self.drift_ppm)).max(1) as u128;
        // t * rate / 1e6 >= local  <=>  t >= ceil(local * 1e6 / rate)
        // One nanosecond more absorbs the truncation in `monotonic`.
        u64::try_from((local * 1_000_000).div_ceil(rate) + 1).unwrap_or(u64::MAX)
    }

    /// The earliest true time at which the wall reading reaches `at`.
    pub fn true_time_of_wall(&self, at: UnixMillis) -> Nanos {
        let local =
            i128::from(at.0.saturating_sub(EPOCH_MS)) * 1_000_000 - i128::from(self.offset_ns);
        let rate = (1_000_000 + i128::from(self.drift_ppm)).max(1);
        let t = (local * 1_000_000 + rate - 1).div_euclid(rate) + 1;
        u64::try_from(t.max(0)).unwrap_or(u64::MAX)
    }
}

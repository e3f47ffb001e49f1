//! Clocks: each replica's and each lock-service node's, with an offset and
//! a rate error from true time, disciplined as NTP keeps a real one (or
//! left to drift freely, as a fault).
//!
//! A disciplined clock is corrected every poll interval. A correction
//! steps the wall clock to its target (its bias from true time) give or
//! take a measurement error, so the wall clock may step backwards as well
//! as forwards; between corrections it drifts at its oscillator's rate
//! error plus the slew the discipline applies. The monotonic clock is
//! never stepped: it only slews (its rate changes from one poll interval
//! to the next, always forwards). Every reading is a pure function of true
//! time and the clock's seed, so a timer scheduled in true time stays right
//! whatever corrections come before it fires.

use core::time::Duration;

use guard_core::slot::UnixMillis;
use guard_core::time::Instant;

use crate::rng::Rng;

/// True (simulated) time in nanoseconds since the start of the run.
pub type Nanos = u64;

/// The Unix time at which every run starts (2026-01-01T00:00:00Z), so wall
/// clocks and slots look like real ones.
pub const EPOCH_MS: u64 = 1_767_225_600_000;

const PPM: i128 = 1_000_000;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How a clock is disciplined: NTP-like periodic corrections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockSync {
    /// Time between two corrections (NTP's poll interval).
    pub poll: Duration,
    /// A correction sets the wall clock to its target within plus or minus
    /// this (the error of the offset measurement).
    pub step_error: Duration,
    /// The largest rate change the discipline slews the clocks by, in
    /// parts per million (NTP allows up to 500).
    pub max_slew_ppm: i64,
}

impl ClockSync {
    /// A 64 s poll, corrections within 2 ms and at most 50 ppm of slew: a
    /// clock synchronised over a LAN or a good internet path.
    pub const NTP: ClockSync = ClockSync {
        poll: Duration::from_secs(64),
        step_error: Duration::from_millis(2),
        max_slew_ppm: 50,
    };

    /// How far the wall clock strays from its target at most, with an
    /// oscillator rate error of up to `max_drift_ppm`: the correction's
    /// error plus a whole poll interval (a first one can last up to two) of
    /// drift and slew.
    pub fn wander(&self, max_drift_ppm: i64) -> Duration {
        let rate = u128::from(max_drift_ppm.unsigned_abs() + self.max_slew_ppm.unsigned_abs());
        let drift = 2 * self.poll.as_nanos() * rate / 1_000_000;
        self.step_error + Duration::from_nanos(u64::try_from(drift).unwrap_or(u64::MAX) + 1)
    }
}

/// The part of a clock's life between two corrections (the whole run for
/// a free clock): both readings are linear in true time within it.
#[derive(Clone, Copy, Debug)]
struct Segment {
    /// True time at which it starts.
    start: i128,
    /// Its length (1 for a free clock, which has no end).
    len: i128,
    /// The correction's error: the wall offset at `start` is bias + this.
    step: i128,
    /// The monotonic reading's phase at `start` and at the end, beyond
    /// `true * (1 + drift)`: the slew over the segment is their difference.
    phase: (i128, i128),
    /// Whether another segment follows.
    bounded: bool,
}

/// A clock: `wall = true + offset + error`, `monotonic = true * (1 + drift)
/// + phase`, where a disciplined clock keeps `error` bounded by
/// [`ClockSync::wander`] and a free one lets it grow as `true * drift`.
///
/// The monotonic reading (what a replica's ActiveGuard and limiters see)
/// and the wall reading (what its slot timer sees, and what a lock-service
/// node derives its fences from) both come from it, so a skewed replica
/// plans slots at the wrong true time and a drifting one measures leases
/// too long or too short, as a real one would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    /// Where the discipline steers the wall clock, from true time, in
    /// nanoseconds (positive: ahead); a free clock's initial offset.
    pub offset_ns: i64,
    /// The oscillator's rate error in parts per million (positive: fast).
    pub drift_ppm: i64,
    /// The discipline; `None`: the clock drifts freely. Private: the
    /// values below are derived from it.
    sync: Option<ClockSync>,
    /// Seeds each correction's error and slew.
    seed: u64,
    /// The first correction comes at `phase + poll`.
    phase_ns: u64,
    /// `sync`'s poll, correction error and half the slew a poll allows, in
    /// nanoseconds (zero for a free clock), computed once.
    poll_ns: u64,
    step_ns: u64,
    span_ns: u64,
}

impl Clock {
    /// A free clock exactly on true time.
    pub const EXACT: Clock = Clock::free(0, 0);

    /// A clock that drifts freely from `offset_ns` at `drift_ppm`.
    pub const fn free(offset_ns: i64, drift_ppm: i64) -> Self {
        Clock {
            offset_ns,
            drift_ppm,
            sync: None,
            seed: 0,
            phase_ns: 0,
            poll_ns: 0,
            step_ns: 0,
            span_ns: 0,
        }
    }

    /// A clock steered to `offset_ns` by `sync` (free if `None`); `rng`
    /// draws its corrections' seed and when in the first poll interval
    /// they fall.
    pub fn new(offset_ns: i64, drift_ppm: i64, sync: Option<ClockSync>, rng: &mut Rng) -> Self {
        let seed = rng.next_u64();
        let phase_ns = sync.map_or(0, |s| rng.below(nanos(s.poll)));
        let poll_ns = sync.map_or(0, |s| nanos(s.poll).max(1));
        let span = sync.map_or(0, |s| {
            u128::from(poll_ns) * u128::from(s.max_slew_ppm.unsigned_abs()) / 2_000_000
        });
        Clock {
            offset_ns,
            drift_ppm,
            sync,
            seed,
            phase_ns,
            poll_ns,
            step_ns: sync.map_or(0, |s| nanos(s.step_error)),
            span_ns: u64::try_from(span).unwrap_or(0),
        }
    }

    /// The discipline; `None`: the clock drifts freely.
    pub const fn sync(&self) -> Option<ClockSync> {
        self.sync
    }

    /// A number in `-max..=max` drawn for correction `k` (`salt` tells the
    /// draws of one correction apart): a hash, so any segment is computed
    /// without the ones before it.
    fn noise(&self, k: u64, salt: u64, max: u64) -> i128 {
        let mut rng = Rng::new(self.seed ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt);
        i128::from(rng.signed(i64::try_from(max).unwrap_or(i64::MAX)))
    }

    /// The index of the segment that contains true time `t`.
    fn index(&self, t: u64) -> u64 {
        if self.sync.is_none() || t < self.phase_ns + self.poll_ns {
            0
        } else {
            (t - self.phase_ns) / self.poll_ns
        }
    }

    /// Segment `k`. Its monotonic phase points are each drawn within half
    /// a poll's worth of the largest slew, so the slew between two of them
    /// never exceeds it; the first is zero (the monotonic clock starts at
    /// zero with the run).
    fn segment(&self, k: u64) -> Segment {
        if self.sync.is_none() {
            return Segment {
                start: 0,
                len: 1,
                step: 0,
                phase: (0, 0),
                bounded: false,
            };
        };
        let poll = i128::from(self.poll_ns);
        let phase = i128::from(self.phase_ns);
        let start = if k == 0 {
            0
        } else {
            phase + i128::from(k) * poll
        };
        let end = phase + (i128::from(k) + 1) * poll;
        let point = |k: u64| {
            if k == 0 {
                0
            } else {
                self.noise(k, 2, self.span_ns)
            }
        };
        Segment {
            start,
            len: end - start,
            step: self.noise(k, 1, self.step_ns),
            phase: (point(k), point(k + 1)),
            bounded: true,
        }
    }

    /// The monotonic reading at `t` within `seg`, times `PPM * seg.len`
    /// (exact: its floor is the reading), as `a * t + b`.
    fn monotonic_line(&self, seg: &Segment) -> (i128, i128) {
        let slew = seg.phase.1 - seg.phase.0;
        let a = (PPM + i128::from(self.drift_ppm)) * seg.len + slew * PPM;
        let b = PPM * (seg.phase.0 * seg.len - slew * seg.start);
        (a, b)
    }

    /// The wall reading's line within `seg`, like [`Self::monotonic_line`]:
    /// the wall clock runs at the monotonic clock's rate (one oscillator,
    /// one slew) and a correction steps it to bias + error.
    fn wall_line(&self, seg: &Segment) -> (i128, i128) {
        let slew = seg.phase.1 - seg.phase.0;
        let a = (PPM + i128::from(self.drift_ppm)) * seg.len + slew * PPM;
        let rate = i128::from(self.drift_ppm) * seg.len + slew * PPM;
        let b = (i128::from(self.offset_ns) + seg.step) * PPM * seg.len - seg.start * rate;
        (a, b)
    }

    fn eval((a, b): (i128, i128), seg: &Segment, t: i128) -> i128 {
        (a * t + b).div_euclid(PPM * seg.len)
    }

    /// The earliest `t >= from` with `floor((a t + b) / (PPM len)) >= value`.
    fn solve((a, b): (i128, i128), seg: &Segment, value: i128, from: i128) -> i128 {
        let need = value * PPM * seg.len - b;
        let t = if a > 0 {
            need.div_euclid(a) + i128::from(need.rem_euclid(a) != 0)
        } else {
            from
        };
        t.max(from)
    }

    /// The local wall reading at true time `t`, in nanoseconds since the
    /// run's start (never negative: a clock set before the start reads
    /// zero there).
    pub fn local_ns(&self, t: Nanos) -> u64 {
        let seg = self.segment(self.index(t));
        let local = Self::eval(self.wall_line(&seg), &seg, i128::from(t));
        u64::try_from(local.max(0)).unwrap_or(u64::MAX)
    }

    /// The wall clock's offset from true time at `t`, in nanoseconds.
    pub fn wall_offset_ns(&self, t: Nanos) -> i64 {
        self.wall_and_offset(t).1
    }

    /// The wall reading at `t` and its offset from true time in
    /// nanoseconds, computed once.
    pub fn wall_and_offset(&self, t: Nanos) -> (UnixMillis, i64) {
        let seg = self.segment(self.index(t));
        let local = Self::eval(self.wall_line(&seg), &seg, i128::from(t));
        let offset = i64::try_from(local - i128::from(t)).unwrap_or(i64::MAX);
        let local = u64::try_from(local.max(0)).unwrap_or(u64::MAX);
        (UnixMillis(EPOCH_MS + local / 1_000_000), offset)
    }

    /// The monotonic reading: what `Instant` a replica's guard sees. The
    /// offset cancels out of every interval; only drift and slew matter.
    /// It never goes backwards: within a segment it is a line of positive
    /// slope, and segments meet end to end.
    pub fn monotonic(&self, t: Nanos) -> Instant {
        let seg = self.segment(self.index(t));
        let local = Self::eval(self.monotonic_line(&seg), &seg, i128::from(t));
        Instant::from_nanos(u64::try_from(local.max(0)).unwrap_or(u64::MAX))
    }

    /// The wall reading, for slots.
    pub fn wall(&self, t: Nanos) -> UnixMillis {
        UnixMillis(EPOCH_MS + self.local_ns(t) / 1_000_000)
    }

    /// The wall reading in microseconds since the Unix epoch (what Redis's
    /// `TIME` returns), for fences.
    pub fn wall_micros(&self, t: Nanos) -> u64 {
        Self::micros_of_local(self.local_ns(t))
    }

    /// The Unix time in microseconds of a local wall reading (from
    /// [`Self::local_ns`]).
    pub const fn micros_of_local(local_ns: u64) -> u64 {
        EPOCH_MS * 1_000 + local_ns / 1_000
    }

    /// The earliest true time at which the monotonic reading reaches `at`
    /// (to schedule a replica's timer in true time).
    pub fn true_time_of_monotonic(&self, at: Instant) -> Nanos {
        let value = i128::from(at.as_nanos());
        // Near `at / (1 + drift)`; the phase moves it by less than a
        // segment, so a step or two either way finds the right one.
        let guess = value * PPM / (PPM + i128::from(self.drift_ppm)).max(1);
        let mut k = self.index(u64::try_from(guess.max(0)).unwrap_or(u64::MAX));
        loop {
            let seg = self.segment(k);
            let line = self.monotonic_line(&seg);
            if k > 0 && Self::eval(line, &seg, seg.start) >= value {
                k -= 1;
                continue;
            }
            let end = seg.start + seg.len;
            if seg.bounded && Self::eval(line, &seg, end) < value {
                k += 1;
                continue;
            }
            let t = Self::solve(line, &seg, value, seg.start);
            return u64::try_from(t.max(0)).unwrap_or(u64::MAX);
        }
    }

    /// The earliest true time from `from` on at which the wall reading
    /// reaches `at`. The wall clock may step backwards, so a reading once
    /// reached can come again: only the time after `from` counts.
    pub fn true_time_of_wall(&self, at: UnixMillis, from: Nanos) -> Nanos {
        let value = i128::from(at.0.saturating_sub(EPOCH_MS)) * 1_000_000;
        let mut k = self.index(from);
        loop {
            let seg = self.segment(k);
            let line = self.wall_line(&seg);
            let begin = seg.start.max(i128::from(from));
            let end = seg.start + seg.len;
            // Within a segment the wall clock only rises: if it does not
            // reach `at` before the next correction, look after it.
            if !seg.bounded || Self::eval(line, &seg, end - 1) >= value {
                let t = Self::solve(line, &seg, value, begin);
                return u64::try_from(t).unwrap_or(u64::MAX);
            }
            k += 1;
        }
    }

    /// The wall clock's largest offset from true time over a run of
    /// `duration`: its bias plus [`ClockSync::wander`], or for a free clock
    /// its initial offset plus the drift accumulated by the end.
    pub fn bound(
        max_offset: Duration,
        max_drift_ppm: i64,
        sync: Option<ClockSync>,
        duration: Duration,
    ) -> Duration {
        match sync {
            Some(s) => max_offset + s.wander(max_drift_ppm),
            None => {
                let drift =
                    duration.as_nanos() * u128::from(max_drift_ppm.unsigned_abs()) / 1_000_000;
                max_offset + Duration::from_nanos(u64::try_from(drift).unwrap_or(u64::MAX) + 1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disciplined(seed: u64, offset_ns: i64, drift_ppm: i64) -> Clock {
        Clock::new(
            offset_ns,
            drift_ppm,
            Some(ClockSync::NTP),
            &mut Rng::new(seed),
        )
    }

    const WEEK: u64 = 7 * 86_400 * 1_000_000_000;

    #[test]
    fn a_disciplined_wall_clock_stays_within_its_bound_for_a_week() {
        for seed in 0..8 {
            let clock = disciplined(seed, 40_000_000, if seed % 2 == 0 { 100 } else { -100 });
            let bound = Clock::bound(
                Duration::from_millis(40),
                100,
                Some(ClockSync::NTP),
                Duration::ZERO,
            );
            let mut t = 0;
            while t < WEEK {
                let off = clock.wall_offset_ns(t).unsigned_abs();
                assert!(
                    off <= nanos(bound),
                    "seed {seed} at {t}: offset {off} > {bound:?}"
                );
                t += 7_777_777_777;
            }
        }
    }

    #[test]
    fn a_free_clock_drifts_without_bound() {
        let clock = Clock::free(0, 100);
        assert_eq!(clock.wall_offset_ns(WEEK), (WEEK / 10_000) as i64);
    }

    #[test]
    fn corrections_step_the_wall_clock_both_ways_and_the_monotonic_clock_never_back() {
        // A fast oscillator is mostly stepped back, a slow one forward, a
        // good one either way (its drift per poll is within the error).
        for (drift, both_ways) in [(80, false), (-80, false), (5, true)] {
            let clock = disciplined(3, 0, drift);
            let (mut back, mut forward) = (0, 0);
            let mut last_mono = clock.monotonic(0);
            for k in 1..2_000 {
                let at = clock.segment(k).start as u64;
                let before = clock.local_ns(at - 1);
                let after = clock.local_ns(at);
                if after < before {
                    back += 1;
                } else if after > before + 1 {
                    forward += 1;
                }
                for t in [at - 1, at, at + 1] {
                    let m = clock.monotonic(t);
                    assert!(m >= last_mono, "monotonic went back at {t}");
                    last_mono = m;
                }
            }
            if both_ways {
                assert!(
                    back > 100 && forward > 100,
                    "{back} back, {forward} forward"
                );
            } else {
                assert!(back + forward > 1_900, "{back} back, {forward} forward");
            }
        }
    }

    #[test]
    fn the_monotonic_rate_stays_within_drift_plus_slew() {
        let clock = disciplined(9, 0, 100);
        let ttl = 3_000_000_000;
        let mut t = 0;
        while t < WEEK / 7 {
            let measured = clock.monotonic(t + ttl).as_nanos() - clock.monotonic(t).as_nanos();
            let error = measured.abs_diff(ttl);
            assert!(error <= ttl * 150 / 1_000_000 + 1, "at {t}: {measured}");
            t += 11_111_111_111;
        }
    }

    #[test]
    fn the_inverse_readings_are_the_earliest_instants() {
        for clock in [
            disciplined(5, -3_000_000_000, -90),
            disciplined(6, 500, 100),
            Clock::free(-7, 42),
        ] {
            let mut t = 1_000;
            while t < 3 * 86_400 * 1_000_000_000 {
                let mono = clock.monotonic(t);
                let when = clock.true_time_of_monotonic(mono);
                assert!(
                    when <= t && clock.monotonic(when) >= mono,
                    "monotonic at {t}"
                );
                assert!(
                    when == 0 || clock.monotonic(when - 1) < mono,
                    "monotonic at {t}"
                );

                let wall = UnixMillis(clock.wall(t).0 + 1);
                let from = t.saturating_sub(5_000_000);
                let when = clock.true_time_of_wall(wall, from);
                assert!(when >= from && clock.wall(when) >= wall, "wall at {t}");
                assert!(when == from || clock.wall(when - 1) < wall, "wall at {t}");
                t += 987_654_321_011;
            }
        }
    }
}

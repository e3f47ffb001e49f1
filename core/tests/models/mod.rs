//! Trivially correct reference models and invariant checkers, shared by
//! the property tests and the fuzz targets (which include these files by
//! path). The limiter models speak plain numbers (nanoseconds, booleans)
//! and are written from the original's description, not from guard-core.
#![allow(dead_code, reason = "each user takes the models it needs")]

pub mod active;

/// The original's token bucket in exact integers: `units` is tokens times
/// the refill interval, so refilling is adding elapsed nanoseconds.
pub struct TokenModel {
    capacity_units: u128,
    interval: u128,
    units: u128,
    last: Option<u128>,
}

impl TokenModel {
    pub fn new(capacity: u32, interval: u64) -> Self {
        let capacity_units = u128::from(capacity) * u128::from(interval);
        TokenModel {
            capacity_units,
            interval: interval.into(),
            units: capacity_units,
            last: None,
        }
    }

    pub fn check(&mut self, now: u64) -> bool {
        let now = u128::from(now);
        if let Some(last) = self.last {
            let elapsed = now.saturating_sub(last);
            self.units = (self.units + elapsed).min(self.capacity_units);
        }
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
        if self.units >= self.interval {
            self.units -= self.interval;
            true
        } else {
            false
        }
    }
}

/// The original's meter leaky bucket: water drains, admit if water + 1 fits.
pub struct LeakyModel {
    capacity_units: u128,
    interval: u128,
    water: u128,
    last: Option<u128>,
}

impl LeakyModel {
    pub fn new(capacity: u32, interval: u64) -> Self {
        LeakyModel {
            capacity_units: u128::from(capacity) * u128::from(interval),
            interval: interval.into(),
            water: 0,
            last: None,
        }
    }

    pub fn check(&mut self, now: u64) -> bool {
        let now = u128::from(now);
        if let Some(last) = self.last {
            self.water = self.water.saturating_sub(now.saturating_sub(last));
        }
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
        if self.water + self.interval <= self.capacity_units {
            self.water += self.interval;
            true
        } else {
            false
        }
    }
}

/// A sliding window over the whole history: admit if fewer than `limit`
/// admissions are newer than `now - window`. Like the implementation, a
/// `now` before the newest admission is taken as that admission's instant.
pub struct WindowModel {
    pub window: u128,
    pub limit: usize,
    pub admitted: Vec<u128>,
}

impl WindowModel {
    pub fn check(&mut self, now: u64) -> bool {
        let now = self
            .admitted
            .last()
            .copied()
            .unwrap_or(0)
            .max(u128::from(now));
        let in_window = self
            .admitted
            .iter()
            .filter(|&&a| a + self.window > now)
            .count();
        if in_window < self.limit {
            self.admitted.push(now);
            true
        } else {
            false
        }
    }
}

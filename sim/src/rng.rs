//! The simulator's only source of randomness: SplitMix64 from one seed.

/// A small, fast, seedable generator (SplitMix64). Every random choice of
/// a run draws from one of these, so one seed replays the run exactly.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub const fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            // Multiply-shift: unbiased enough for simulation, no division.
            ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
        }
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo).saturating_add(1))
    }

    /// True with probability `p` (0.0 to 1.0).
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// A signed offset in `-max..=max`.
    pub fn signed(&mut self, max: i64) -> i64 {
        let span = max.unsigned_abs();
        self.between(0, span * 2) as i64 - max.abs()
    }
}

/// FNV-1a over the event log: two runs of one seed give one hash.
#[derive(Clone, Copy, Debug)]
pub struct LogHash(u64);

impl Default for LogHash {
    fn default() -> Self {
        LogHash(0xcbf2_9ce4_8422_2325)
    }
}

impl LogHash {
    /// Mixes `words` into the hash.
    pub fn add(&mut self, words: &[u64]) {
        for &w in words {
            // Byte by byte, little-endian, as FNV-1a is defined; shifts
            // rather than a byte iterator keep unoptimised builds quick.
            let mut shift = 0;
            while shift < 64 {
                self.0 ^= (w >> shift) & 0xff;
                self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
                shift += 8;
            }
        }
    }

    /// The hash so far.
    pub const fn value(&self) -> u64 {
        self.0
    }
}

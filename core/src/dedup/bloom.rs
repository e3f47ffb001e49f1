//! A const-size Bloom filter: no false negatives, bounded false positives.

use core::fmt;
use core::hash::{BuildHasher, Hash};

use super::{CapacityExceeded, Deduplicator, SecretHashState};
use crate::limit::DefaultHashState;
use crate::table::hash_of;
use crate::time::Instant;

const DEFAULT_SEED: u64 = 0x6775_6172_645f_626c; // "guard_bl"

/// The most hash functions a filter uses.
pub const MAX_HASHES: u32 = 32;

/// Bloom parameters that cannot work.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum BloomError {
    /// Expected insertions must be positive.
    ZeroExpectedInsertions,
    /// The false-positive rate must lie strictly between 0 and 1.
    FalsePositiveRateOutOfRange,
    /// The number of hash functions must be in `1..=MAX_HASHES`.
    HashesOutOfRange {
        /// The number asked for.
        hashes: u32,
    },
    /// The filter has fewer bits than the parameters need.
    TooSmall {
        /// Bits needed.
        required_bits: u64,
        /// Bits this filter has (`64 * WORDS`).
        available_bits: u64,
    },
}

impl fmt::Display for BloomError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BloomError::ZeroExpectedInsertions => {
                f.write_str("expected insertions must be positive (got 0)")
            }
            BloomError::FalsePositiveRateOutOfRange => {
                f.write_str("false-positive rate must be greater than 0 and less than 1")
            }
            BloomError::HashesOutOfRange { hashes } => write!(
                f,
                "hash function count must be between 1 and {MAX_HASHES} (got {hashes})"
            ),
            BloomError::TooSmall {
                required_bits,
                available_bits,
            } => write!(
                f,
                "filter has {available_bits} bits but the parameters need {required_bits}"
            ),
        }
    }
}

impl core::error::Error for BloomError {}

/// Bits and hash functions for an expected load and false-positive rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BloomParams {
    /// Bits needed: `ceil(-n ln p / ln² 2)`.
    pub bits: u64,
    /// Hash functions: `round(bits / n · ln 2)`, in `1..=MAX_HASHES`.
    pub hashes: u32,
}

impl BloomParams {
    /// The original's default false-positive rate.
    pub const DEFAULT_FALSE_POSITIVE_RATE: f64 = 0.03;

    /// The classic sizing for `expected` insertions at false-positive rate
    /// `fp_rate` (the original's default rate was 0.03).
    ///
    /// Sizing runs once, off the decision path, so it may use floating
    /// point (soft-float on an FPU-less core).
    #[allow(
        clippy::float_arithmetic,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "sizing only; inputs are validated and casts saturate"
    )]
    pub fn for_capacity(expected: u64, fp_rate: f64) -> Result<BloomParams, BloomError> {
        if expected == 0 {
            return Err(BloomError::ZeroExpectedInsertions);
        }
        // Written so that NaN fails too.
        if !(fp_rate > 0.0 && fp_rate < 1.0) {
            return Err(BloomError::FalsePositiveRateOutOfRange);
        }
        let n = expected as f64;
        let ln2 = core::f64::consts::LN_2;
        let bits = libm::ceil(-n * libm::log(fp_rate) / (ln2 * ln2)).max(1.0);
        let hashes = libm::round(bits / n * ln2).clamp(1.0, f64::from(MAX_HASHES));
        Ok(BloomParams {
            bits: bits as u64,
            hashes: hashes as u32,
        })
    }

    /// The `u64` words a filter needs for these parameters.
    pub const fn words(&self) -> u64 {
        self.bits.div_ceil(64)
    }
}

const fn check_hashes(hashes: u32) -> Result<(), BloomError> {
    if hashes == 0 || hashes > MAX_HASHES {
        Err(BloomError::HashesOutOfRange { hashes })
    } else {
        Ok(())
    }
}

/// A Bloom filter of `64 * WORDS` bits.
///
/// `k` bit positions come from one 64-bit hash by double hashing, so an
/// insert or a lookup hashes the item once. A marked item is always found
/// (no false negatives); an unmarked one is found with the false-positive
/// probability of the sizing. [`Deduplicator::unique_count`] counts marks
/// that set at least one new bit, an estimate of distinct items.
///
/// ```
/// use guard_core::dedup::{BloomFilter, BloomParams, Deduplicator};
/// use guard_core::time::Instant;
///
/// let params = BloomParams::for_capacity(1_000, 0.01)?;
/// assert!(params.words() <= 150);
/// let mut seen: BloomFilter<150> = BloomFilter::with_params(params)?;
/// let now = Instant::ZERO;
/// assert_eq!(seen.check_and_mark("order-1", now), Ok(false));
/// assert_eq!(seen.check_and_mark("order-1", now), Ok(true));
/// # Ok::<(), guard_core::dedup::BloomError>(())
/// ```
#[derive(Clone, Debug)]
pub struct BloomFilter<const WORDS: usize, S = DefaultHashState> {
    bits: [u64; WORDS],
    hashes: u32,
    marked: usize,
    hasher: S,
}

impl<const WORDS: usize> BloomFilter<WORDS, DefaultHashState> {
    /// An empty filter using `hashes` hash functions, hashing with a fixed
    /// seed: anyone can compute an item's bits, so items an outsider
    /// chooses (message ids, client keys) must use
    /// [`with_key`](BloomFilter::with_key) instead, or crafted items can
    /// make an id never sent read as seen.
    pub const fn new(hashes: u32) -> Result<Self, BloomError> {
        match check_hashes(hashes) {
            Ok(()) => Ok(Self::empty(
                hashes,
                DefaultHashState::with_seed(DEFAULT_SEED),
            )),
            Err(e) => Err(e),
        }
    }

    /// An empty filter for `params`; errors if it has too few bits.
    pub const fn with_params(params: BloomParams) -> Result<Self, BloomError> {
        match fits::<WORDS>(params) {
            Ok(()) => Self::new(params.hashes),
            Err(e) => Err(e),
        }
    }
}

impl<const WORDS: usize> BloomFilter<WORDS, SecretHashState> {
    /// An empty filter for `params` whose bits are chosen under the secret
    /// `key` (SipHash-1-3, [`SecretHashState`]): without the key no one
    /// can craft items that fill an item's bits. Filters that must decide
    /// alike (replicas' copies) share the key; keep it like a password.
    pub fn with_key(params: BloomParams, key: [u8; 16]) -> Result<Self, BloomError> {
        fits::<WORDS>(params)?;
        Self::with_hasher(params.hashes, SecretHashState::new(key))
    }
}

/// Whether a filter of `WORDS` words holds the bits `params` need.
const fn fits<const WORDS: usize>(params: BloomParams) -> Result<(), BloomError> {
    let available_bits = (WORDS as u64).saturating_mul(64);
    if available_bits < params.bits {
        return Err(BloomError::TooSmall {
            required_bits: params.bits,
            available_bits,
        });
    }
    Ok(())
}

impl<const WORDS: usize, S: BuildHasher> BloomFilter<WORDS, S> {
    /// An empty filter using `hashes` hash functions and `hasher`.
    pub fn with_hasher(hashes: u32, hasher: S) -> Result<Self, BloomError> {
        check_hashes(hashes)?;
        Ok(Self::empty(hashes, hasher))
    }

    const fn empty(hashes: u32, hasher: S) -> Self {
        const { assert!(WORDS > 0, "a Bloom filter needs at least one word") };
        BloomFilter {
            bits: [0; WORDS],
            hashes,
            marked: 0,
            hasher,
        }
    }

    /// Hash functions used.
    pub const fn hashes(&self) -> u32 {
        self.hashes
    }

    /// Bits in the filter.
    pub const fn bit_count(&self) -> u64 {
        (WORDS as u64).saturating_mul(64)
    }

    /// The `k` bit positions of a hash (Kirsch–Mitzenmacher double hashing,
    /// mapped onto the bits by multiply-shift, which never divides).
    fn positions(&self, hash: u64) -> impl Iterator<Item = (usize, u64)> + use<WORDS, S> {
        let bits = u128::from(self.bit_count());
        let step = hash.rotate_left(32).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..u64::from(self.hashes)).map(move |i| {
            let h = hash.wrapping_add(i.wrapping_mul(step));
            // < bits <= 64 * WORDS, so the word index fits in usize.
            let bit = (u128::from(h).wrapping_mul(bits) >> 64) as u64;
            ((bit / 64) as usize, 1u64 << (bit % 64))
        })
    }

    /// Marks that set at least one new bit: an estimate of distinct items
    /// (it undercounts only by false positives).
    pub const fn unique_count(&self) -> usize {
        self.marked
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.bits = [0; WORDS];
        self.marked = 0;
    }

    fn contains_hash(&self, hash: u64) -> bool {
        self.positions(hash)
            .all(|(word, mask)| self.bits.get(word).is_some_and(|w| w & mask != 0))
    }

    /// Sets the item's bits; returns whether any was new.
    fn insert_hash(&mut self, hash: u64) -> bool {
        let mut new = false;
        for (word, mask) in self.positions(hash) {
            if let Some(w) = self.bits.get_mut(word) {
                new |= *w & mask == 0;
                *w |= mask;
            }
        }
        if new {
            self.marked = self.marked.saturating_add(1);
        }
        new
    }
}

impl<T: Hash + ?Sized, const WORDS: usize, S: BuildHasher> Deduplicator<T>
    for BloomFilter<WORDS, S>
{
    fn is_duplicate(&self, item: &T, _now: Instant) -> bool {
        self.contains_hash(hash_of(&self.hasher, item))
    }

    fn mark_as_seen(&mut self, item: &T, _now: Instant) -> Result<(), CapacityExceeded> {
        self.insert_hash(hash_of(&self.hasher, item));
        Ok(())
    }

    fn check_and_mark(&mut self, item: &T, _now: Instant) -> Result<bool, CapacityExceeded> {
        Ok(!self.insert_hash(hash_of(&self.hasher, item)))
    }

    fn clear(&mut self) {
        BloomFilter::clear(self);
    }

    fn unique_count(&self, _now: Instant) -> usize {
        BloomFilter::unique_count(self)
    }
}

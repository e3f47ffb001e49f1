//! A breaker's state as bytes, for a breaker shared by replicas: each
//! replica reads the bytes, decides with guard-core's breaker as it would
//! in memory, and writes the new bytes back only if nobody wrote in
//! between (guard-redis's `RedisBreaker`), so every replica's decisions
//! are this module's decisions over one state.
//!
//! The encoding is fixed-size (`CircuitBreaker::<W>::ENCODED_LEN` bytes,
//! little-endian): a version byte, the phase and its fields, the epoch,
//! the last judged tally and minimum, the refusals, then the window's own
//! bytes ([`WindowSnapshot`]). The configuration is not in it: every
//! replica passes its own, the same one. Decoding checks every field and
//! recomputes what can be derived (a count window's tally from its ring),
//! so bytes that are not a snapshot of this window are refused, never
//! half-read.

use core::fmt;

use super::window::Tally;
use super::{BreakerConfig, CallWindow, CircuitBreaker, InvalidBreakerConfig, Phase};
use crate::time::Instant;

/// The first byte of every snapshot: the encoding's version.
const VERSION: u8 = 1;

/// The bytes before the window's: version, phase tag, since (u64),
/// handed (u32), trials (3 × u32), epoch (u32), last tally (3 × u32),
/// last minimum (u32), refusals (u64).
const HEADER_LEN: usize = 1 + 1 + 8 + 4 + 12 + 4 + 12 + 4 + 8;

/// Why bytes are not a snapshot of a breaker with this window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum InvalidSnapshot {
    /// Not as many bytes as the encoding of this window has.
    Length {
        /// The bytes the encoding has.
        expected: usize,
        /// The bytes given.
        got: usize,
    },
    /// An encoding version this code does not read.
    Version(u8),
    /// A field that no breaker writes (named).
    Field(&'static str),
    /// The configuration given with it is invalid.
    Config(InvalidBreakerConfig),
}

impl fmt::Display for InvalidSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidSnapshot::Length { expected, got } => write!(
                f,
                "circuit breaker snapshot: {got} bytes, the encoding of this window has {expected}"
            ),
            InvalidSnapshot::Version(v) => {
                write!(f, "circuit breaker snapshot: unknown version {v}")
            }
            InvalidSnapshot::Field(name) => {
                write!(f, "circuit breaker snapshot: invalid {name}")
            }
            InvalidSnapshot::Config(e) => write!(f, "circuit breaker snapshot: {e}"),
        }
    }
}

impl core::error::Error for InvalidSnapshot {}

/// Writes fixed-size little-endian fields into a buffer of exactly the
/// encoding's length.
pub struct SnapshotWriter<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl SnapshotWriter<'_> {
    /// Appends `bytes`; the callers write exactly the length they declare,
    /// so the buffer never runs out (a byte past it would be dropped).
    pub fn bytes(&mut self, bytes: &[u8]) {
        let end = self.at.saturating_add(bytes.len());
        if let Some(to) = self.out.get_mut(self.at..end) {
            to.copy_from_slice(bytes);
        }
        self.at = end;
    }

    /// Appends a `u32`.
    pub fn u32(&mut self, value: u32) {
        self.bytes(&value.to_le_bytes());
    }

    /// Appends a `u64`.
    pub fn u64(&mut self, value: u64) {
        self.bytes(&value.to_le_bytes());
    }

    /// Appends a tally.
    pub fn tally(&mut self, tally: Tally) {
        self.u32(tally.calls);
        self.u32(tally.failures);
        self.u32(tally.slow);
    }
}

/// Reads what a [`SnapshotWriter`] wrote, from a buffer of the encoding's length.
pub struct SnapshotReader<'a> {
    bytes: &'a [u8],
}

impl<'a> SnapshotReader<'a> {
    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], InvalidSnapshot> {
        let (head, rest) = self
            .bytes
            .split_at_checked(n)
            .ok_or(InvalidSnapshot::Field("length"))?;
        self.bytes = rest;
        Ok(head)
    }

    /// The next byte.
    pub fn u8(&mut self) -> Result<u8, InvalidSnapshot> {
        Ok(self.bytes(1)?.first().copied().unwrap_or(0))
    }

    /// The next `u32`.
    pub fn u32(&mut self) -> Result<u32, InvalidSnapshot> {
        let mut word = [0u8; 4];
        word.copy_from_slice(self.bytes(4)?);
        Ok(u32::from_le_bytes(word))
    }

    /// The next `u64`.
    pub fn u64(&mut self) -> Result<u64, InvalidSnapshot> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(word))
    }

    /// The next tally, refused if it counts more failures or slow calls
    /// than calls.
    pub fn tally(&mut self, name: &'static str) -> Result<Tally, InvalidSnapshot> {
        let tally = Tally {
            calls: self.u32()?,
            failures: self.u32()?,
            slow: self.u32()?,
        };
        if tally.failures > tally.calls || tally.slow > tally.calls {
            return Err(InvalidSnapshot::Field(name));
        }
        Ok(tally)
    }
}

/// A window whose state can be written as bytes and read back: what a
/// shared breaker needs of its window.
pub trait WindowSnapshot: CallWindow + Sized {
    /// How many bytes [`encode`](Self::encode) writes.
    const ENCODED_LEN: usize;

    /// Writes the window's state.
    fn encode(&self, out: &mut SnapshotWriter<'_>);

    /// Reads a state [`encode`](Self::encode) wrote, refusing anything
    /// else.
    fn decode(input: &mut SnapshotReader<'_>) -> Result<Self, InvalidSnapshot>;
}

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;
const DISABLED: u8 = 3;
const FORCED_OPEN: u8 = 4;

impl<W: WindowSnapshot> CircuitBreaker<W> {
    /// The length of [`encode`](Self::encode)'s bytes.
    pub const ENCODED_LEN: usize = HEADER_LEN + W::ENCODED_LEN;

    /// Writes the breaker's state (not its configuration) into `out`,
    /// which must be [`ENCODED_LEN`](Self::ENCODED_LEN) bytes long.
    ///
    /// ```
    /// use guard_core::breaker::{BreakerConfig, CircuitBreaker, CountWindow, State};
    /// use guard_core::time::Instant;
    ///
    /// let config = BreakerConfig::new().with_minimum_calls(2);
    /// let mut breaker = CircuitBreaker::new(config, CountWindow::<4>::new())?;
    /// let t = Instant::from_secs(1);
    /// for _ in 0..2 {
    ///     let permit = breaker.try_acquire(t).unwrap();
    ///     breaker.on_result(permit, t, true);
    /// }
    /// let mut bytes = [0u8; CircuitBreaker::<CountWindow<4>>::ENCODED_LEN];
    /// breaker.encode(&mut bytes)?;
    /// let copy = CircuitBreaker::<CountWindow<4>>::decode(config, &bytes)?;
    /// assert_eq!(copy.state(), State::Open);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn encode(&self, out: &mut [u8]) -> Result<(), InvalidSnapshot> {
        if out.len() != Self::ENCODED_LEN {
            return Err(InvalidSnapshot::Length {
                expected: Self::ENCODED_LEN,
                got: out.len(),
            });
        }
        let (tag, since, handed, trials) = match self.phase {
            Phase::Closed => (CLOSED, 0, 0, Tally::default()),
            Phase::Open { since } => (OPEN, since.as_nanos(), 0, Tally::default()),
            Phase::HalfOpen {
                since,
                handed,
                trials,
            } => (HALF_OPEN, since.as_nanos(), handed, trials),
            Phase::Disabled => (DISABLED, 0, 0, Tally::default()),
            Phase::ForcedOpen => (FORCED_OPEN, 0, 0, Tally::default()),
        };
        let mut w = SnapshotWriter { out, at: 0 };
        w.bytes(&[VERSION, tag]);
        w.u64(since);
        w.u32(handed);
        w.tally(trials);
        w.u32(self.epoch);
        w.tally(self.last_tally);
        w.u32(self.last_minimum);
        w.u64(self.not_permitted);
        self.window.encode(&mut w);
        Ok(())
    }

    /// The breaker [`encode`](Self::encode) wrote, with `config` (checked
    /// as [`CircuitBreaker::new`] checks it).
    pub fn decode(config: BreakerConfig, bytes: &[u8]) -> Result<Self, InvalidSnapshot> {
        config.validate().map_err(InvalidSnapshot::Config)?;
        if bytes.len() != Self::ENCODED_LEN {
            return Err(InvalidSnapshot::Length {
                expected: Self::ENCODED_LEN,
                got: bytes.len(),
            });
        }
        let mut r = SnapshotReader { bytes };
        let version = r.u8()?;
        if version != VERSION {
            return Err(InvalidSnapshot::Version(version));
        }
        let tag = r.u8()?;
        let since = Instant::from_nanos(r.u64()?);
        let handed = r.u32()?;
        let trials = r.tally("half-open trials")?;
        let phase = match tag {
            CLOSED => Phase::Closed,
            OPEN => Phase::Open { since },
            HALF_OPEN if trials.calls <= handed => Phase::HalfOpen {
                since,
                handed,
                trials,
            },
            HALF_OPEN => return Err(InvalidSnapshot::Field("half-open trials")),
            DISABLED => Phase::Disabled,
            FORCED_OPEN => Phase::ForcedOpen,
            _ => return Err(InvalidSnapshot::Field("state")),
        };
        let epoch = r.u32()?;
        let last_tally = r.tally("last tally")?;
        let last_minimum = r.u32()?;
        let not_permitted = r.u64()?;
        let window = W::decode(&mut r)?;
        Ok(CircuitBreaker {
            config,
            window,
            phase,
            epoch,
            last_tally,
            last_minimum,
            not_permitted,
        })
    }
}

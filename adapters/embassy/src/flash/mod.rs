//! Queues on NOR flash that survive a reset and a power cut: what a device
//! must still send after it restarts.
//!
//! - [`FlashQueue`]: a FIFO of byte records on a range of NOR flash, over
//!   [sequential-storage](https://docs.rs/sequential-storage)'s queue;
//! - [`FlashDeadLetterQueue`]: guard-core's dead-letter queue on it
//!   ([`DeadLetterSink`](guard_core::dlq::DeadLetterSink) included), each
//!   [`FailedElement`](guard_core::dlq::FailedElement) a record;
//! - [`FlashRecord`]: how an element and an error become bytes.
//!
//! # Guarantees
//!
//! Backed by `adapters/embassy/tests/flash_queue.rs`, which cuts the power
//! at every flash step of a workload (each word written, each page erased,
//! the cut word half programmed, the cut page half erased), restarts on
//! what the flash holds, and checks:
//!
//! 1. **An acknowledged push survives.** Once [`FlashQueue::push`] returns
//!    `Ok`, the record is read back after any later reset or power cut,
//!    until it is popped.
//! 2. **An acknowledged pop stays popped.** Once [`FlashQueue::pop`]
//!    returns `Ok`, the record is not read again.
//! 3. **Nothing is half-read.** Every record read back is one that was
//!    pushed, byte for byte (each record carries a CRC; a half-written one
//!    is skipped).
//! 4. **Order is kept.** Records come back oldest first.
//!
//! Limits: a push cut by the power is either all there or not there, and a
//! cut pop may leave its record in place (delivery is at least once: the
//! receiver deduplicates by the record's id). A full queue refuses a push
//! and writes nothing ([`FlashError::Full`]); it never overwrites the
//! oldest. Dropping a push or a pop future before it completes is a cut
//! too: the next call repairs the flash.
//!
//! ```
//! # use guard_embassy::flash::{FlashQueue, FlashError};
//! # async fn demo<F: embedded_storage_async::nor_flash::MultiwriteNorFlash>(flash: F)
//! #     -> Result<(), FlashError<F::Error>> {
//! // Two pages of 4 KiB at 0x1000; records of at most 64 bytes.
//! let mut queue: FlashQueue<F, 64> = FlashQueue::new(flash, 0x1000..0x3000)?;
//! queue.push(b"reading 1").await?;
//! if let Some(record) = queue.peek().await? {
//!     // ... send `record`; once the receiver acknowledges it:
//!     queue.pop().await?;
//! }
//! # Ok(())
//! # }
//! ```

mod dead_letters;
mod record;
mod recover;

use core::fmt;
use core::ops::Range;

use embedded_storage_async::nor_flash::{MultiwriteNorFlash, NorFlash};
use sequential_storage::cache::{Cache, CacheImpl, Uncached};
use sequential_storage::queue::{QueueConfig, QueueConfigError, QueueStorage};

pub use dead_letters::{FlashDeadLetterQueue, Refused, StoreError};
pub use record::{FlashRecord, RecordError};

/// The cache [`FlashQueue::new`] uses: none, so every call reads the state
/// from flash (a cache is RAM that must match the flash; see
/// [`FlashQueue::with_cache`]).
pub type NoCache = Cache<Uncached, Uncached, Uncached>;

/// What went wrong on a flash queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FlashError<E> {
    /// The flash range cannot hold a queue; nothing was touched.
    InvalidRange(LayoutProblem),
    /// No room for the record: nothing was written, and the caller keeps
    /// it (a full queue never overwrites the oldest).
    Full,
    /// The record is longer than any this queue takes.
    TooBig {
        /// The record's length in bytes.
        len: usize,
        /// The longest record this queue takes.
        max: usize,
    },
    /// The flash holds a record longer than this queue's buffer (written by
    /// a build with a larger record size); nothing was read.
    RecordTooLong {
        /// The buffer the record needs, in bytes.
        needed: usize,
    },
    /// The flash holds a state that repair could not fix: erase the range
    /// ([`FlashQueue::erase`]) to use it again; what it held is lost.
    Corrupted,
    /// The flash driver failed.
    Flash(E),
    /// sequential-storage reported an inconsistency of its own.
    Internal,
}

/// Why a flash range, the flash's geometry and the record size `R` make
/// no queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum LayoutProblem {
    /// The start is not at a page (erase unit) boundary.
    StartNotAtPage,
    /// The end is not at a page boundary.
    EndNotAtPage,
    /// Fewer than two pages. sequential-storage takes one, but a push the
    /// power cut leaves a half-written record that counts as live, and a
    /// page of its own then never makes room again.
    TooSmall,
    /// The flash's pages are too small for a record header.
    PagesTooSmall,
    /// The flash's word is wider than 32 bytes.
    WordTooWide,
    /// The range ends past the flash's capacity.
    PastCapacity,
    /// A page holds less than the queue's record size `R` (plus the
    /// record's header): such records could never be pushed.
    RecordSizeTooLarge,
    /// The record size `R` is less than one flash word.
    RecordSizeBelowWord,
}

impl fmt::Display for LayoutProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LayoutProblem::StartNotAtPage => "its start is not at a page boundary",
            LayoutProblem::EndNotAtPage => "its end is not at a page boundary",
            LayoutProblem::TooSmall => "it holds fewer than two pages",
            LayoutProblem::PagesTooSmall => "the flash's pages are too small for a record header",
            LayoutProblem::WordTooWide => "the flash's word is wider than 32 bytes",
            LayoutProblem::PastCapacity => "it ends past the flash's capacity",
            LayoutProblem::RecordSizeTooLarge => {
                "a page cannot hold a record of the queue's record size"
            }
            LayoutProblem::RecordSizeBelowWord => "the record size is less than a flash word",
        })
    }
}

impl<E: fmt::Debug> fmt::Display for FlashError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlashError::InvalidRange(problem) => {
                write!(f, "the flash range cannot hold a queue: {problem}")
            }
            FlashError::Full => f.write_str("the flash queue is full; nothing was written"),
            FlashError::TooBig { len, max } => {
                write!(
                    f,
                    "a record of {len} bytes is longer than the queue's {max}"
                )
            }
            FlashError::RecordTooLong { needed } => write!(
                f,
                "the flash holds a record that needs a {needed}-byte buffer, more than the queue's"
            ),
            FlashError::Corrupted => {
                f.write_str("the flash queue is corrupted beyond repair; erase it to use it again")
            }
            FlashError::Flash(e) => write!(f, "the flash driver failed: {e:?}"),
            FlashError::Internal => f.write_str("sequential-storage reported an internal error"),
        }
    }
}

impl<E: fmt::Debug> core::error::Error for FlashError<E> {}

impl<E> FlashError<E> {
    fn from_storage(error: sequential_storage::Error<E>) -> Self {
        use sequential_storage::Error;
        match error {
            Error::Storage { value, .. } => FlashError::Flash(value),
            Error::FullStorage => FlashError::Full,
            Error::Corrupted { .. } => FlashError::Corrupted,
            Error::BufferTooSmall(needed) => FlashError::RecordTooLong { needed },
            // Push checks the length first; a page too small for a record
            // is refused when the queue is made.
            Error::ItemTooBig | Error::BufferTooBig => FlashError::Internal,
            _ => FlashError::Internal,
        }
    }
}

/// A FIFO of byte records, each at most `R` bytes, on a range of NOR
/// flash: it survives a reset and a power cut (see the [module
/// guarantees](self#guarantees)).
///
/// `R` is also the RAM it takes for reading records back. Records are
/// read with [`peek`](Self::peek) and removed with [`pop`](Self::pop)
/// once whatever they were for is done, so a reset in between sends the
/// record again rather than never.
pub struct FlashQueue<S: NorFlash, const R: usize, C: CacheImpl<()> = NoCache> {
    storage: QueueStorage<S, C>,
    buffer: [u8; R],
    /// Whether the pages a cut erase left half done were erased again:
    /// done once, before the first call touches the queue (guarantee 1
    /// across a cut erase; see `recover`).
    recovered: bool,
}

impl<S: NorFlash, const R: usize> FlashQueue<S, R> {
    /// A queue on `range` of `flash`, without a cache. The range must start
    /// and end at page boundaries and hold at least two pages, and a page
    /// must hold a record of `R` bytes. What the range holds is kept: a
    /// queue written before the reset is read back as it was.
    pub fn new(flash: S, range: Range<u32>) -> Result<Self, FlashError<S::Error>> {
        Self::with_cache(flash, range, Cache::new_uncached())
    }
}

impl<S: NorFlash, const R: usize, C: CacheImpl<()>> FlashQueue<S, R, C> {
    /// A queue with one of sequential-storage's caches (fewer flash reads
    /// for a few bytes of RAM a page). The cache must be new: it learns
    /// the flash's state as the queue works.
    pub fn with_cache(flash: S, range: Range<u32>, cache: C) -> Result<Self, FlashError<S::Error>> {
        if range.end as usize > flash.capacity() {
            return Err(FlashError::InvalidRange(LayoutProblem::PastCapacity));
        }
        let range_len = range.end.saturating_sub(range.start) as usize;
        let config = QueueConfig::<S>::try_new(range).map_err(|problem| {
            FlashError::InvalidRange(match problem {
                QueueConfigError::StartRangeNotAtPageBoundary => LayoutProblem::StartNotAtPage,
                QueueConfigError::EndRangeNotAtPageBoundary => LayoutProblem::EndNotAtPage,
                QueueConfigError::RangeTooSmall => LayoutProblem::TooSmall,
                QueueConfigError::PagesTooSmall => LayoutProblem::PagesTooSmall,
                QueueConfigError::WordSizeTooLarge => LayoutProblem::WordTooWide,
            })
        })?;
        if range_len / S::ERASE_SIZE.max(1) < 2 {
            return Err(FlashError::InvalidRange(LayoutProblem::TooSmall));
        }
        if Self::RECORD_SIZE == 0 {
            return Err(FlashError::InvalidRange(LayoutProblem::RecordSizeBelowWord));
        }
        // Every record `push` takes must fit a page, or it could never be
        // written.
        if Self::max_record() < Self::RECORD_SIZE {
            return Err(FlashError::InvalidRange(LayoutProblem::RecordSizeTooLarge));
        }
        Ok(FlashQueue {
            storage: QueueStorage::new(flash, config, cache),
            buffer: [0; R],
            recovered: false,
        })
    }

    /// The longest record that fits a page: a page's bytes less its two
    /// state words and one record header.
    fn max_record() -> usize {
        let overhead = QueueStorage::<S, C>::item_overhead_size() as usize;
        S::ERASE_SIZE.saturating_sub(2 * Self::WORD + overhead)
    }

    /// The longest record a push takes: `R` rounded down to the flash's
    /// word, since a record is read back in whole words into `R` bytes.
    pub const RECORD_SIZE: usize = R - R % Self::WORD;

    /// The flash's word: what it reads and writes at once.
    const WORD: usize = if S::READ_SIZE > S::WRITE_SIZE {
        S::READ_SIZE
    } else {
        S::WRITE_SIZE
    };

    /// Erases again, once, the pages an erase cut by the power left half
    /// done, before the queue reads them (a new cache has learnt nothing
    /// yet, so it stays right).
    async fn recover(&mut self) -> Result<(), FlashError<S::Error>> {
        if !self.recovered {
            let range = self.storage.flash_range();
            recover::erase_cut_pages(self.storage.flash(), range, &mut self.buffer)
                .await
                .map_err(FlashError::Flash)?;
            self.recovered = true;
        }
        Ok(())
    }

    /// Appends `record`. `Ok` means it is on flash and survives a reset.
    /// A full queue writes nothing and returns [`FlashError::Full`].
    pub async fn push(&mut self, record: &[u8]) -> Result<(), FlashError<S::Error>> {
        let max = Self::RECORD_SIZE;
        if record.len() > max {
            return Err(FlashError::TooBig {
                len: record.len(),
                max,
            });
        }
        self.recover().await?;
        self.storage
            .push(record, false)
            .await
            .map_err(FlashError::from_storage)
    }

    /// The oldest record, left in place.
    pub async fn peek(&mut self) -> Result<Option<&[u8]>, FlashError<S::Error>> {
        self.recover().await?;
        match self.storage.peek(&mut self.buffer).await {
            Ok(Some(record)) => Ok(Some(record)),
            Ok(None) => Ok(None),
            Err(e) => Err(FlashError::from_storage(e)),
        }
    }

    /// Records held, counted by reading them all.
    pub async fn len(&mut self) -> Result<usize, FlashError<S::Error>> {
        self.recover().await?;
        let mut iter = self
            .storage
            .iter()
            .await
            .map_err(FlashError::from_storage)?;
        let mut count = 0;
        while iter
            .next(&mut self.buffer)
            .await
            .map_err(FlashError::from_storage)?
            .is_some()
        {
            count += 1;
        }
        Ok(count)
    }

    /// Whether no record is held.
    pub async fn is_empty(&mut self) -> Result<bool, FlashError<S::Error>> {
        Ok(self.peek().await?.is_none())
    }

    /// Calls `f` on each record, oldest first, without removing any.
    pub async fn for_each(&mut self, mut f: impl FnMut(&[u8])) -> Result<(), FlashError<S::Error>> {
        self.recover().await?;
        let mut iter = self
            .storage
            .iter()
            .await
            .map_err(FlashError::from_storage)?;
        while let Some(record) = iter
            .next(&mut self.buffer)
            .await
            .map_err(FlashError::from_storage)?
        {
            f(&record);
        }
        Ok(())
    }

    /// Erases the whole range: every record is gone. The way back from
    /// [`FlashError::Corrupted`], and the start of a new device.
    pub async fn erase(&mut self) -> Result<(), FlashError<S::Error>> {
        self.storage
            .erase_all()
            .await
            .map_err(FlashError::from_storage)?;
        self.recovered = true;
        Ok(())
    }

    /// The flash, for other ranges of it (the queue keeps no state of the
    /// flash outside its cache, which the queue's own calls keep right).
    pub fn flash(&mut self) -> &mut S {
        self.storage.flash()
    }

    /// Gives the flash back.
    pub fn into_flash(self) -> S {
        self.storage.destroy().0
    }
}

impl<S: MultiwriteNorFlash, const R: usize, C: CacheImpl<()>> FlashQueue<S, R, C> {
    /// Removes the oldest record; `Ok(false)` if there was none. Call it
    /// once the record's work is acknowledged: `Ok` means it stays removed
    /// across a reset.
    pub async fn pop(&mut self) -> Result<bool, FlashError<S::Error>> {
        self.recover().await?;
        match self.storage.pop(&mut self.buffer).await {
            Ok(popped) => Ok(popped.is_some()),
            Err(e) => Err(FlashError::from_storage(e)),
        }
    }
}

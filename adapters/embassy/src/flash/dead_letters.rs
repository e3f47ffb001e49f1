//! guard-core's dead-letter queue on NOR flash.

use core::fmt;
use core::marker::PhantomData;
use core::ops::Range;

use embedded_storage_async::nor_flash::{MultiwriteNorFlash, NorFlash};
use guard_core::dlq::{DeadLetterSink, FailedElement};
use guard_core::time::Instant;
use sequential_storage::cache::CacheImpl;

use super::{FlashError, FlashQueue, FlashRecord, NoCache, RecordError};

/// A failed element a [`FlashDeadLetterQueue`] could not store, handed
/// back with why.
#[derive(Debug)]
pub struct Refused<T, E, FE> {
    /// The element, as it was given.
    pub failed: FailedElement<T, E>,
    /// Why it is not on flash.
    pub why: StoreError<FE>,
}

/// Why a failed element is not stored, or could not be read back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum StoreError<FE> {
    /// The flash queue refused it or failed.
    Flash(FlashError<FE>),
    /// It does not encode into a record of the queue's size, or a record
    /// read back is not a failed element of these types.
    Record(RecordError),
}

impl<FE: fmt::Debug> fmt::Display for StoreError<FE> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Flash(e) => e.fmt(f),
            StoreError::Record(e) => e.fmt(f),
        }
    }
}

impl<FE: fmt::Debug> core::error::Error for StoreError<FE> {}

impl<FE> From<FlashError<FE>> for StoreError<FE> {
    fn from(e: FlashError<FE>) -> Self {
        StoreError::Flash(e)
    }
}

/// guard-core's [`DeadLetterQueue`](guard_core::dlq::DeadLetterQueue) on
/// NOR flash: failed elements that survive a reset and a power cut, oldest
/// first, each a record of at most `R` bytes ([`FlashRecord`] of the
/// element and of the error).
///
/// A full queue, a flash failure or an element too long for a record hands
/// the element back ([`Refused`]); the oldest is never evicted.
///
/// As a [`DeadLetterSink`] (what guard-core's failure handling sends to),
/// `send` waits for the flash by polling its future to the end: right for
/// the blocking flash drivers of most MCUs' internal flash (wrapped for
/// the async traits); in async code call [`add`](Self::add) instead.
pub struct FlashDeadLetterQueue<S: NorFlash, T, E, const R: usize, C: CacheImpl<()> = NoCache> {
    queue: FlashQueue<S, R, C>,
    record: [u8; R],
    // The queue stores `FailedElement<T, E>`s; it owns none in RAM.
    _elements: PhantomData<FailedElement<T, E>>,
}

impl<S: NorFlash, T: FlashRecord, E: FlashRecord, const R: usize> FlashDeadLetterQueue<S, T, E, R> {
    /// A dead-letter queue on `range` of `flash`; what the range already
    /// holds is kept (see [`FlashQueue::new`] for the range's rules).
    pub fn new(flash: S, range: Range<u32>) -> Result<Self, FlashError<S::Error>> {
        Ok(Self::on(FlashQueue::new(flash, range)?))
    }
}

impl<S: NorFlash, T: FlashRecord, E: FlashRecord, const R: usize, C: CacheImpl<()>>
    FlashDeadLetterQueue<S, T, E, R, C>
{
    /// A dead-letter queue on a flash queue made with a cache.
    pub fn on(queue: FlashQueue<S, R, C>) -> Self {
        FlashDeadLetterQueue {
            queue,
            record: [0; R],
            _elements: PhantomData,
        }
    }

    /// Records a failure; hands it back if it cannot be stored.
    pub async fn add(
        &mut self,
        element: T,
        error: Option<E>,
        attempts: u32,
        failed_at: Instant,
    ) -> Result<(), Refused<T, E, S::Error>> {
        self.push(FailedElement::new(element, error, attempts, failed_at))
            .await
    }

    /// Appends `failed`; `Ok` means it is on flash. Hands it back if the
    /// queue is full, the flash fails, or it does not fit a record.
    pub async fn push(
        &mut self,
        failed: FailedElement<T, E>,
    ) -> Result<(), Refused<T, E, S::Error>> {
        let len = match failed.encode(&mut self.record[..FlashQueue::<S, R, C>::RECORD_SIZE]) {
            Ok(len) => len,
            Err(e) => {
                return Err(Refused {
                    failed,
                    why: StoreError::Record(e),
                });
            }
        };
        match self.queue.push(&self.record[..len]).await {
            Ok(()) => Ok(()),
            Err(e) => Err(Refused {
                failed,
                why: StoreError::Flash(e),
            }),
        }
    }

    /// The oldest, decoded and left in place.
    pub async fn peek(&mut self) -> Result<Option<FailedElement<T, E>>, StoreError<S::Error>> {
        match self.queue.peek().await? {
            Some(bytes) => Ok(Some(
                FailedElement::decode(bytes).map_err(StoreError::Record)?,
            )),
            None => Ok(None),
        }
    }

    /// Elements held (read from flash).
    pub async fn len(&mut self) -> Result<usize, FlashError<S::Error>> {
        self.queue.len().await
    }

    /// Whether nothing is held.
    pub async fn is_empty(&mut self) -> Result<bool, FlashError<S::Error>> {
        self.queue.is_empty().await
    }

    /// Erases everything held.
    pub async fn clear(&mut self) -> Result<(), FlashError<S::Error>> {
        self.queue.erase().await
    }

    /// The flash queue underneath, e.g. to remove a record that no longer
    /// decodes ([`FlashQueue::pop`]) after reporting it.
    pub fn queue(&mut self) -> &mut FlashQueue<S, R, C> {
        &mut self.queue
    }

    /// Gives the flash back.
    pub fn into_flash(self) -> S {
        self.queue.into_flash()
    }
}

impl<S: MultiwriteNorFlash, T: FlashRecord, E: FlashRecord, const R: usize, C: CacheImpl<()>>
    FlashDeadLetterQueue<S, T, E, R, C>
{
    /// Removes and returns the oldest. A record that no longer decodes is
    /// left in place and reported: nothing is dropped unseen.
    ///
    /// Removing happens once the element is read, so a reset between this
    /// call and the element's handling loses it; to hand an element on
    /// without that window, [`peek`](Self::peek), handle it, then
    /// [`remove_oldest`](Self::remove_oldest).
    pub async fn poll(&mut self) -> Result<Option<FailedElement<T, E>>, StoreError<S::Error>> {
        let Some(oldest) = self.peek().await? else {
            return Ok(None);
        };
        self.queue.pop().await?;
        Ok(Some(oldest))
    }

    /// Removes the oldest without reading it; `Ok(false)` if there was none.
    pub async fn remove_oldest(&mut self) -> Result<bool, FlashError<S::Error>> {
        self.queue.pop().await
    }
}

impl<S: NorFlash, T: FlashRecord, E: FlashRecord, const R: usize, C: CacheImpl<()>>
    DeadLetterSink<T, E> for FlashDeadLetterQueue<S, T, E, R, C>
{
    fn send(&mut self, failed: FailedElement<T, E>) -> Result<(), FailedElement<T, E>> {
        embassy_futures::block_on(self.push(failed)).map_err(|refused| refused.failed)
    }
}

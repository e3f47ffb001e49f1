//! The check a queue makes once after a restart: pages that an erase cut
//! by the power left neither erased nor written.
//!
//! sequential-storage tells a page's state from its first and last words
//! (its layout 8: a word with at least 4 bits at 0 is a marker): open
//! (neither), partly written (the first only), closed (both). It repairs
//! an erase cut in address order (the first word erased, the last still
//! marked), but real NOR flash erases a page as a whole: a cut erase
//! leaves any bit in either state. Such a page can read as open while its
//! bytes are not erased, or as a second partly written page behind the
//! one being written, and records pushed onto it then read back broken:
//! acknowledged, and lost (`tests/flash_queue.rs` on the host, and the
//! MPS2 board's `outbox` image under QEMU, each found one of these before
//! the check was made).
//!
//! The queue only erases a page that holds no live record (it never
//! overwrites the oldest): the page after the one being written, when it
//! needs room, and the oldest page, once all its records are popped. So
//! erasing such a page again loses nothing. Before the queue is used, an
//! open page that is not blank is erased, and so is a page that reads as
//! partly written but holds no live record (if it was the page being
//! written, all its records were popped: nothing is lost).

use core::ops::Range;

use embedded_storage_async::nor_flash::NorFlash;
use sequential_storage::cache::Cache;
use sequential_storage::queue::{QueueConfig, QueueStorage};

/// How many of a marker word's bits must be 0 (sequential-storage's
/// `HALF_MARKER_BITS`).
const MARKER_ZERO_BITS: u32 = 4;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Page {
    Open,
    PartlyWritten,
    Other,
}

/// Whether the read unit at `at` holds a marker.
async fn marked<S: NorFlash>(flash: &mut S, at: u32) -> Result<bool, S::Error> {
    let mut word = [0u8; 32];
    let word = &mut word[..S::READ_SIZE.min(32)];
    flash.read(at, word).await?;
    Ok(word.iter().map(|b| b.count_zeros()).sum::<u32>() >= MARKER_ZERO_BITS)
}

async fn state<S: NorFlash>(flash: &mut S, page: Range<u32>) -> Result<Page, S::Error> {
    let start = marked(flash, page.start).await?;
    let end = marked(flash, page.end - S::READ_SIZE as u32).await?;
    Ok(match (start, end) {
        (false, false) => Page::Open,
        (true, false) => Page::PartlyWritten,
        _ => Page::Other,
    })
}

async fn blank<S: NorFlash>(flash: &mut S, page: Range<u32>) -> Result<bool, S::Error> {
    let mut chunk = [0u8; 64];
    // A whole number of read units per chunk.
    let len = 64 - 64 % S::READ_SIZE.max(1);
    let mut at = page.start;
    while at < page.end {
        let n = len.min((page.end - at) as usize);
        flash.read(at, &mut chunk[..n]).await?;
        if chunk[..n].iter().any(|&b| b != 0xFF) {
            return Ok(false);
        }
        at += n as u32;
    }
    Ok(true)
}

/// Whether `page` holds a record not yet popped, read by a queue over that
/// page alone (its items are CRC-checked: a half-erased page's are not
/// live). `buffer` holds the longest record the queue writes; a longer
/// one counts as live, so it is never erased unread.
async fn holds_live_record<S: NorFlash>(
    flash: &mut S,
    page: Range<u32>,
    buffer: &mut [u8],
) -> Result<bool, S::Error> {
    let Ok(config) = QueueConfig::<&mut S>::try_new(page) else {
        return Ok(true);
    };
    let mut view = QueueStorage::new(flash, config, Cache::new_uncached());
    let found = match view.iter().await {
        Ok(mut records) => records.next(buffer).await.map(|record| record.is_some()),
        Err(e) => Err(e),
    };
    match found {
        Ok(live) => Ok(live),
        Err(sequential_storage::Error::Storage { value, .. }) => Err(value),
        Err(sequential_storage::Error::BufferTooSmall(_)) => Ok(true),
        // Corrupted beyond repair: nothing on it reads.
        Err(_) => Ok(false),
    }
}

/// Erases the pages of `range` that a cut erase left half done (see the
/// module doc); returns how many.
pub(super) async fn erase_cut_pages<S: NorFlash>(
    flash: &mut S,
    range: Range<u32>,
    buffer: &mut [u8],
) -> Result<usize, S::Error> {
    let size = S::ERASE_SIZE as u32;
    let page = |start: u32| start..start + size;
    let mut erased = 0;
    for start in range.step_by(size as usize) {
        let cut = match state(flash, page(start)).await? {
            Page::Open => !blank(flash, page(start)).await?,
            // A cut erase can leave a page reading as the one being
            // written, beside the real one or alone (the real one closed
            // just before the cut): one without live records is erased,
            // which costs nothing if it was the real one.
            Page::PartlyWritten => !holds_live_record(flash, page(start), buffer).await?,
            Page::Other => false,
        };
        if cut {
            flash.erase(start, start + size).await?;
            erased += 1;
        }
    }
    Ok(erased)
}

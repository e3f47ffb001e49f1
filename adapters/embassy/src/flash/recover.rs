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
//! acknowledged, and lost (`tests/flash_queue.rs` found this before the
//! check was made).
//!
//! The queue only erases a page that holds no live record (it never
//! overwrites the oldest), and only the page after the one being written,
//! so erasing such a page again loses nothing: an open page that is not
//! blank, and a partly written page right after another partly written
//! one, are erased before the queue is used.

use core::ops::Range;

use embedded_storage_async::nor_flash::NorFlash;

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

/// Erases the pages of `range` that a cut erase left half done (see the
/// module doc); returns how many.
pub(super) async fn erase_cut_pages<S: NorFlash>(
    flash: &mut S,
    range: Range<u32>,
) -> Result<usize, S::Error> {
    let size = S::ERASE_SIZE as u32;
    let pages = ((range.end - range.start) / size) as usize;
    let page = |i: usize| {
        let start = range.start + i as u32 * size;
        start..start + size
    };
    let mut erased = 0;
    // The state of the page before page 0 in the cycle: the last one.
    let mut previous = state(flash, page(pages - 1)).await?;
    let last = previous;
    for i in 0..pages {
        let current = if i == pages - 1 {
            last
        } else {
            state(flash, page(i)).await?
        };
        let cut = match current {
            Page::Open => !blank(flash, page(i)).await?,
            Page::PartlyWritten => previous == Page::PartlyWritten && pages > 1,
            Page::Other => false,
        };
        if cut {
            flash.erase(page(i).start, page(i).end).await?;
            erased += 1;
            previous = Page::Open;
        } else {
            previous = current;
        }
    }
    Ok(erased)
}

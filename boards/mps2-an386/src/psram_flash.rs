//! NOR flash on the board's PSRAM, which keeps its contents across a
//! system reset (QEMU reloads the image into code memory, never into
//! PSRAM), with a power cut on request: the board resets in the middle of
//! a word write or a page erase.
//!
//! It behaves as NOR flash does: an erase sets a page to 0xFF, a write
//! only clears bits (a second write of a word ANDs it, as
//! `MultiwriteNorFlash` allows).

use embedded_storage_async::nor_flash::{
    ErrorType, MultiwriteNorFlash, NorFlash, NorFlashError, NorFlashErrorKind, ReadNorFlash,
};

/// Where PSRAM starts on the MPS2 (16 MiB; QEMU's `mps.ram`).
pub const PSRAM: usize = 0x2100_0000;

/// A flash page (erase unit) of this driver.
pub const PAGE: usize = 1024;
/// A flash word (write unit).
pub const WORD: usize = 4;

/// When the power goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Cut {
    /// Never.
    Never,
    /// During the n-th word written from now (0 is the next): half the
    /// word's bytes are programmed, then the board resets.
    AtWrite(u32),
    /// During the next page erase: the page's second half is erased, its
    /// first half is as it was (so its first word still reads as written
    /// and its last as erased), then the board resets.
    AtErase,
}

/// An address outside the flash, or not aligned to its unit.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FlashFault {
    OutOfBounds,
    NotAligned,
}

impl NorFlashError for FlashFault {
    fn kind(&self) -> NorFlashErrorKind {
        match self {
            FlashFault::OutOfBounds => NorFlashErrorKind::OutOfBounds,
            FlashFault::NotAligned => NorFlashErrorKind::NotAligned,
        }
    }
}

/// `len` bytes of PSRAM at `PSRAM + offset` as NOR flash.
pub struct PsramFlash {
    base: *mut u8,
    len: usize,
    cut: Cut,
}

impl PsramFlash {
    /// The flash at `offset` into PSRAM, `len` bytes (whole pages).
    ///
    /// # Safety
    ///
    /// Nothing else may use that PSRAM while the flash exists.
    pub const unsafe fn new(offset: usize, len: usize) -> Self {
        PsramFlash {
            base: (PSRAM + offset) as *mut u8,
            len,
            cut: Cut::Never,
        }
    }

    /// Plans a power cut.
    pub fn cut(&mut self, cut: Cut) {
        self.cut = cut;
    }

    fn check(&self, offset: u32, len: usize, unit: usize) -> Result<usize, FlashFault> {
        let start = offset as usize;
        if !start.is_multiple_of(unit) || !len.is_multiple_of(unit) {
            return Err(FlashFault::NotAligned);
        }
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(start),
            _ => Err(FlashFault::OutOfBounds),
        }
    }

    fn byte(&self, at: usize) -> u8 {
        // SAFETY: `at < len` (checked by the callers), and the range is
        // this driver's alone (`new`'s contract).
        unsafe { self.base.add(at).read_volatile() }
    }

    fn set(&mut self, at: usize, value: u8) {
        // SAFETY: as in `byte`.
        unsafe { self.base.add(at).write_volatile(value) }
    }

    fn power_off() -> ! {
        cortex_m::peripheral::SCB::sys_reset()
    }
}

impl ErrorType for PsramFlash {
    type Error = FlashFault;
}

impl ReadNorFlash for PsramFlash {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), FlashFault> {
        let start = self.check(offset, bytes.len(), 1)?;
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = self.byte(start + i);
        }
        Ok(())
    }

    fn capacity(&self) -> usize {
        self.len
    }
}

impl NorFlash for PsramFlash {
    const WRITE_SIZE: usize = WORD;
    const ERASE_SIZE: usize = PAGE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), FlashFault> {
        let start = self.check(from, to.saturating_sub(from) as usize, PAGE)?;
        for page in (start..to as usize).step_by(PAGE) {
            if self.cut == Cut::AtErase {
                for at in page + PAGE / 2..page + PAGE {
                    self.set(at, 0xFF);
                }
                Self::power_off();
            }
            for at in page..page + PAGE {
                self.set(at, 0xFF);
            }
        }
        Ok(())
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), FlashFault> {
        let start = self.check(offset, bytes.len(), WORD)?;
        for (i, word) in bytes.chunks(WORD).enumerate() {
            let at = start + i * WORD;
            let cut_here = match self.cut {
                Cut::AtWrite(0) => true,
                Cut::AtWrite(n) => {
                    self.cut = Cut::AtWrite(n - 1);
                    false
                }
                _ => false,
            };
            let programmed = if cut_here { WORD / 2 } else { WORD };
            for (j, b) in word.iter().enumerate().take(programmed) {
                let old = self.byte(at + j);
                self.set(at + j, old & b);
            }
            if cut_here {
                Self::power_off();
            }
        }
        Ok(())
    }
}

impl MultiwriteNorFlash for PsramFlash {}

/// Whether the word at `offset` into PSRAM holds `magic`: set once the
/// flash beside it was erased on a first start, so a start after a reset
/// keeps what the flash holds (PSRAM is zero at power-on under QEMU, and
/// anything on a board).
///
/// # Safety
///
/// The word at `offset` is used for this alone.
pub unsafe fn marked(offset: usize, magic: u32) -> bool {
    // SAFETY: the caller's word, in PSRAM (always mapped on this board).
    unsafe { ((PSRAM + offset) as *const u32).read_volatile() == magic }
}

/// Writes `magic` to the word at `offset` into PSRAM (see [`marked`]).
///
/// # Safety
///
/// As for [`marked`].
pub unsafe fn mark(offset: usize, magic: u32) {
    // SAFETY: as in `marked`.
    unsafe { ((PSRAM + offset) as *mut u32).write_volatile(magic) }
}

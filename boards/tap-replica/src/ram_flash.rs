//! NOR flash in RAM, for a host replica's outbox (it lasts as long as the
//! process): an erase sets a page to 0xFF, a write only clears bits, as
//! on the firmware's flash.

use embedded_storage_async::nor_flash::{
    ErrorType, MultiwriteNorFlash, NorFlash, NorFlashError, NorFlashErrorKind, ReadNorFlash,
};

/// The erase unit.
pub const PAGE: usize = 4096;

/// An address outside the flash, or not aligned to its unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Misaddressed(NorFlashErrorKind);

impl NorFlashError for Misaddressed {
    fn kind(&self) -> NorFlashErrorKind {
        self.0
    }
}

/// NOR flash over `bytes` (whole pages).
pub struct RamFlash<'a> {
    bytes: &'a mut [u8],
}

impl<'a> RamFlash<'a> {
    /// Flash over `bytes`, erased.
    pub fn new(bytes: &'a mut [u8]) -> Self {
        bytes.fill(0xFF);
        RamFlash { bytes }
    }

    fn range(
        &self,
        offset: u32,
        len: usize,
        unit: usize,
    ) -> Result<core::ops::Range<usize>, Misaddressed> {
        let start = offset as usize;
        if !start.is_multiple_of(unit) || !len.is_multiple_of(unit) {
            return Err(Misaddressed(NorFlashErrorKind::NotAligned));
        }
        match start.checked_add(len) {
            Some(end) if end <= self.bytes.len() => Ok(start..end),
            _ => Err(Misaddressed(NorFlashErrorKind::OutOfBounds)),
        }
    }
}

impl ErrorType for RamFlash<'_> {
    type Error = Misaddressed;
}

impl ReadNorFlash for RamFlash<'_> {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), Misaddressed> {
        let range = self.range(offset, bytes.len(), 1)?;
        bytes.copy_from_slice(&self.bytes[range]);
        Ok(())
    }

    fn capacity(&self) -> usize {
        self.bytes.len()
    }
}

impl NorFlash for RamFlash<'_> {
    const WRITE_SIZE: usize = 4;
    const ERASE_SIZE: usize = PAGE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), Misaddressed> {
        let range = self.range(from, to.saturating_sub(from) as usize, PAGE)?;
        self.bytes[range].fill(0xFF);
        Ok(())
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), Misaddressed> {
        let range = self.range(offset, bytes.len(), 4)?;
        for (cell, byte) in self.bytes[range].iter_mut().zip(bytes) {
            *cell &= byte;
        }
        Ok(())
    }
}

impl MultiwriteNorFlash for RamFlash<'_> {}

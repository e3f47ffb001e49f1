//! Records in an append-only log: each framed with its length and a
//! checksum, and the scan that finds where a log torn by a power loss
//! stops holding whole records.
//!
//! A frame is an 8-byte [`Header`] followed by the record:
//!
//! | bytes | what |
//! |---|---|
//! | 0..4 | the record's length, little-endian `u32` |
//! | 4..8 | CRC-32 (IEEE) of bytes 0..4 and the record, little-endian |
//!
//! The checksum covers the length too, so a length torn or flipped by a
//! bad write is never taken at its word, and a zero-filled tail (a file
//! extended by the file system, its data never written) is no record:
//! the CRC of four zero bytes is not zero.
//!
//! Guarantees:
//!
//! - **A log reads back as the records appended, in order, up to the
//!   first frame that is not whole** ([`scan`], [`Header::verifies`]):
//!   a frame cut short (a torn write at the end) or one whose checksum
//!   fails (a corrupted block) ends the readable log; nothing after it
//!   is taken, since a length that cannot be trusted places no later
//!   frame. What is left is counted in bytes ([`Scan::lost`]), for the
//!   caller to report.
//! - **A damaged log is never read as a record that was not appended**,
//!   unless a damage keeps a CRC-32 matching: one chance in 2³² per
//!   damaged frame.
//! - Nothing here allocates or panics, whatever the bytes.
//!
//! ```
//! use guard_core::frame::{self, Header, Tail};
//!
//! let mut log = [0u8; 64];
//! let mut at = 0;
//! for record in [&b"first"[..], b"second"] {
//!     let header = Header::of(record)?;
//!     log[at..at + frame::HEADER_LEN].copy_from_slice(&header.to_bytes());
//!     at += frame::HEADER_LEN;
//!     log[at..at + record.len()].copy_from_slice(record);
//!     at += record.len();
//! }
//! // The second frame torn by a power loss: two bytes of it never written.
//! let scan = frame::scan(&log[..at - 2]);
//! assert_eq!(scan.records, 1);
//! assert_eq!(scan.valid, frame::HEADER_LEN + 5);
//! assert_eq!(scan.tail, Tail::Truncated);
//! assert_eq!(scan.lost(at - 2), frame::HEADER_LEN + 4);
//! # Ok::<(), frame::TooLong>(())
//! ```

use core::fmt;

/// Bytes of a frame's header.
pub const HEADER_LEN: usize = 8;

/// The longest record a frame holds: `u32::MAX` bytes.
pub const MAX_RECORD_LEN: usize = u32::MAX as usize;

/// A record longer than [`MAX_RECORD_LEN`] has no frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct TooLong {
    /// The record's length.
    pub len: usize,
}

impl fmt::Display for TooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a record of {} bytes is longer than a frame holds ({MAX_RECORD_LEN} bytes)",
            self.len
        )
    }
}

/// A frame's header: the record's length and the checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Header {
    len: u32,
    crc: u32,
}

impl Header {
    /// The header of `record`'s frame.
    pub fn of(record: &[u8]) -> Result<Header, TooLong> {
        let len = u32::try_from(record.len()).map_err(|_| TooLong { len: record.len() })?;
        Ok(Header {
            len,
            crc: checksum(len, record),
        })
    }

    /// A header as read back, not yet checked: its record must pass
    /// [`verifies`](Self::verifies).
    pub fn from_bytes(bytes: [u8; HEADER_LEN]) -> Header {
        let [a, b, c, d, e, f, g, h] = bytes;
        Header {
            len: u32::from_le_bytes([a, b, c, d]),
            crc: u32::from_le_bytes([e, f, g, h]),
        }
    }

    /// The header's bytes, as written before the record.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let [a, b, c, d] = self.len.to_le_bytes();
        let [e, f, g, h] = self.crc.to_le_bytes();
        [a, b, c, d, e, f, g, h]
    }

    /// The length of the record this header announces (to be read, then
    /// checked with [`verifies`](Self::verifies)).
    pub fn record_len(self) -> usize {
        // u32 to usize: lossless on every target with 32-bit or wider
        // pointers, the only ones this crate builds for.
        self.len as usize
    }

    /// The frame's whole length: header and record.
    pub fn frame_len(self) -> usize {
        self.record_len().saturating_add(HEADER_LEN)
    }

    /// Whether `record` is the one this header was made for: its length
    /// and checksum match.
    pub fn verifies(self, record: &[u8]) -> bool {
        record.len() == self.record_len() && checksum(self.len, record) == self.crc
    }
}

fn checksum(len: u32, record: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&len.to_le_bytes());
    crc.update(record);
    crc.finalize()
}

/// How a scanned log ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Tail {
    /// After its last whole frame: nothing is left.
    Clean,
    /// In a frame cut short: its header or its record runs past the end
    /// (a write torn by a crash or a power loss).
    Truncated,
    /// In a whole frame whose checksum fails (a corrupted write).
    Corrupt,
}

/// What [`scan`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Scan {
    /// Bytes of whole, verified frames from the start: where the log is
    /// readable to, and where the next frame belongs.
    pub valid: usize,
    /// Records in those bytes.
    pub records: u64,
    /// What follows them.
    pub tail: Tail,
}

impl Scan {
    /// Bytes of a log of `len` bytes past its readable part: what a
    /// recovery drops.
    pub fn lost(&self, len: usize) -> usize {
        len.saturating_sub(self.valid)
    }
}

/// One step of reading a log held in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next<'a> {
    /// A whole, verified record, and where the next frame starts.
    Record {
        /// The record.
        record: &'a [u8],
        /// Where the frame after it starts.
        next: usize,
    },
    /// The log ends at `at`, as `Tail` says.
    End(Tail),
}

/// Reads the frame at `at` of `log`.
pub fn next(log: &[u8], at: usize) -> Next<'_> {
    let Some(rest) = log.get(at..) else {
        return Next::End(Tail::Truncated);
    };
    if rest.is_empty() {
        return Next::End(Tail::Clean);
    }
    let Some((head, body)) = rest.split_first_chunk::<HEADER_LEN>() else {
        return Next::End(Tail::Truncated);
    };
    let header = Header::from_bytes(*head);
    let Some(record) = body.get(..header.record_len()) else {
        return Next::End(Tail::Truncated);
    };
    if !header.verifies(record) {
        return Next::End(Tail::Corrupt);
    }
    Next::Record {
        record,
        next: at.saturating_add(header.frame_len()),
    }
}

/// Scans `log` from its start: the readable part and how it ends.
pub fn scan(log: &[u8]) -> Scan {
    let mut at = 0;
    let mut records = 0u64;
    loop {
        match next(log, at) {
            Next::Record { next, .. } => {
                at = next;
                records = records.saturating_add(1);
            }
            Next::End(tail) => {
                return Scan {
                    valid: at,
                    records,
                    tail,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(records: &[&[u8]]) -> std::vec::Vec<u8> {
        let mut log = std::vec::Vec::new();
        for r in records {
            log.extend_from_slice(&Header::of(r).unwrap().to_bytes());
            log.extend_from_slice(r);
        }
        log
    }

    #[test]
    fn a_zero_filled_tail_is_no_record() {
        let mut log = framed(&[b"a"]);
        log.extend_from_slice(&[0; 32]);
        let scan = scan(&log);
        assert_eq!((scan.records, scan.valid), (1, HEADER_LEN + 1));
        assert_eq!(scan.tail, Tail::Corrupt);
    }

    #[test]
    fn an_empty_record_is_a_record() {
        let log = framed(&[b"", b"x"]);
        assert_eq!(
            scan(&log),
            Scan {
                valid: log.len(),
                records: 2,
                tail: Tail::Clean
            }
        );
    }

    #[test]
    fn a_flipped_length_is_caught_by_the_checksum() {
        let mut log = framed(&[b"abcd", b"efgh"]);
        // The second frame's length 4 -> 3: its record would fit.
        log[HEADER_LEN + 4] = 3;
        let scan = scan(&log);
        assert_eq!((scan.records, scan.tail), (1, Tail::Corrupt));
    }
}

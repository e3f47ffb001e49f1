//! The queue's files: segment names, the cursor file, and the recovery
//! of a directory a crash or a power loss left behind.

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use guard_core::frame::{self, Next};

use super::QueueError;
use crate::private_files;

/// Segments end in this.
const SEGMENT_SUFFIX: &str = ".seg";
/// The cursor's file.
pub(super) const CURSOR_FILE: &str = "cursor";
/// The file a process locks while it holds the queue.
pub(super) const LOCK_FILE: &str = "lock";
/// Bytes of the cursor file: segment, offset, CRC-32 of both.
const CURSOR_LEN: usize = 20;

/// One segment file: its number and its bytes of whole frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Segment {
    pub id: u64,
    pub len: u64,
}

/// Where the next record to forward starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Position {
    pub segment: u64,
    pub offset: u64,
}

pub(super) fn segment_path(dir: &Path, id: u64) -> PathBuf {
    // Twenty digits: names sort as their numbers do.
    dir.join(format!("{id:020}{SEGMENT_SUFFIX}"))
}

fn segment_id(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A file operation's error: what was done, on which file.
pub(crate) fn io_error(what: &str, path: &Path, source: io::Error) -> QueueError {
    QueueError::Io {
        what: what.to_owned(),
        path: path.to_owned(),
        source,
    }
}

/// The cursor file's bytes for `at`.
pub(super) fn cursor_bytes(at: Position) -> [u8; CURSOR_LEN] {
    let mut bytes = [0u8; CURSOR_LEN];
    bytes[..8].copy_from_slice(&at.segment.to_le_bytes());
    bytes[8..16].copy_from_slice(&at.offset.to_le_bytes());
    let crc = crc32fast::hash(&bytes[..16]);
    bytes[16..].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// The position a cursor file holds, if it is whole.
fn read_cursor(dir: &Path) -> Result<Option<Position>, QueueError> {
    let path = dir.join(CURSOR_FILE);
    let bytes = match private_files::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error("reading the cursor", &path, e)),
    };
    let Ok(bytes) = <[u8; CURSOR_LEN]>::try_from(bytes.as_slice()) else {
        return Ok(None);
    };
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let crc = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    if crc32fast::hash(&bytes[..16]) != crc {
        return Ok(None);
    }
    Ok(Some(Position {
        segment: word(0),
        offset: word(8),
    }))
}

/// What opening a queue found and repaired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Records waiting to be forwarded.
    pub pending: u64,
    /// Bytes dropped from torn or damaged segment tails: what a crash or
    /// a power loss took that was written but not whole.
    pub lost_bytes: u64,
    /// Segments whose tail was dropped, or found empty before the newest
    /// (a segment is only sealed with records in it).
    pub damaged_segments: u64,
    /// Segments gone that were not all forwarded: the cursor's own, or
    /// one missing between it and the newest (removed by hand, or lost
    /// with the file system). Their records are lost, uncounted.
    pub missing_segments: u64,
    /// The cursor file was missing, torn, or pointed between records, so
    /// forwarding starts again at the oldest segment's record it could
    /// place (records may be forwarded twice, none skipped).
    pub cursor_reset: bool,
}

/// A directory as recovered: its segments (oldest first, tails cut to
/// their whole frames), the read position, and what was found.
pub(super) struct Recovered {
    pub segments: VecDeque<Segment>,
    pub read: Position,
    pub recovery: Recovery,
}

/// Lists, scans and repairs the segments of `dir`: a segment before the
/// cursor's is already forwarded and removed; every other one is cut to
/// its whole frames, the bytes cut counted lost.
pub(super) fn recover(dir: &Path) -> Result<Recovered, QueueError> {
    let mut ids = Vec::new();
    let entries = fs::read_dir(dir).map_err(|e| io_error("listing", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_error("listing", dir, e))?;
        if let Some(id) = entry.file_name().to_str().and_then(segment_id) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    let cursor = read_cursor(dir)?;
    let mut recovery = Recovery {
        cursor_reset: cursor.is_none() && !ids.is_empty(),
        ..Recovery::default()
    };
    // The cursor names a segment still here, or one already removed (its
    // records forwarded): the next one then starts at 0. A cursor past
    // every segment cannot be trusted.
    let mut read = match (cursor, ids.first(), ids.last()) {
        (Some(at), Some(_), Some(&last)) if at.segment <= last => at,
        (Some(_), Some(&first), Some(_)) => {
            recovery.cursor_reset = true;
            Position {
                segment: first,
                offset: 0,
            }
        }
        (_, first, _) => Position {
            segment: first.copied().unwrap_or(1),
            offset: 0,
        },
    };
    // Only a segment all forwarded is ever removed, and the cursor moves
    // past it first: the cursor's segment and every one after it up to the
    // newest are all there, unless something else removed them.
    if let (Some(at), Some(&last)) = (cursor, ids.last())
        && at.segment <= last
    {
        let expected = last.saturating_sub(at.segment).saturating_add(1);
        let present = ids.iter().filter(|&&id| id >= at.segment).count() as u64;
        recovery.missing_segments = expected.saturating_sub(present);
    }
    let newest = ids.last().copied();
    let mut segments = VecDeque::new();
    for id in ids {
        let path = segment_path(dir, id);
        if id < read.segment {
            fs::remove_file(&path)
                .map_err(|e| io_error("removing a forwarded segment", &path, e))?;
            continue;
        }
        let bytes =
            private_files::read(&path).map_err(|e| io_error("reading a segment", &path, e))?;
        let scan = frame::scan(&bytes);
        let lost = scan.lost(bytes.len());
        if lost > 0 {
            let file = private_files::open(private_files::options().write(true), &path)
                .map_err(|e| io_error("opening a damaged segment", &path, e))?;
            file.set_len(scan.valid as u64)
                .and_then(|()| file.sync_all())
                .map_err(|e| io_error("cutting a damaged segment's tail", &path, e))?;
            recovery.lost_bytes = recovery.lost_bytes.saturating_add(lost as u64);
            recovery.damaged_segments = recovery.damaged_segments.saturating_add(1);
        }
        let start = if id == read.segment {
            match boundary(&bytes[..scan.valid], read.offset) {
                Some(records_before) => scan.records.saturating_sub(records_before),
                None => {
                    recovery.cursor_reset = true;
                    read.offset = 0;
                    scan.records
                }
            }
        } else {
            scan.records
        };
        if bytes.is_empty() && Some(id) != newest {
            recovery.damaged_segments = recovery.damaged_segments.saturating_add(1);
        }
        recovery.pending = recovery.pending.saturating_add(start);
        segments.push_back(Segment {
            id,
            len: scan.valid as u64,
        });
    }
    if segments.front().is_some_and(|s| s.id != read.segment) {
        read = Position {
            segment: segments.front().map_or(read.segment, |s| s.id),
            offset: 0,
        };
    }
    Ok(Recovered {
        segments,
        read,
        recovery,
    })
}

/// The records before `offset` in `log`, if `offset` is where a frame
/// starts (or the end).
fn boundary(log: &[u8], offset: u64) -> Option<u64> {
    let mut at = 0usize;
    let mut records = 0u64;
    loop {
        if at as u64 == offset {
            return Some(records);
        }
        match frame::next(log, at) {
            Next::Record { next, .. } => {
                at = next;
                records += 1;
            }
            Next::End(_) => return None,
        }
    }
}

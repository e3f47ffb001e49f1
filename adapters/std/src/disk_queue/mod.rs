//! A queue on disk, bounded in bytes, that a process appends to and one
//! consumer reads in order: store-and-forward in front of a sink that is
//! down or holds back.
//!
//! The queue is a directory of segment files, each a log of
//! guard-core [`frame`](guard_core::frame)s, and a cursor file (where the
//! next record to forward starts). A segment is removed once all of it is
//! forwarded.
//!
//! Guarantees:
//!
//! - **Nothing appended is lost to a crash of the process**: [`append`]
//!   returns once the record is written to the file (the kernel holds
//!   it), so a `SIGKILL` loses nothing. **A power loss loses at most what
//!   was appended since the last sync**: with [`SyncPolicy::EveryWrite`]
//!   `append` returns after `fdatasync`, nothing; with
//!   [`SyncPolicy::Every`]`(d)` a background thread syncs every `d`, so at
//!   most the last `d` (and the sync's own time) of records.
//! - **Records are read in the order appended**, each until the consumer
//!   [`advance`]s past it ([`read_next`] reads on past those handed out,
//!   a window in flight, and `advance` still moves past the oldest
//!   first); the cursor is written at every advance and
//!   synced with the data, so a crash makes the consumer read again at
//!   most what it forwarded since the last sync (at least once, never
//!   skipped).
//! - **A torn or damaged tail is cut at open, and counted**
//!   ([`Recovery`]): each segment keeps its whole frames up to the first
//!   one that is not; the bytes dropped are reported, never read as
//!   records.
//! - **Bounded**: the segment files never hold more than `max_bytes`. A
//!   record that does not fit is handed back ([`AppendError::Full`]), as
//!   is one the disk has no room for ([`AppendError::DiskFull`]), the
//!   partial write cut off so the queue stays readable; the caller holds
//!   its source back and waits for [`space`](DiskQueue::space). The
//!   segment being read counts whole until it is all forwarded, so up to
//!   one segment (`max_bytes / 8` unless set) of forwarded bytes can
//!   count against the bound.
//! - **One process at a time**: opening takes a lock on the directory;
//!   a second open fails with [`QueueError::Locked`].
//!
//! ```
//! use guard_std::disk_queue::{DiskQueue, QueueSettings, SyncPolicy};
//!
//! let dir = std::env::temp_dir().join(format!("guard-doc-queue-{}", std::process::id()));
//! let settings = QueueSettings::new(1 << 20, SyncPolicy::EveryWrite)?;
//! let (queue, recovery) = DiskQueue::open(&dir, settings)?;
//! assert_eq!(recovery.pending, 0);
//! queue.append(b"first")?;
//! queue.append(b"second")?;
//! assert_eq!(queue.peek()?.as_deref(), Some(&b"first"[..]));
//! queue.advance()?; // forwarded
//! assert_eq!(queue.peek()?.as_deref(), Some(&b"second"[..]));
//! drop(queue);
//! // Reopened: the unforwarded record is still there.
//! let (queue, recovery) = DiskQueue::open(&dir, settings)?;
//! assert_eq!(recovery.pending, 1);
//! assert_eq!(queue.peek()?.as_deref(), Some(&b"second"[..]));
//! # drop(queue);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`append`]: DiskQueue::append
//! [`advance`]: DiskQueue::advance
//! [`read_next`]: DiskQueue::read_next

mod files;

use std::collections::VecDeque;
use std::fmt;
use std::fs::{self, File, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use event_listener::Event;
use guard_core::frame::{HEADER_LEN, Header};

pub use files::Recovery;
pub(crate) use files::io_error;
use files::{CURSOR_FILE, LOCK_FILE, Position, Segment, cursor_bytes, segment_path};

use crate::private_files;

/// The smallest bound a queue takes: 4 KiB.
pub const MIN_MAX_BYTES: u64 = 4096;
/// The largest segment unless set: 64 MiB.
pub const MAX_SEGMENT_BYTES: u64 = 64 << 20;

/// When appended records reach the disk itself, not only the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPolicy {
    /// `fdatasync` before [`DiskQueue::append`] returns: a power loss
    /// loses nothing appended, at the cost of a sync per record.
    EveryWrite,
    /// A thread syncs every so often: a power loss loses at most what
    /// was appended in the last period (a crash of the process, nothing).
    Every(Duration),
}

/// A queue's bound, segment size and sync policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSettings {
    max_bytes: u64,
    segment_bytes: u64,
    sync: SyncPolicy,
}

impl QueueSettings {
    /// At most `max_bytes` on disk (at least [`MIN_MAX_BYTES`]), in
    /// segments of an eighth of it (at most [`MAX_SEGMENT_BYTES`]).
    pub fn new(max_bytes: u64, sync: SyncPolicy) -> Result<Self, QueueError> {
        if max_bytes < MIN_MAX_BYTES {
            return Err(QueueError::Settings(format!(
                "max_bytes is {max_bytes}: a queue holds at least {MIN_MAX_BYTES} bytes"
            )));
        }
        if let SyncPolicy::Every(period) = sync
            && period.is_zero()
        {
            return Err(QueueError::Settings(
                "a sync period of 0: say every write instead".to_owned(),
            ));
        }
        Ok(QueueSettings {
            max_bytes,
            segment_bytes: (max_bytes / 8).clamp(HEADER_LEN as u64, MAX_SEGMENT_BYTES),
            sync,
        })
    }

    /// Segments of `bytes` (a record longer than that has one of its
    /// own): between 64 bytes and `max_bytes`.
    pub fn with_segment_bytes(mut self, bytes: u64) -> Result<Self, QueueError> {
        if !(64..=self.max_bytes).contains(&bytes) {
            return Err(QueueError::Settings(format!(
                "segment_bytes is {bytes}: between 64 and max_bytes ({})",
                self.max_bytes
            )));
        }
        self.segment_bytes = bytes;
        Ok(self)
    }

    /// The bound in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The sync policy.
    pub fn sync(&self) -> SyncPolicy {
        self.sync
    }
}

/// A queue that cannot be opened or read.
#[derive(Debug)]
pub enum QueueError {
    /// Settings out of range.
    Settings(String),
    /// Another process holds the queue's directory.
    Locked(PathBuf),
    /// A file operation failed.
    Io {
        /// What was being done.
        what: String,
        /// On which file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl fmt::Display for QueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueError::Settings(why) => write!(f, "queue settings: {why}"),
            QueueError::Locked(dir) => write!(
                f,
                "the queue {} is held by another process (one process per queue directory)",
                dir.display()
            ),
            QueueError::Io { what, path, source } => {
                write!(f, "{what} {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for QueueError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            QueueError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A record [`DiskQueue::append`] did not take: the caller still has it.
#[derive(Debug)]
pub enum AppendError {
    /// The queue is at its bound: wait for [`DiskQueue::space`].
    Full {
        /// Bytes the record's frame needs.
        needed: u64,
        /// Bytes on disk now.
        held: u64,
        /// The bound.
        max: u64,
    },
    /// Larger than the whole queue: it can never be taken.
    TooLarge {
        /// The record's length.
        len: usize,
        /// The bound.
        max: u64,
    },
    /// The file system has no room: the partial write was cut off, the
    /// queue is as it was. Wait for space (forwarding frees some) and try
    /// again.
    DiskFull(QueueError),
    /// Writing or syncing failed otherwise.
    Io(QueueError),
}

impl AppendError {
    /// Whether the same record may be taken later (full, or no room on
    /// the disk now).
    pub fn is_back_pressure(&self) -> bool {
        matches!(self, AppendError::Full { .. } | AppendError::DiskFull(_))
    }
}

impl fmt::Display for AppendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppendError::Full { needed, held, max } => write!(
                f,
                "the queue is full: {held} of {max} bytes held, {needed} more needed"
            ),
            AppendError::TooLarge { len, max } => write!(
                f,
                "a record of {len} bytes can never fit in a queue of {max} bytes"
            ),
            AppendError::DiskFull(e) => write!(f, "no room on the disk: {e}"),
            AppendError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for AppendError {}

impl From<QueueError> for AppendError {
    fn from(e: QueueError) -> Self {
        if is_storage_full(&e) {
            AppendError::DiskFull(e)
        } else {
            AppendError::Io(e)
        }
    }
}

/// Counts of a queue, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Records waiting to be forwarded.
    pub pending: u64,
    /// Bytes on disk (segments, forwarded parts of the oldest included).
    pub bytes: u64,
    /// The bound.
    pub max_bytes: u64,
    /// Records appended since open.
    pub appended: u64,
    /// Records forwarded (advanced past) since open.
    pub forwarded: u64,
    /// Bytes found damaged while reading after open (a disk error): the
    /// rest of that segment was skipped.
    pub damaged_bytes: u64,
}

/// The queue; see the [module](self) for its guarantees. Cloning shares
/// it.
#[derive(Clone)]
pub struct DiskQueue {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    settings: QueueSettings,
    state: Mutex<State>,
    /// Notified when a record is appended.
    appended: Event,
    /// Notified when bytes are freed.
    freed: Event,
    /// Held for the queue's life: the directory's lock.
    _lock: File,
}

struct State {
    segments: VecDeque<Segment>,
    /// The newest segment, written at its `len`.
    writer: File,
    read: Position,
    /// The segment being read, opened.
    reader: Option<(u64, File)>,
    /// The frame lengths of the records handed out (by
    /// [`DiskQueue::peek`] and [`DiskQueue::read_next`]) and not advanced
    /// past, oldest first: they start at `read`.
    handed: VecDeque<u64>,
    /// Where the next record [`DiskQueue::read_next`] hands out starts:
    /// `read` moved past every record in `handed`.
    ahead: Position,
    cursor: File,
    bytes: u64,
    /// Records not synced yet; the directory's entries changed.
    unsynced: bool,
    dir_changed: bool,
    cursor_unsynced: bool,
    stats: QueueStats,
    /// One buffer for a frame's header and record.
    frame: Vec<u8>,
}

impl DiskQueue {
    /// Opens (or creates) the queue in `dir`: takes its lock, cuts torn
    /// tails (counted in the [`Recovery`]) and places the cursor.
    pub fn open(
        dir: impl AsRef<Path>,
        settings: QueueSettings,
    ) -> Result<(DiskQueue, Recovery), QueueError> {
        let dir = dir.as_ref().to_owned();
        private_files::create_dir(&dir).map_err(|e| io_error("creating", &dir, e))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = open_to_write(&lock_path)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(QueueError::Locked(dir)),
            Err(TryLockError::Error(e)) => return Err(io_error("locking", &lock_path, e)),
        }
        let recovered = files::recover(&dir)?;
        let mut segments = recovered.segments;
        let mut dir_changed = false;
        if segments.is_empty() {
            segments.push_back(Segment {
                id: recovered.read.segment,
                len: 0,
            });
            dir_changed = true;
        }
        let newest = segments
            .back()
            .copied()
            .unwrap_or(Segment { id: 1, len: 0 });
        let writer = open_segment(&dir, newest.id)?;
        let cursor_path = dir.join(CURSOR_FILE);
        let cursor = open_to_write(&cursor_path)?;
        let bytes = segments.iter().map(|s| s.len).sum();
        let state = State {
            segments,
            writer,
            read: recovered.read,
            reader: None,
            handed: VecDeque::new(),
            ahead: recovered.read,
            cursor,
            bytes,
            unsynced: false,
            dir_changed,
            cursor_unsynced: true,
            stats: QueueStats {
                pending: recovered.recovery.pending,
                bytes,
                max_bytes: settings.max_bytes,
                ..QueueStats::default()
            },
            frame: Vec::new(),
        };
        let shared = Arc::new(Shared {
            dir,
            settings,
            state: Mutex::new(state),
            appended: Event::new(),
            freed: Event::new(),
            _lock: lock,
        });
        let queue = DiskQueue { shared };
        // The cursor as placed, and a new first segment, on disk now.
        queue.sync()?;
        let period = match settings.sync {
            SyncPolicy::Every(period) => period,
            // Appends sync themselves; the cursor is synced each second.
            SyncPolicy::EveryWrite => Duration::from_secs(1),
        };
        let weak = Arc::downgrade(&queue.shared);
        std::thread::Builder::new()
            .name("guard-queue-sync".to_owned())
            .spawn(move || sync_every(weak, period))
            .map_err(|e| io_error("starting the sync thread of", &queue.shared.dir, e))?;
        Ok((queue, recovered.recovery))
    }

    /// The queue's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The queue's settings.
    pub fn settings(&self) -> QueueSettings {
        self.shared.settings
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state as consistent
        // as any step of it: every field is updated after its file write.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends `record`, written before it returns (and synced, under
    /// [`SyncPolicy::EveryWrite`]). Blocks on the file system: call it
    /// where blocking is allowed.
    pub fn append(&self, record: &[u8]) -> Result<(), AppendError> {
        let max = self.shared.settings.max_bytes;
        let header = Header::of(record).map_err(|_| AppendError::TooLarge {
            len: record.len(),
            max,
        })?;
        let needed = header.frame_len() as u64;
        if needed > max {
            return Err(AppendError::TooLarge {
                len: record.len(),
                max,
            });
        }
        let mut guard = self.state();
        let state = &mut *guard;
        let segment_bytes = self.shared.settings.segment_bytes;
        // A newest segment all forwarded is started afresh once it holds
        // a quarter segment (not at every record: a consumer that keeps
        // up would make a file per record), so its bytes count no more.
        if self.all_forwarded(state) >= segment_bytes / 4 {
            self.roll(state)?;
        }
        if state.bytes.saturating_add(needed) > max {
            return Err(AppendError::Full {
                needed,
                held: state.bytes,
                max,
            });
        }
        let newest_len = state.segments.back().map_or(0, |s| s.len);
        if newest_len > 0 && newest_len.saturating_add(needed) > segment_bytes {
            self.roll(state)?;
        }
        state.frame.clear();
        state.frame.extend_from_slice(&header.to_bytes());
        state.frame.extend_from_slice(record);
        match self.write_frame(state) {
            Ok(()) => {}
            // No room on the disk, and forwarded bytes to give back: a
            // fresh segment, and one more try.
            Err(e) if is_storage_full(&e) && self.all_forwarded(state) > 0 => {
                self.roll(state)?;
                self.write_frame(state)?;
            }
            Err(e) => return Err(e.into()),
        }
        state.bytes = state.bytes.saturating_add(needed);
        state.stats.pending = state.stats.pending.saturating_add(1);
        state.stats.appended = state.stats.appended.saturating_add(1);
        drop(guard);
        self.shared.appended.notify(usize::MAX);
        Ok(())
    }

    /// The bytes of the newest segment if all of it is forwarded (0 if
    /// not, or empty).
    fn all_forwarded(&self, state: &State) -> u64 {
        match state.segments.back() {
            Some(newest) if state.read.segment == newest.id && state.read.offset >= newest.len => {
                newest.len
            }
            _ => 0,
        }
    }

    /// Writes the frame in `state.frame` at the end of the newest segment
    /// (synced under [`SyncPolicy::EveryWrite`]); on an error the partial
    /// frame is cut off, so the segment stays whole frames.
    fn write_frame(&self, state: &mut State) -> Result<(), QueueError> {
        // A queue always has a segment to write: `open` makes one and
        // only a segment before another is removed.
        let Some(newest) = state.segments.back_mut() else {
            return Ok(());
        };
        let path = || segment_path(&self.shared.dir, newest.id);
        if let Err(e) = state.writer.write_all_at(&state.frame, newest.len) {
            let _ = state.writer.set_len(newest.len);
            return Err(io_error("appending to", &path(), e));
        }
        if self.shared.settings.sync == SyncPolicy::EveryWrite
            && let Err(e) = state.writer.sync_data()
        {
            let _ = state.writer.set_len(newest.len);
            return Err(io_error("syncing", &path(), e));
        }
        newest.len = newest.len.saturating_add(state.frame.len() as u64);
        state.unsynced = self.shared.settings.sync != SyncPolicy::EveryWrite;
        Ok(())
    }

    /// Starts a new segment after the newest (synced first, so a sealed
    /// segment is whole on disk), and removes the old one if all of it
    /// is forwarded.
    fn roll(&self, state: &mut State) -> Result<(), QueueError> {
        let Some(old) = state.segments.back().copied() else {
            return Ok(());
        };
        let path = segment_path(&self.shared.dir, old.id);
        if state.unsynced {
            state
                .writer
                .sync_data()
                .map_err(|e| io_error("syncing", &path, e))?;
            state.unsynced = false;
        }
        let id = old.id.saturating_add(1);
        state.writer = open_segment(&self.shared.dir, id)?;
        state.segments.push_back(Segment { id, len: 0 });
        state.dir_changed = true;
        if state.read.segment == old.id && state.read.offset >= old.len {
            // All of it forwarded: it is the oldest (those before the one
            // being read are gone).
            self.remove_oldest(state, old)?;
        }
        if self.shared.settings.sync == SyncPolicy::EveryWrite {
            sync_dir(&self.shared.dir)?;
            state.dir_changed = false;
        }
        Ok(())
    }

    /// The oldest record not yet forwarded, if any (the same one until
    /// [`advance`](Self::advance)). Reading starts again at it: what
    /// [`read_next`](Self::read_next) handed out since is forgotten. One
    /// consumer reads a queue.
    pub fn peek(&self) -> Result<Option<Vec<u8>>, QueueError> {
        let mut state = self.state();
        state.handed.clear();
        self.read_ahead(&mut state)
    }

    /// The record after those handed out (by [`peek`](Self::peek) or
    /// this) and not advanced past, if any: with [`advance`](Self::advance)
    /// a window of records in flight at once, still advanced past in
    /// order. [`rewind`](Self::rewind) starts again at the oldest.
    pub fn read_next(&self) -> Result<Option<Vec<u8>>, QueueError> {
        let mut state = self.state();
        self.read_ahead(&mut state)
    }

    /// Forgets the records handed out and not advanced past: the next
    /// [`read_next`](Self::read_next) hands out the oldest again.
    pub fn rewind(&self) {
        self.state().handed.clear();
    }

    /// Records handed out and not advanced past.
    pub fn handed_out(&self) -> usize {
        self.state().handed.len()
    }

    /// Reads the record at `ahead` (the oldest when nothing is handed
    /// out) and hands it out.
    fn read_ahead(&self, state: &mut State) -> Result<Option<Vec<u8>>, QueueError> {
        loop {
            // Nothing handed out: read at the head, which skips what is
            // forwarded or damaged for good. Past it, anything unusual
            // ends the window and waits until it is the head.
            let at_head = state.handed.is_empty();
            if at_head {
                state.ahead = state.read;
            }
            let Some(index) = state
                .segments
                .iter()
                .position(|s| s.id == state.ahead.segment)
            else {
                return Ok(None);
            };
            let current = state.segments[index];
            let is_newest = index + 1 == state.segments.len();
            if state.ahead.offset >= current.len {
                if is_newest {
                    return Ok(None);
                }
                if at_head {
                    self.remove_oldest(state, current)?;
                } else {
                    state.ahead = Position {
                        segment: state.segments[index + 1].id,
                        offset: 0,
                    };
                }
                continue;
            }
            let reader = match state.reader.take() {
                Some((id, file)) if id == current.id => file,
                _ => {
                    let path = segment_path(&self.shared.dir, current.id);
                    private_files::open(private_files::options().read(true), &path)
                        .map_err(|e| io_error("opening", &path, e))?
                }
            };
            let read = read_frame(&reader, state.ahead.offset, current.len);
            state.reader = Some((current.id, reader));
            match read {
                Ok(Some(record)) => {
                    let len = (HEADER_LEN + record.len()) as u64;
                    state.ahead.offset = state.ahead.offset.saturating_add(len);
                    state.handed.push_back(len);
                    return Ok(Some(record));
                }
                Ok(None) if !at_head => return Ok(None),
                Ok(None) => {
                    // Damaged after it was written whole (the disk): the
                    // rest of the segment cannot be placed; skip it,
                    // counted.
                    let rest = current.len.saturating_sub(state.read.offset);
                    state.stats.damaged_bytes = state.stats.damaged_bytes.saturating_add(rest);
                    tracing::error!(
                        "queue {}: a record of segment {} at {} fails its checksum; the segment's last {rest} bytes are skipped",
                        self.shared.dir.display(),
                        current.id,
                        state.read.offset
                    );
                    if is_newest {
                        // Appends continue after the damage; reading
                        // resumes with them.
                        state.read.offset = current.len;
                        return Ok(None);
                    }
                    self.remove_oldest(state, current)?;
                }
                Err(e) => {
                    let path = segment_path(&self.shared.dir, current.id);
                    return Err(io_error("reading", &path, e));
                }
            }
        }
    }

    /// Moves past the oldest record handed out ([`peek`](Self::peek),
    /// [`read_next`](Self::read_next)): it was forwarded. Frees its
    /// segment once all of it is. Nothing handed out: nothing moves.
    pub fn advance(&self) -> Result<(), QueueError> {
        let mut state = self.state();
        let state = &mut *state;
        let Some(len) = state.handed.pop_front() else {
            return Ok(());
        };
        state.read.offset = state.read.offset.saturating_add(len);
        state.stats.pending = state.stats.pending.saturating_sub(1);
        state.stats.forwarded = state.stats.forwarded.saturating_add(1);
        if let Some(current) = state.segments.front().copied()
            && state.read.offset >= current.len
            && state.segments.len() > 1
        {
            self.remove_oldest(state, current)?;
        }
        self.write_cursor(state)
    }

    /// Removes the oldest segment, all of it forwarded.
    fn remove_oldest(&self, state: &mut State, oldest: Segment) -> Result<(), QueueError> {
        let next = state
            .segments
            .get(1)
            .map_or(oldest.id.saturating_add(1), |s| s.id);
        state.read = Position {
            segment: next,
            offset: 0,
        };
        // The cursor first: a crash between the two finds a cursor at a
        // segment that starts after the one still on disk, removed then.
        self.write_cursor(state)?;
        state.reader = None;
        let path = segment_path(&self.shared.dir, oldest.id);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error("removing a forwarded segment", &path, e)),
        }
        state.segments.pop_front();
        state.bytes = state.bytes.saturating_sub(oldest.len);
        state.dir_changed = true;
        self.shared.freed.notify(usize::MAX);
        Ok(())
    }

    fn write_cursor(&self, state: &mut State) -> Result<(), QueueError> {
        state
            .cursor
            .write_all_at(&cursor_bytes(state.read), 0)
            .map_err(|e| io_error("writing", &self.shared.dir.join(CURSOR_FILE), e))?;
        state.cursor_unsynced = true;
        Ok(())
    }

    /// Syncs what was appended, the cursor and the directory's entries
    /// now (the sync thread does it every period).
    pub fn sync(&self) -> Result<(), QueueError> {
        let mut state = self.state();
        let dir = &self.shared.dir;
        if state.unsynced {
            let newest = state.segments.back().map_or(0, |s| s.id);
            state
                .writer
                .sync_data()
                .map_err(|e| io_error("syncing", &segment_path(dir, newest), e))?;
            state.unsynced = false;
        }
        if state.cursor_unsynced {
            let at = state.read;
            let path = dir.join(CURSOR_FILE);
            state
                .cursor
                .write_all_at(&cursor_bytes(at), 0)
                .and_then(|()| state.cursor.sync_data())
                .map_err(|e| io_error("syncing", &path, e))?;
            state.cursor_unsynced = false;
        }
        if state.dir_changed {
            sync_dir(dir)?;
            state.dir_changed = false;
        }
        Ok(())
    }

    /// The counts now.
    pub fn stats(&self) -> QueueStats {
        let state = self.state();
        QueueStats {
            bytes: state.bytes,
            ..state.stats
        }
    }

    /// Waits until a record is there to [`peek`](Self::peek).
    pub async fn appended(&self) {
        loop {
            let listener = self.shared.appended.listen();
            if self.state().stats.pending > 0 {
                return;
            }
            listener.await;
        }
    }

    /// Waits until a record is there that [`read_next`](Self::read_next)
    /// has not handed out.
    pub async fn unread(&self) {
        loop {
            let listener = self.shared.appended.listen();
            {
                let state = self.state();
                if state.stats.pending > state.handed.len() as u64 {
                    return;
                }
            }
            listener.await;
        }
    }

    /// Waits until forwarding next frees bytes (a segment removed or
    /// started afresh): what a writer the disk had no room for waits for,
    /// beside a timer (other files may free the disk too).
    pub async fn freed(&self) {
        self.shared.freed.listen().await;
    }

    /// Waits until a record of `len` bytes fits under the bound
    /// (forwarding freed a segment), or the queue is empty.
    pub async fn space(&self, len: usize) {
        let needed = (len as u64).saturating_add(HEADER_LEN as u64);
        let max = self.shared.settings.max_bytes;
        loop {
            let listener = self.shared.freed.listen();
            let held = self.state().bytes;
            if held == 0 || held.saturating_add(needed) <= max {
                return;
            }
            listener.await;
        }
    }
}

fn is_storage_full(e: &QueueError) -> bool {
    matches!(e, QueueError::Io { source, .. } if source.kind() == io::ErrorKind::StorageFull)
}

fn open_segment(dir: &Path, id: u64) -> Result<File, QueueError> {
    open_to_write(&segment_path(dir, id))
}

/// `path` opened to write, made `0600` if missing, its bytes kept; never
/// through a link.
pub(crate) fn open_to_write(path: &Path) -> Result<File, QueueError> {
    private_files::open(
        private_files::options()
            .create(true)
            .truncate(false)
            .write(true),
        path,
    )
    .map_err(|e| io_error("opening", path, e))
}

fn sync_dir(dir: &Path) -> Result<(), QueueError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("syncing the directory", dir, e))
}

/// The record of the frame at `offset` of a segment whose whole frames
/// end at `len`; `None` if it fails its checksum.
fn read_frame(file: &File, offset: u64, len: u64) -> io::Result<Option<Vec<u8>>> {
    let mut head = [0u8; HEADER_LEN];
    if offset.saturating_add(HEADER_LEN as u64) > len {
        return Ok(None);
    }
    file.read_exact_at(&mut head, offset)?;
    let header = Header::from_bytes(head);
    let start = offset.saturating_add(HEADER_LEN as u64);
    if start.saturating_add(header.record_len() as u64) > len {
        return Ok(None);
    }
    let mut record = vec![0u8; header.record_len()];
    file.read_exact_at(&mut record, start)?;
    Ok(header.verifies(&record).then_some(record))
}

fn sync_every(queue: Weak<Shared>, period: Duration) {
    loop {
        std::thread::sleep(period);
        let Some(shared) = queue.upgrade() else {
            return;
        };
        let queue = DiskQueue { shared };
        if let Err(e) = queue.sync() {
            tracing::error!("{e}");
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = state.writer.sync_data();
        let _ = state
            .cursor
            .write_all_at(&cursor_bytes(state.read), 0)
            .and_then(|()| state.cursor.sync_data());
    }
}

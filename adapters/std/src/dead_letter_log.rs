//! Dead letters on disk: a bounded log that one process appends to while
//! others list, remove or purge, each letter under an id of its own.
//!
//! The log is a directory holding `letters`, a file of guard-core
//! [`frame`]s, and `letters.lock`, the lock every operation
//! takes (so a tool may work on the letters of a running process). A
//! letter is kept until it is removed; removing rewrites the file without
//! it (a new file renamed over the old, so a crash leaves one or the
//! other, whole).
//!
//! Guarantees:
//!
//! - **A letter appended is on disk when [`append`] returns**
//!   (`fdatasync`): dead letters are few, and each is the last trace of a
//!   message.
//! - **Bounded**: the file never holds more than `max_bytes`; a letter
//!   that does not fit is handed back ([`AppendError::Full`]), for the
//!   caller to count.
//! - **A torn tail is cut when the log is opened, and counted**
//!   ([`DeadLetterLog::open`]): a crash in the middle of an append loses
//!   that letter only.
//! - **Ids increase** (microseconds since the epoch, or one more than the
//!   last when the clock is not past it) and are never reused while the
//!   file holds a letter.
//!
//! ```
//! use guard_std::dead_letter_log::DeadLetterLog;
//!
//! let dir = std::env::temp_dir().join(format!("guard-doc-dlq-{}", std::process::id()));
//! let (log, _lost) = DeadLetterLog::open(&dir, 1 << 20)?;
//! let id = log.append(b"a message the sink refused")?;
//! let letters = log.list()?;
//! assert_eq!(letters.len(), 1);
//! assert_eq!((letters[0].id, &letters[0].body[..]), (id, &b"a message the sink refused"[..]));
//! assert_eq!(log.remove(&[id])?, 1);
//! assert!(log.list()?.is_empty());
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`append`]: DeadLetterLog::append

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use guard_core::frame::{self, HEADER_LEN, Header, Next};

use crate::disk_queue::{AppendError, QueueError, io_error, open_to_write};
use crate::private_files;

/// The letters' file in the log's directory.
const LETTERS: &str = "letters";
/// The file every operation locks (its own name: a queue's directory
/// has a `lock` of its own, which a queue holds for its whole life).
const LOCK: &str = "letters.lock";
/// A letter's id, before its body.
const ID_LEN: usize = 8;

/// A letter as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Letter {
    /// Its id.
    pub id: u64,
    /// What was appended.
    pub body: Vec<u8>,
}

/// A log of dead letters; see the [module](self).
pub struct DeadLetterLog {
    dir: PathBuf,
    max_bytes: u64,
    /// The last id this process gave.
    last_id: Mutex<u64>,
}

impl DeadLetterLog {
    /// Opens (or creates) the log in `dir`, at most `max_bytes` (at least
    /// 4 KiB): a torn tail left by a crash is cut, its bytes returned.
    pub fn open(dir: impl AsRef<Path>, max_bytes: u64) -> Result<(Self, u64), QueueError> {
        if max_bytes < crate::disk_queue::MIN_MAX_BYTES {
            return Err(QueueError::Settings(format!(
                "max_bytes is {max_bytes}: dead letters need at least {} bytes",
                crate::disk_queue::MIN_MAX_BYTES
            )));
        }
        let dir = dir.as_ref().to_owned();
        private_files::create_dir(&dir).map_err(|e| io_error("creating", &dir, e))?;
        let log = DeadLetterLog {
            dir,
            max_bytes,
            last_id: Mutex::new(0),
        };
        let lost = log.locked(|path| {
            let bytes = read(path)?;
            let scan = frame::scan(&bytes);
            let lost = scan.lost(bytes.len()) as u64;
            if lost > 0 {
                let file = private_files::open(private_files::options().write(true), path)
                    .map_err(|e| io_error("opening", path, e))?;
                file.set_len(scan.valid as u64)
                    .and_then(|()| file.sync_all())
                    .map_err(|e| io_error("cutting the torn tail of", path, e))?;
            }
            Ok(lost)
        })?;
        Ok((log, lost))
    }

    /// Opens an existing log as a tool does (listing, removing from a
    /// running process's letters): nothing is created, and a torn or
    /// damaged tail is left in place for the process that writes to cut
    /// and report; its bytes are returned.
    pub fn inspect(dir: impl AsRef<Path>, max_bytes: u64) -> Result<(Self, u64), QueueError> {
        let dir = dir.as_ref().to_owned();
        // As the writer does: a link or another user's directory is
        // refused before anything is created in it.
        private_files::check_dir(&dir).map_err(|e| io_error("no dead letters at", &dir, e))?;
        let log = DeadLetterLog {
            dir,
            max_bytes,
            last_id: Mutex::new(0),
        };
        let unreadable = log.locked(|path| {
            let bytes = read(path)?;
            Ok(frame::scan(&bytes).lost(bytes.len()) as u64)
        })?;
        Ok((log, unreadable))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bytes the letters take on disk now (without the lock: a
    /// letter being written may be counted in part).
    pub fn bytes(&self) -> Result<u64, QueueError> {
        let path = self.dir.join(LETTERS);
        match fs::metadata(&path) {
            Ok(meta) => Ok(meta.len()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(io_error("reading the size of", &path, e)),
        }
    }

    /// The bound on [`bytes`](Self::bytes).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Runs `work` on the letters' path with the log's lock held.
    fn locked<T>(
        &self,
        work: impl FnOnce(&Path) -> Result<T, QueueError>,
    ) -> Result<T, QueueError> {
        let lock_path = self.dir.join(LOCK);
        let lock = open_to_write(&lock_path)?;
        lock.lock()
            .map_err(|e| io_error("locking", &lock_path, e))?;
        // Unlocked when `lock` closes, whatever `work` did.
        work(&self.dir.join(LETTERS))
    }

    /// Appends a letter, synced before it returns: its id.
    pub fn append(&self, body: &[u8]) -> Result<u64, AppendError> {
        let mut record = Vec::with_capacity(ID_LEN + body.len());
        let id = self.next_id();
        record.extend_from_slice(&id.to_le_bytes());
        record.extend_from_slice(body);
        let header = Header::of(&record).map_err(|_| AppendError::TooLarge {
            len: body.len(),
            max: self.max_bytes,
        })?;
        let needed = header.frame_len() as u64;
        if needed > self.max_bytes {
            return Err(AppendError::TooLarge {
                len: body.len(),
                max: self.max_bytes,
            });
        }
        let mut framed = Vec::with_capacity(HEADER_LEN + record.len());
        framed.extend_from_slice(&header.to_bytes());
        framed.extend_from_slice(&record);
        let outcome = self.locked(|path| {
            let mut file =
                private_files::open(private_files::options().create(true).append(true), path)
                    .map_err(|e| io_error("opening", path, e))?;
            let held = file
                .metadata()
                .map_err(|e| io_error("reading the size of", path, e))?
                .len();
            if held.saturating_add(needed) > self.max_bytes {
                return Ok(Err(AppendError::Full {
                    needed,
                    held,
                    max: self.max_bytes,
                }));
            }
            if let Err(e) = file.write_all(&framed).and_then(|()| file.sync_data()) {
                // Cut what was written of it: the file stays whole frames.
                let _ = file.set_len(held);
                return Err(io_error("appending to", path, e));
            }
            Ok(Ok(()))
        });
        match outcome {
            Ok(Ok(())) => Ok(id),
            Ok(Err(full)) => Err(full),
            Err(e) => Err(e.into()),
        }
    }

    fn next_id(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let mut last = self
            .last_id
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *last = now.max(last.saturating_add(1));
        *last
    }

    /// Every letter, oldest first.
    pub fn list(&self) -> Result<Vec<Letter>, QueueError> {
        self.locked(|path| Ok(letters(&read(path)?)))
    }

    /// Removes the letters with these ids: how many there were.
    pub fn remove(&self, ids: &[u64]) -> Result<usize, QueueError> {
        self.rewrite(|letter| ids.contains(&letter.id))
    }

    /// Removes every letter: how many there were.
    pub fn purge(&self) -> Result<usize, QueueError> {
        self.rewrite(|_| true)
    }

    /// Rewrites the file without the letters `drop` picks: a new file,
    /// synced, renamed over the old.
    fn rewrite(&self, drop: impl Fn(&Letter) -> bool) -> Result<usize, QueueError> {
        self.locked(|path| {
            let bytes = read(path)?;
            let mut kept = Vec::with_capacity(bytes.len());
            let mut removed = 0;
            let mut at = 0;
            while let Next::Record { record, next } = frame::next(&bytes, at) {
                let frame_bytes = bytes.get(at..next).unwrap_or_default();
                at = next;
                match letter(record) {
                    Some(letter) if drop(&letter) => removed += 1,
                    _ => kept.extend_from_slice(frame_bytes),
                }
            }
            if removed == 0 {
                return Ok(0);
            }
            // What cannot be read is kept as it is, for the writer to cut
            // and count.
            kept.extend_from_slice(bytes.get(at..).unwrap_or_default());
            let new = self.dir.join(format!("{LETTERS}.new"));
            private_files::open(
                private_files::options()
                    .write(true)
                    .create(true)
                    .truncate(true),
                &new,
            )
            .and_then(|mut f| f.write_all(&kept).and_then(|()| f.sync_all()))
            .map_err(|e| io_error("writing", &new, e))?;
            fs::rename(&new, path).map_err(|e| io_error("replacing", path, e))?;
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_error("syncing the directory", &self.dir, e))?;
            Ok(removed)
        })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, QueueError> {
    match private_files::read(path) {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io_error("reading", path, e)),
    }
}

fn letter(record: &[u8]) -> Option<Letter> {
    let (id, body) = record.split_first_chunk::<ID_LEN>()?;
    Some(Letter {
        id: u64::from_le_bytes(*id),
        body: body.to_vec(),
    })
}

/// The whole letters of a file, in order (a torn tail, only possible
/// while a crashed writer's log is not yet reopened, ends the list).
fn letters(bytes: &[u8]) -> Vec<Letter> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Next::Record { record, next } = frame::next(bytes, at) {
        at = next;
        out.extend(letter(record));
    }
    out
}

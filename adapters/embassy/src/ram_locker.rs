//! A `Locker` in RAM for tasks on one device: the no_std twin of
//! guard-std's `LocalLocker`, with a fixed table and embassy-time expiry.

use core::cell::RefCell;
use core::fmt;

use embassy_sync::blocking_mutex::Mutex;
use embassy_sync::blocking_mutex::raw::RawMutex;
use embassy_time::Instant;
use guard_core::lock::{LeaseRenewer, Locker, Renewal, Token, TokenId, Ttl, UnlockError};

use crate::time::duration_to_embassy;

/// Why a [`RamLocker`] refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RamLockerError {
    /// Every slot holds a live lock: nothing was granted.
    TableFull,
    /// The key is longer than the table's key capacity, or empty.
    BadKey,
}

impl fmt::Display for RamLockerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RamLockerError::TableFull => f.write_str("every lock slot holds a live lock"),
            RamLockerError::BadKey => f.write_str("lock key empty or longer than the table allows"),
        }
    }
}

impl core::error::Error for RamLockerError {}

struct Held<const K: usize> {
    key: heapless::String<K>,
    token: Token,
    expires: Instant,
}

struct Table<const N: usize, const K: usize> {
    slots: [Option<Held<K>>; N],
    /// The last fence handed out: fences increase across all keys.
    fence: u64,
}

/// Up to `N` live locks with keys of up to `K` bytes, shared by the tasks
/// of one device (a `static` with a `CriticalSectionRawMutex`, or a
/// `NoopRawMutex` within one executor). Expired locks free their slot; a
/// full table refuses with [`RamLockerError::TableFull`] rather than
/// evicting a live lock.
pub struct RamLocker<M: RawMutex, const N: usize, const K: usize = 64> {
    table: Mutex<M, RefCell<Table<N, K>>>,
}

impl<M: RawMutex, const N: usize, const K: usize> Default for RamLocker<M, N, K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M: RawMutex, const N: usize, const K: usize> fmt::Debug for RamLocker<M, N, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RamLocker")
            .field("slots", &N)
            .field("key_bytes", &K)
            .finish()
    }
}

impl<M: RawMutex, const N: usize, const K: usize> RamLocker<M, N, K> {
    /// An empty table (usable in a `static`).
    pub const fn new() -> Self {
        RamLocker {
            table: Mutex::new(RefCell::new(Table {
                slots: [const { None }; N],
                fence: 0,
            })),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Table<N, K>) -> R) -> R {
        self.table.lock(|table| f(&mut table.borrow_mut()))
    }
}

impl<const N: usize, const K: usize> Table<N, K> {
    /// The live lock of `key`, after freeing every expired one.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Held<K>> {
        for slot in self.slots.iter_mut() {
            if slot.as_ref().is_some_and(|h| h.expires <= now) {
                *slot = None;
            }
        }
        self.slots
            .iter_mut()
            .flatten()
            .find(|held| held.key.as_str() == key)
    }
}

/// When a lock taken at `now` for `ttl` expires (saturating).
fn expiry(now: Instant, ttl: Ttl) -> Instant {
    now.checked_add(duration_to_embassy(ttl.as_duration()))
        .unwrap_or(Instant::MAX)
}

impl<M: RawMutex, const N: usize, const K: usize> Locker for RamLocker<M, N, K> {
    type Error = RamLockerError;

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, RamLockerError> {
        let owned = heapless::String::<K>::try_from(key).map_err(|_| RamLockerError::BadKey)?;
        if owned.is_empty() {
            return Err(RamLockerError::BadKey);
        }
        let now = Instant::now();
        self.with(|table| {
            if table.live(key, now).is_some() {
                return Ok(None);
            }
            let fence = table.fence.saturating_add(1);
            let slot = table
                .slots
                .iter_mut()
                .find(|s| s.is_none())
                .ok_or(RamLockerError::TableFull)?;
            table.fence = fence;
            // Unique per grant on this device: the fence is.
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&fence.to_le_bytes());
            let token = Token::new(TokenId(id), fence);
            *slot = Some(Held {
                key: owned,
                token,
                expires: expiry(now, ttl),
            });
            Ok(Some(token))
        })
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<RamLockerError>> {
        let now = Instant::now();
        self.with(|table| {
            table.live(key, now);
            let slot = table
                .slots
                .iter_mut()
                .find(|s| {
                    s.as_ref()
                        .is_some_and(|h| h.key.as_str() == key && h.token.id() == token.id())
                })
                .ok_or(UnlockError::NotHeld)?;
            *slot = None;
            Ok(())
        })
    }
}

impl<M: RawMutex, const N: usize, const K: usize> LeaseRenewer for RamLocker<M, N, K> {
    async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, RamLockerError> {
        let now = Instant::now();
        self.with(|table| match table.live(key, now) {
            Some(held) if held.token.id() == token.id() => {
                held.expires = expiry(now, ttl);
                Ok(Renewal::Held)
            }
            _ => Ok(Renewal::Lost),
        })
    }
}

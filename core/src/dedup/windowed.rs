//! Time-windowed deduplication with bounded memory.

use core::hash::{BuildHasher, Hash};
use core::time::Duration;

use super::{CapacityExceeded, Deduplicator, ZeroWindow};
use crate::limit::DefaultHashState;
use crate::table::{SetTable, hash_of};
use crate::time::Instant;

const DEFAULT_SEED: u64 = 0x6775_6172_645f_6464; // "guard_dd"

/// Remembers up to `N` items, each for `window` after it was **last** seen.
///
/// An item seen again inside its window is a duplicate and its window
/// restarts (last-seen refresh). The boundary is open: an item last seen
/// exactly `window` ago is no longer a duplicate. A clock read out of order
/// never moves an item's last-seen instant backwards.
///
/// When full: an item whose window has passed is forgotten to make room;
/// if none has, the new item is refused with [`CapacityExceeded`] rather
/// than forgetting a live one (which would let its next copy through).
/// `N` must be positive and, above 8, a multiple of 8.
///
/// ```
/// use core::time::Duration;
/// use guard_core::dedup::{Deduplicator, WindowedDeduplicator};
/// use guard_core::time::Instant;
///
/// let mut seen: WindowedDeduplicator<u64, 64> =
///     WindowedDeduplicator::new(Duration::from_secs(60))?;
/// let t = Instant::from_secs(100);
/// assert_eq!(seen.check_and_mark(&42, t), Ok(false)); // new
/// assert_eq!(seen.check_and_mark(&42, t + Duration::from_secs(59)), Ok(true));
/// // Last seen at t + 59 s: the window now ends at t + 119 s.
/// assert_eq!(seen.check_and_mark(&42, t + Duration::from_secs(119)), Ok(false));
/// # Ok::<(), guard_core::dedup::ZeroWindow>(())
/// ```
#[derive(Clone, Debug)]
pub struct WindowedDeduplicator<K, const N: usize, S = DefaultHashState> {
    window: Duration,
    hasher: S,
    last_seen: SetTable<K, Instant, N>,
}

impl<K: Hash + Eq + Clone, const N: usize> WindowedDeduplicator<K, N, DefaultHashState> {
    /// Remembers each item for `window` after it was last seen; a zero
    /// window would remember nothing and is refused.
    pub const fn new(window: Duration) -> Result<Self, ZeroWindow> {
        if window.is_zero() {
            return Err(ZeroWindow);
        }
        Ok(WindowedDeduplicator {
            window,
            hasher: DefaultHashState::with_seed(DEFAULT_SEED),
            last_seen: SetTable::new(),
        })
    }
}

impl<K: Hash + Eq + Clone, const N: usize, S: BuildHasher> WindowedDeduplicator<K, N, S> {
    /// As [`WindowedDeduplicator::new`], hashing items with `hasher`.
    pub fn with_hasher(window: Duration, hasher: S) -> Result<Self, ZeroWindow> {
        if window.is_zero() {
            return Err(ZeroWindow);
        }
        Ok(WindowedDeduplicator {
            window,
            hasher,
            last_seen: SetTable::new(),
        })
    }

    /// The window.
    pub const fn window(&self) -> Duration {
        self.window
    }

    /// The most items it can remember.
    pub const fn capacity(&self) -> usize {
        N
    }

    fn in_window(&self, last_seen: Instant, now: Instant) -> bool {
        now.saturating_duration_since(last_seen) < self.window
    }

    /// Forgets items whose window has passed; returns how many.
    pub fn purge(&mut self, now: Instant) -> usize {
        let window = self.window;
        self.last_seen
            .remove_where(|_, &seen| now.saturating_duration_since(seen) >= window)
    }

    /// Forgets `item`; returns whether it was remembered.
    pub fn forget(&mut self, item: &K) -> bool {
        let hash = hash_of(&self.hasher, item);
        self.last_seen.remove(hash, item).is_some()
    }

    /// Records `item` at `now`: refreshes it if remembered, else stores it.
    /// Returns whether it was a duplicate before this call.
    fn record(&mut self, item: &K, now: Instant) -> Result<bool, CapacityExceeded> {
        let hash = hash_of(&self.hasher, item);
        if let Some(index) = self.last_seen.find(hash, item) {
            let window = self.window;
            if let Some((_, seen)) = self.last_seen.entry_mut(index) {
                let duplicate = now.saturating_duration_since(*seen) < window;
                if now > *seen {
                    *seen = now;
                }
                return Ok(duplicate);
            }
        }
        let (window, hasher) = (self.window, &self.hasher);
        self.last_seen
            .insert(
                hash,
                item.clone(),
                now,
                |&seen| now.saturating_duration_since(seen) >= window,
                |k| hash_of(hasher, k),
            )
            .map(|_| false)
            .map_err(|_| CapacityExceeded)
    }
}

impl<K: Hash + Eq + Clone, const N: usize, S: BuildHasher> Deduplicator<K>
    for WindowedDeduplicator<K, N, S>
{
    fn is_duplicate(&self, item: &K, now: Instant) -> bool {
        let hash = hash_of(&self.hasher, item);
        self.last_seen
            .find(hash, item)
            .and_then(|i| self.last_seen.entry(i))
            .is_some_and(|&(_, seen)| self.in_window(seen, now))
    }

    fn mark_as_seen(&mut self, item: &K, now: Instant) -> Result<(), CapacityExceeded> {
        self.record(item, now).map(|_| ())
    }

    fn check_and_mark(&mut self, item: &K, now: Instant) -> Result<bool, CapacityExceeded> {
        self.record(item, now)
    }

    fn clear(&mut self) {
        self.last_seen.clear();
    }

    fn unique_count(&self, now: Instant) -> usize {
        self.last_seen
            .iter()
            .filter(|&(_, &seen)| self.in_window(seen, now))
            .count()
    }
}

//! A fixed-capacity hash table with bounded work per operation.
//!
//! `N` slots are split into sets of [`WAYS`]; a key may live in one of two
//! sets chosen by its hash ("two choices"), so every lookup and insert
//! touches at most `2 * WAYS` slots whatever the load, and the table fills
//! close to `N` before a set pair runs out of room. The table never evicts
//! on its own: the caller says which values may be forgotten. This is what
//! keeps eviction semantically transparent for limiters and deduplicators.
//!
//! The slots live in storage of type `B`: an inline array by default (so a
//! table can be a `static`), or anything that lends out that array, such
//! as a `Box<[KeyedSlot; N]>` that a caller with an allocator built on the
//! heap. Lending the array rather than a slice keeps `N` known to the
//! compiler, so lookups compile as they do over the inline array.

use core::borrow::{Borrow, BorrowMut};
use core::hash::{BuildHasher, Hash};
use core::marker::PhantomData;

/// Slots per set.
pub(crate) const WAYS: usize = 8;

/// One slot of a keyed table: empty, or a key and its state (the size of
/// an `Option<(K, V)>`).
///
/// Its content is private: a caller builds storage from
/// [`KeyedSlot::EMPTY`] (or `Default`) and hands it to
/// [`crate::limit::Keyed::with_storage`], which empties the slots again
/// in case they come from an earlier table. So the table alone decides
/// which set each key sits in.
#[derive(Clone, Debug)]
pub struct KeyedSlot<K, V>(Option<(K, V)>);

impl<K, V> KeyedSlot<K, V> {
    /// An empty slot.
    pub const EMPTY: Self = KeyedSlot(None);
}

impl<K, V> Default for KeyedSlot<K, V> {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// A table of at most `N` keys in storage `B`; see the module notes.
#[derive(Clone, Debug)]
pub(crate) struct SetTable<K, V, const N: usize, B = [KeyedSlot<K, V>; N]> {
    slots: B,
    len: usize,
    /// `B` holds the entries; this only names their types.
    entries: PhantomData<(K, V)>,
}

/// The slot range of set `set`, for a table of `n` slots.
const fn set_range(n: usize, set: usize) -> core::ops::Range<usize> {
    let ways = ways(n);
    let start = set.saturating_mul(ways);
    start..start.saturating_add(ways)
}

const fn ways(n: usize) -> usize {
    if n < WAYS { n } else { WAYS }
}

const fn sets(n: usize) -> usize {
    if n < WAYS { 1 } else { n / WAYS }
}

/// The two candidate sets of a hash. Multiply-shift maps a 64-bit hash onto
/// `0..sets` without division and uses its high bits.
fn candidate_sets(n: usize, hash: u64) -> [usize; 2] {
    let sets = sets(n) as u128;
    // (h * sets) >> 64 < sets <= usize::MAX, so the cast never truncates.
    #[allow(clippy::cast_possible_truncation)]
    let pick = |h: u64| ((u128::from(h).wrapping_mul(sets)) >> 64) as usize;
    // The second choice comes from a remix of the hash so that keys sharing
    // their first set spread over different second sets.
    let second = hash.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
    [pick(hash), pick(second.wrapping_mul(0xbf58_476d_1ce4_e5b9))]
}

/// The 64-bit hash the table uses for `key`.
pub(crate) fn hash_of<K: Hash + ?Sized, S: BuildHasher>(hasher: &S, key: &K) -> u64 {
    hasher.hash_one(key)
}

impl<K, V, const N: usize> SetTable<K, V, N> {
    /// An empty table with its slots inline (usable in a `static`).
    pub(crate) const fn new() -> Self {
        Self::assert_capacity();
        SetTable {
            slots: [const { KeyedSlot::EMPTY }; N],
            len: 0,
            entries: PhantomData,
        }
    }
}

impl<K, V, const N: usize, B> SetTable<K, V, N, B> {
    /// Stops the build of a table whose capacity the sets cannot divide.
    const fn assert_capacity() {
        const {
            assert!(
                N > 0 && (N <= WAYS || N.is_multiple_of(WAYS)),
                "table capacity must be positive and, above 8, a multiple of 8"
            )
        };
    }
}

impl<K: Eq, V, const N: usize, B: BorrowMut<[KeyedSlot<K, V>; N]>> SetTable<K, V, N, B> {
    /// An empty table whose slots live in `slots`. Whatever they hold is
    /// dropped first: a borrowed array may come from an earlier table, and
    /// its entries would be counted nowhere (and, under another hasher,
    /// sit in sets where no lookup finds them).
    pub(crate) fn with_slots(slots: B) -> Self {
        Self::assert_capacity();
        let mut table = SetTable {
            slots,
            len: 0,
            entries: PhantomData,
        };
        table.clear();
        table
    }

    /// What slot `index` holds; `None` past the end.
    fn slot(&self, index: usize) -> Option<&Option<(K, V)>> {
        self.slots.borrow().get(index).map(|slot| &slot.0)
    }

    /// What slot `index` holds, mutably; `None` past the end.
    fn slot_mut(&mut self, index: usize) -> Option<&mut Option<(K, V)>> {
        self.slots
            .borrow_mut()
            .get_mut(index)
            .map(|slot| &mut slot.0)
    }

    /// Every slot's content, mutably.
    fn slots_mut(&mut self) -> impl Iterator<Item = &mut Option<(K, V)>> {
        self.slots.borrow_mut().iter_mut().map(|slot| &mut slot.0)
    }

    /// Keys stored.
    pub(crate) const fn len(&self) -> usize {
        self.len
    }

    /// The slot holding `key`, if any.
    pub(crate) fn find<Q: Eq + ?Sized>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
    {
        let [a, b] = candidate_sets(N, hash);
        let in_set = |set: usize| {
            set_range(N, set).find(|&i| {
                self.slot(i)
                    .and_then(Option::as_ref)
                    .is_some_and(|(k, _)| k.borrow() == key)
            })
        };
        in_set(a).or_else(|| if b == a { None } else { in_set(b) })
    }

    /// The entry in slot `index`.
    pub(crate) fn entry(&self, index: usize) -> Option<&(K, V)> {
        self.slot(index).and_then(Option::as_ref)
    }

    /// The entry in slot `index`, mutably.
    pub(crate) fn entry_mut(&mut self, index: usize) -> Option<&mut (K, V)> {
        self.slot_mut(index).and_then(Option::as_mut)
    }

    /// Inserts a key known to be absent where [`Self::vacancy`] finds
    /// room; when there is none the key and value come back.
    pub(crate) fn insert(
        &mut self,
        hash: u64,
        key: K,
        value: V,
        forgettable: impl Fn(&V) -> bool,
        rehash: impl Fn(&K) -> u64,
    ) -> Result<(), (K, V)> {
        match self.vacancy(hash, forgettable, rehash) {
            Some(index) => {
                self.put(index, key, value);
                Ok(())
            }
            None => Err((key, value)),
        }
    }

    /// A slot for a key known to be absent: a free slot of its less loaded
    /// candidate set, else one whose entry `forgettable` allows to be
    /// replaced, else a slot freed by moving one resident of its two sets
    /// to that resident's other set (`rehash` gives a resident's hash),
    /// into a free slot there or, failing that, over an entry there that
    /// `forgettable` allows to be replaced. `None` when none of these
    /// exists: every slot of the key's two sets, and of their residents'
    /// other sets, holds an entry that may not be forgotten.
    ///
    /// An entry still in the returned slot is the forgettable one that
    /// storing the key forgets (the caller may read it first); a moved
    /// resident's forgettable neighbour is swapped into the returned slot
    /// for this, so the caller must store the key there with
    /// [`Self::put`] before the table is used again (that entry may sit
    /// outside its own sets). Finding room
    /// apart from storing lets a large value go from the caller's variable
    /// straight into its slot, instead of through the stack frames of an
    /// insert and its result (a sliding-window state of 4096 instants is
    /// 32 KiB).
    pub(crate) fn vacancy(
        &mut self,
        hash: u64,
        forgettable: impl Fn(&V) -> bool,
        rehash: impl Fn(&K) -> u64,
    ) -> Option<usize> {
        let [a, b] = candidate_sets(N, hash);
        let free_in = |set: usize| {
            set_range(N, set)
                .filter(|&i| matches!(self.slot(i), Some(None)))
                .count()
        };
        let first_free =
            |set: usize| set_range(N, set).find(|&i| matches!(self.slot(i), Some(None)));
        let target = if free_in(b) > free_in(a) { b } else { a };
        let stale = |set: usize| {
            set_range(N, set).find(|&i| {
                self.slot(i)
                    .and_then(Option::as_ref)
                    .is_some_and(|(_, v)| forgettable(v))
            })
        };
        first_free(target)
            .or_else(|| stale(a))
            .or_else(|| stale(b))
            .or_else(|| self.move_a_resident_out([a, b], &forgettable, &rehash))
    }

    /// Stores `key` and `value` in slot `index` (one [`Self::vacancy`]
    /// returned), dropping the entry it held, if any.
    pub(crate) fn put(&mut self, index: usize, key: K, value: V) {
        if let Some(slot) = self.slots.borrow_mut().get_mut(index) {
            let was_free = slot.0.is_none();
            slot.0 = Some((key, value));
            if was_free {
                self.len = self.len.saturating_add(1);
            }
        }
    }

    /// Frees a slot of the full sets `sets` by moving one of their
    /// residents into its other candidate set; returns the freed slot. The
    /// resident goes to a free slot there if any resident has one, else
    /// over an entry there that `forgettable` allows to be replaced, which
    /// takes the resident's old slot (see [`Self::vacancy`]: it is the
    /// entry the caller forgets). One step, no chain: at most `2 * WAYS`
    /// hashes and `4 * WAYS` set scans, so an insert's work stays bounded.
    /// Moving keeps every key findable, since `find` looks in both of a
    /// key's sets. Into free slots only, it lifts the load at which a busy
    /// key is first refused from about 70% to past 90% of the slots; over
    /// forgettable entries too, a table full of settled keys refuses a new
    /// key only when 16 sets around it are all busy, not when its own two
    /// are (a set fills with busy keys far below the table's load).
    fn move_a_resident_out(
        &mut self,
        sets: [usize; 2],
        forgettable: &impl Fn(&V) -> bool,
        rehash: &impl Fn(&K) -> u64,
    ) -> Option<usize> {
        let mut over_forgettable = None;
        let mut free = None;
        'scan: for set in sets {
            for i in set_range(N, set) {
                let Some(Some((k, _))) = self.slot(i) else {
                    continue;
                };
                let [x, y] = candidate_sets(N, rehash(k));
                let other = if x == set { y } else { x };
                if other == set {
                    continue;
                }
                if let Some(j) = set_range(N, other).find(|&j| matches!(self.slot(j), Some(None))) {
                    free = Some((i, j));
                    break 'scan;
                }
                if over_forgettable.is_none() {
                    over_forgettable = set_range(N, other)
                        .find(|&j| {
                            self.slot(j)
                                .and_then(Option::as_ref)
                                .is_some_and(|(_, v)| forgettable(v))
                        })
                        .map(|j| (i, j));
                }
            }
        }
        let (from, to) = free.or(over_forgettable)?;
        // A swap: the resident lands in `to`; what `to` held (nothing, or
        // the forgettable entry the caller then forgets) lands in `from`.
        // `from` and `to` lie in different sets, so they are disjoint.
        let [resident, there] = self.slots.borrow_mut().get_disjoint_mut([from, to]).ok()?;
        core::mem::swap(resident, there);
        Some(from)
    }

    /// The smallest `f(value)` over the key's two candidate sets, if any is
    /// occupied (for example: the earliest instant a slot can be freed).
    pub(crate) fn min_in_candidates<T: Ord>(&self, hash: u64, f: impl Fn(&V) -> T) -> Option<T> {
        let [a, b] = candidate_sets(N, hash);
        set_range(N, a)
            .chain(set_range(N, b))
            .filter_map(|i| self.slot(i).and_then(Option::as_ref))
            .map(|(_, v)| f(v))
            .min()
    }

    /// Removes every entry for which `forget` is true; returns how many.
    pub(crate) fn remove_where(&mut self, mut forget: impl FnMut(&K, &V) -> bool) -> usize {
        let mut removed = 0usize;
        for slot in self.slots_mut() {
            if slot.as_ref().is_some_and(|(k, v)| forget(k, v)) {
                *slot = None;
                removed = removed.saturating_add(1);
            }
        }
        self.len = self.len.saturating_sub(removed);
        removed
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove(&mut self, hash: u64, key: &K) -> Option<V> {
        let i = self.find(hash, key)?;
        let (_, v) = self.slot_mut(i)?.take()?;
        self.len = self.len.saturating_sub(1);
        Some(v)
    }

    /// Removes everything.
    pub(crate) fn clear(&mut self) {
        for slot in self.slots_mut() {
            *slot = None;
        }
        self.len = 0;
    }

    /// Calls `f` on every stored value.
    pub(crate) fn for_each_value_mut(&mut self, mut f: impl FnMut(&mut V)) {
        for (_, value) in self.slots_mut().flatten() {
            f(value);
        }
    }

    /// Every stored entry.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.slots
            .borrow()
            .iter()
            .filter_map(|s| s.0.as_ref().map(|(k, v)| (k, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(k: u64) -> u64 {
        hash_of(&foldhash::quality::FixedState::with_seed(7), &k)
    }

    #[test]
    fn fills_to_capacity_before_refusing_when_nothing_is_forgettable() {
        let mut t: SetTable<u64, (), 1024> = SetTable::new();
        let mut stored = 0;
        for k in 0..2048u64 {
            if t.insert(h(k), k, (), |_| false, |&k| h(k)).is_ok() {
                stored += 1;
            }
        }
        assert_eq!(t.len(), stored);
        // Two choices of 8-way sets fill most of the table before a pair of
        // sets is exhausted.
        assert!(stored >= 1024 * 95 / 100, "stored only {stored}");
        assert!(stored <= 1024);
        for k in 0..2048u64 {
            if let Some(i) = t.find(h(k), &k) {
                assert_eq!(t.entry_mut(i).map(|e| e.0), Some(k));
            }
        }
    }

    #[test]
    fn replaces_only_forgettable_entries() {
        let mut t: SetTable<u64, bool, 8> = SetTable::new();
        for k in 0..8u64 {
            assert!(t.insert(h(k), k, k == 3, |_| false, |&k| h(k)).is_ok());
        }
        assert!(t.insert(h(99), 99, false, |_| false, |&k| h(k)).is_err());
        // The forgettable entry is still there for the caller to read
        // until the new key is put over it.
        let room = t.vacancy(h(99), |forgettable| *forgettable, |&k| h(k));
        assert_eq!(room.and_then(|i| t.entry(i)), Some(&(3, true)));
        t.put(room.unwrap(), 99, false);
        assert!(t.find(h(3), &3).is_none());
        assert!(t.find(h(99), &99).is_some());
        assert_eq!(t.len(), 8);
        assert_eq!(t.remove(h(99), &99), Some(false));
        assert_eq!(t.len(), 7);
        assert_eq!(t.remove_where(|k, _| *k < 2), 2);
        assert_eq!(t.len(), 5);
        t.clear();
        assert_eq!(t.len(), 0);
        assert_eq!(t.iter().count(), 0);
    }

    /// A table at steady state under churn: distinct keys arrive one a
    /// tick and stay busy for `busy_for` ticks, so the table is full (no
    /// free slot) and a fixed share of it is busy. Returns how many new
    /// keys found no room.
    fn refusals_under_churn<const N: usize>(busy_for: u64, arrivals: u64) -> u64 {
        let mut t: SetTable<u64, u64, N> = SetTable::new();
        let mut refused = 0;
        for now in 0..arrivals {
            // A key's value is the tick it was last used at.
            let settled = |used: &u64| used.saturating_add(busy_for) <= now;
            if t.insert(h(now), now, now, settled, |&k| h(k)).is_err() {
                refused += 1;
            }
        }
        refused
    }

    #[test]
    fn a_full_table_of_settled_keys_takes_new_keys_while_most_slots_are_busy() {
        // Both of a new key's sets can be all busy while the residents'
        // other sets hold settled keys: a resident moves over one of those
        // (which is forgotten) instead of the new key being refused. This
        // refused 9, 1,540 and 10,017 of 200,000 before; past 90% busy a
        // few are (39 at 90%, 1,056 at 95%).
        for percent_busy in [33u64, 62, 80] {
            let busy_for = 1024 * percent_busy / 100;
            let refused = refusals_under_churn::<1024>(busy_for, 200_000);
            assert_eq!(refused, 0, "{refused} refused with {percent_busy}% busy");
        }
    }
}

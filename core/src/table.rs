//! A fixed-capacity hash table with bounded work per operation.
//!
//! `N` slots are split into sets of [`WAYS`]; a key may live in one of two
//! sets chosen by its hash ("two choices"), so every lookup and insert
//! touches at most `2 * WAYS` slots whatever the load, and the table fills
//! close to `N` before a set pair runs out of room. The table never evicts
//! on its own: the caller says which values may be forgotten. This is what
//! keeps eviction semantically transparent for limiters and deduplicators.

use core::borrow::Borrow;
use core::hash::{BuildHasher, Hash};

/// Slots per set.
pub(crate) const WAYS: usize = 8;

/// Where an insert put the key.
pub(crate) enum Placed<K, V> {
    /// Into a free slot.
    Free,
    /// Over an entry the caller allowed to be forgotten; here it is, so
    /// the caller can record what it forgot.
    Replaced(K, V),
}

/// A table of at most `N` keys; see the module notes.
#[derive(Clone, Debug)]
pub(crate) struct SetTable<K, V, const N: usize> {
    slots: [Option<(K, V)>; N],
    len: usize,
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

impl<K: Eq, V, const N: usize> SetTable<K, V, N> {
    /// An empty table (usable in a `static`).
    pub(crate) const fn new() -> Self {
        const {
            assert!(
                N > 0 && (N <= WAYS || N.is_multiple_of(WAYS)),
                "table capacity must be positive and, above 8, a multiple of 8"
            )
        };
        SetTable {
            slots: [const { None }; N],
            len: 0,
        }
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
                self.slots
                    .get(i)
                    .and_then(Option::as_ref)
                    .is_some_and(|(k, _)| k.borrow() == key)
            })
        };
        in_set(a).or_else(|| if b == a { None } else { in_set(b) })
    }

    /// The entry in slot `index`.
    pub(crate) fn entry(&self, index: usize) -> Option<&(K, V)> {
        self.slots.get(index).and_then(Option::as_ref)
    }

    /// The entry in slot `index`, mutably.
    pub(crate) fn entry_mut(&mut self, index: usize) -> Option<&mut (K, V)> {
        self.slots.get_mut(index).and_then(Option::as_mut)
    }

    /// Inserts a key known to be absent: into a free slot of its less loaded
    /// candidate set, else over an entry for which `forgettable` is true,
    /// else into a slot freed by moving one resident of its two sets to
    /// that resident's other set (`rehash` gives a resident's hash). When
    /// none of these exists the key and value come back.
    pub(crate) fn insert(
        &mut self,
        hash: u64,
        key: K,
        value: V,
        forgettable: impl Fn(&V) -> bool,
        rehash: impl Fn(&K) -> u64,
    ) -> Result<Placed<K, V>, (K, V)> {
        let [a, b] = candidate_sets(N, hash);
        let free_in = |set: usize| {
            set_range(N, set)
                .filter(|&i| matches!(self.slots.get(i), Some(None)))
                .count()
        };
        let first_free =
            |set: usize| set_range(N, set).find(|&i| matches!(self.slots.get(i), Some(None)));
        let target = if free_in(b) > free_in(a) { b } else { a };
        if let Some(slot) = first_free(target).and_then(|i| self.slots.get_mut(i)) {
            *slot = Some((key, value));
            self.len = self.len.saturating_add(1);
            return Ok(Placed::Free);
        }
        let stale = |set: usize| {
            set_range(N, set).find(|&i| {
                self.slots
                    .get(i)
                    .and_then(Option::as_ref)
                    .is_some_and(|(_, v)| forgettable(v))
            })
        };
        if let Some(slot) = stale(a)
            .or_else(|| stale(b))
            .and_then(|i| self.slots.get_mut(i))
        {
            if let Some((old_key, old_value)) = slot.replace((key, value)) {
                return Ok(Placed::Replaced(old_key, old_value));
            }
            // `stale` only finds occupied slots; were this one empty, the
            // key still went in and the count follows.
            self.len = self.len.saturating_add(1);
            return Ok(Placed::Free);
        }
        if let Some(slot) = self
            .move_a_resident_out(a, &rehash)
            .or_else(|| self.move_a_resident_out(b, &rehash))
            .and_then(|i| self.slots.get_mut(i))
        {
            *slot = Some((key, value));
            self.len = self.len.saturating_add(1);
            return Ok(Placed::Free);
        }
        Err((key, value))
    }

    /// Frees a slot of the full set `set` by moving one of its residents
    /// into a free slot of that resident's other candidate set; returns the
    /// freed slot. One step, no chain: at most `WAYS` hashes and `WAYS`
    /// set scans, so an insert's work stays bounded. Moving keeps every
    /// key findable, since `find` looks in both of a key's sets; it lifts
    /// the load at which a busy key is first refused from about 70% to
    /// past 90% of the slots.
    fn move_a_resident_out(&mut self, set: usize, rehash: &impl Fn(&K) -> u64) -> Option<usize> {
        let (from, to) = set_range(N, set).find_map(|i| {
            let (k, _) = self.slots.get(i)?.as_ref()?;
            let [x, y] = candidate_sets(N, rehash(k));
            let other = if x == set { y } else { x };
            if other == set {
                return None;
            }
            let free = set_range(N, other).find(|&j| matches!(self.slots.get(j), Some(None)))?;
            Some((i, free))
        })?;
        let resident = self.slots.get_mut(from)?.take();
        if let Some(slot) = self.slots.get_mut(to) {
            *slot = resident;
        }
        Some(from)
    }

    /// The smallest `f(value)` over the key's two candidate sets, if any is
    /// occupied (for example: the earliest instant a slot can be freed).
    pub(crate) fn min_in_candidates<T: Ord>(&self, hash: u64, f: impl Fn(&V) -> T) -> Option<T> {
        let [a, b] = candidate_sets(N, hash);
        set_range(N, a)
            .chain(set_range(N, b))
            .filter_map(|i| self.slots.get(i).and_then(Option::as_ref))
            .map(|(_, v)| f(v))
            .min()
    }

    /// Removes every entry for which `forget` is true; returns how many.
    pub(crate) fn remove_where(&mut self, mut forget: impl FnMut(&K, &V) -> bool) -> usize {
        let mut removed = 0usize;
        for slot in self.slots.iter_mut() {
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
        let (_, v) = self.slots.get_mut(i)?.take()?;
        self.len = self.len.saturating_sub(1);
        Some(v)
    }

    /// Removes everything.
    pub(crate) fn clear(&mut self) {
        for slot in self.slots.iter_mut() {
            *slot = None;
        }
        self.len = 0;
    }

    /// Every stored entry.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.slots
            .iter()
            .filter_map(|s| s.as_ref().map(|(k, v)| (k, v)))
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
        assert!(matches!(
            t.insert(h(99), 99, false, |forgettable| *forgettable, |&k| h(k)),
            Ok(Placed::Replaced(3, true))
        ));
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
}

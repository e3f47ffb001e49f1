//! Many keys, bounded memory: a fixed table of per-key limiter states.

use core::borrow::{Borrow, BorrowMut};
use core::cell::RefCell;
use core::hash::{BuildHasher, Hash};

use embassy_sync::blocking_mutex::raw::RawMutex;

use super::{Algorithm, Bandwidths, CostAboveLimit, Decision, Report};
use crate::sync::BlockingMutex;
pub use crate::table::KeyedSlot;
use crate::table::{SetTable, hash_of};
use crate::time::Instant;

/// The default key hasher: foldhash with a fixed seed.
///
/// Deterministic across runs. When keys come from untrusted input (client
/// addresses, user ids), build the table with [`Keyed::with_hasher`] and a
/// seed chosen at start-up, so that nobody can aim many keys at one set.
pub type DefaultHashState = foldhash::quality::FixedState;

const DEFAULT_SEED: u64 = 0x6775_6172_645f_6b65; // "guard_ke"

/// The slots of a [`Keyed`] table of `N` keys of type `K` limited by `A`:
/// its storage, inline by default. Build it on the heap and pass it to
/// [`Keyed::with_storage`] when it is too large for the stack.
pub type KeyedSlots<K, A, const N: usize> = [KeyedSlot<K, <A as Algorithm>::State>; N];

/// What a [`Keyed`] table does with a new key that finds no room: the
/// key's slots, and those its slots' residents could move to, are all
/// taken by keys that are still limited.
///
/// Only entries whose state is indistinguishable from a new key at the
/// caller's reading are ever replaced, and a key that comes back with an
/// earlier reading starts no newer than it was forgotten (see [`Keyed`]),
/// so eviction never hands a busy key a fresh bucket. When no entry may be
/// replaced, one of these applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum FullPolicy {
    /// Refuse the new key until a slot can be freed; the denial says when
    /// the earliest candidate slot becomes forgettable.
    DenyNewKeys,
    /// Decide the new key against one shared overflow state that every
    /// untracked key draws from: the new key is limited, never unlimited,
    /// and crowded-out keys together get at most one key's allowance. What
    /// a key drew from the overflow is not charged to it if it later gets
    /// a slot, so the most any key can exceed its own limit by is that one
    /// shared allowance.
    SharedOverflow,
}

/// Counters of a [`Keyed`] table's bounded-memory behaviour.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct KeyedStats {
    /// New keys stored over an entry that had returned to the new state.
    pub replaced: u64,
    /// New keys refused under [`FullPolicy::DenyNewKeys`].
    pub denied_no_room: u64,
    /// Requests decided by the overflow state under
    /// [`FullPolicy::SharedOverflow`].
    pub overflowed: u64,
}

/// A rate limiter for many keys in a table of at most `N` keys.
///
/// Each key is limited independently by `A`. A key whose state has returned
/// to that of a new key (a bucket refilled, a window emptied) may be
/// forgotten to make room; a busy key never is. When a new key finds no
/// room, the [`FullPolicy`] decides. Lookups touch at most two sets of
/// eight slots, and inserts at most those and the other sets of their
/// sixteen residents, whatever the load.
///
/// A new key finds room unless its two sets hold only busy keys and so do
/// the other sets of each of their residents (one resident moves there,
/// into a free slot or over a forgettable key, to free a slot for the new
/// one). A table full of settled keys therefore takes every new key while
/// up to 80% of its slots are busy
/// (`a_table_full_of_settled_keys_refuses_no_new_key_while_most_slots_are_busy`
/// in `core/tests/keyed.rs`), and a table of busy keys alone fills past
/// 93% of its slots before it refuses one.
///
/// `N` must be positive and, above 8, a multiple of 8.
///
/// # Where the slots live
///
/// The `N` slots are the table's storage, of type `B`: by default an array
/// inside the table ([`KeyedSlots`]), so that [`Keyed::new`] is a `const
/// fn` and a table can be a `static`. A table of many keys, or of large
/// states, is too large to build on a thread's stack and then move to the
/// heap (as `Box::new(Keyed::new(..))` does): build its slots on the heap
/// instead, one at a time, and hand them to [`Keyed::with_storage`]. Any
/// `B` that lends out the array works (`BorrowMut<KeyedSlots<K, A, N>>`):
/// a `Box` of it, or a `&mut` of one placed in a `static` cell. Decisions
/// do not depend on where the slots live, and the table stays fixed in
/// size either way.
///
/// ```
/// use guard_core::limit::{FullPolicy, Keyed, KeyedSlot, KeyedSlots, Rate, TokenBucket};
/// use guard_core::time::Instant;
///
/// const KEYS: usize = 1 << 20; // 24 MiB of slots
/// // Collecting into a boxed slice writes each slot straight into the
/// // heap; the conversion to an array only checks the length.
/// let slots: Box<KeyedSlots<u64, TokenBucket, KEYS>> = (0..KEYS)
///     .map(|_| KeyedSlot::EMPTY)
///     .collect::<Box<[_]>>()
///     .try_into()
///     .expect("KEYS slots");
/// let bucket = TokenBucket::new(1, Rate::per_second(1))?;
/// let mut per_client = Keyed::with_storage(bucket, FullPolicy::DenyNewKeys, slots);
/// assert_eq!(per_client.capacity(), KEYS);
/// assert!(per_client.check(&7, Instant::from_secs(1)).is_allowed());
/// # Ok::<(), guard_core::limit::LimiterError>(())
/// ```
///
/// # Readings out of order
///
/// Threads that read the clock before taking the table's lock arrive in
/// any order. A key forgotten because it had settled by one caller's
/// reading may come back with an earlier reading, at which it was still
/// busy. The table therefore remembers the latest instant at which any
/// state it forgot had settled (one [`Instant`]), and a key it does not
/// hold that arrives before that instant starts from
/// [`Algorithm::state_settled_at`] that instant instead of as new: never
/// newer than any key it forgot. Under [`FullPolicy::DenyNewKeys`] each
/// key therefore keeps the limiter's own budget over its own readings
/// (for a bucket `capacity + (max - min) / interval`), in whatever order
/// they arrive. Readings in order never see the difference.
///
/// # A reading far in the future
///
/// A key checked at a reading far ahead of the clock keeps a state that
/// settles there: it is refused until the clock gets there (each denial's
/// `retry_after` says how long), and its slot is never reused meanwhile.
/// Should such a state be forgotten (by an insert at a reading past it),
/// keys the table does not hold start from that far instant at ordinary
/// readings and are refused likewise. [`Keyed::forget`] recovers one key,
/// [`Keyed::clear`] the whole table.
///
/// ```
/// use guard_core::limit::{FullPolicy, Keyed, Rate, TokenBucket};
/// use guard_core::time::Instant;
///
/// let bucket = TokenBucket::new(1, Rate::per_second(1))?;
/// let mut per_client: Keyed<u32, TokenBucket, 64> = Keyed::new(bucket, FullPolicy::DenyNewKeys);
/// let now = Instant::from_secs(1);
/// assert!(per_client.check(&7, now).is_allowed());
/// assert!(per_client.check(&7, now).is_denied());
/// assert!(per_client.check(&8, now).is_allowed()); // keys are independent
/// # Ok::<(), guard_core::limit::LimiterError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Keyed<K, A: Algorithm, const N: usize, S = DefaultHashState, B = KeyedSlots<K, A, N>> {
    algorithm: A,
    policy: FullPolicy,
    hasher: S,
    table: SetTable<K, A::State, N, B>,
    overflow: A::State,
    /// Every state this table has forgotten (replaced or purged) was fresh
    /// by this instant. A key it does not hold may be one of them, so it is
    /// not new at an earlier reading.
    forgotten_settled_by: Instant,
    stats: KeyedStats,
}

impl<K: Hash + Eq + Clone, A: Algorithm, const N: usize> Keyed<K, A, N, DefaultHashState> {
    /// An empty table with the default hasher.
    pub const fn new(algorithm: A, policy: FullPolicy) -> Self {
        Self::with_hasher(algorithm, policy, DefaultHashState::with_seed(DEFAULT_SEED))
    }
}

impl<K: Hash + Eq + Clone, A: Algorithm, const N: usize, S: BuildHasher> Keyed<K, A, N, S> {
    /// An empty table that hashes keys with `hasher`.
    pub const fn with_hasher(algorithm: A, policy: FullPolicy, hasher: S) -> Self {
        Self::from_table(algorithm, policy, hasher, SetTable::new())
    }
}

impl<K, A, const N: usize, B> Keyed<K, A, N, DefaultHashState, B>
where
    K: Hash + Eq + Clone,
    A: Algorithm,
    B: BorrowMut<KeyedSlots<K, A, N>>,
{
    /// An empty table with the default hasher whose slots live in
    /// `storage` (see [Where the slots live](Keyed#where-the-slots-live)).
    /// Whatever the slots hold is dropped: the table starts empty.
    pub fn with_storage(algorithm: A, policy: FullPolicy, storage: B) -> Self {
        Self::with_hasher_and_storage(
            algorithm,
            policy,
            DefaultHashState::with_seed(DEFAULT_SEED),
            storage,
        )
    }
}

impl<K, A, const N: usize, S, B> Keyed<K, A, N, S, B>
where
    K: Hash + Eq + Clone,
    A: Algorithm,
    S: BuildHasher,
    B: BorrowMut<KeyedSlots<K, A, N>>,
{
    /// An empty table that hashes keys with `hasher` and whose slots live
    /// in `storage`; see [`Keyed::with_storage`].
    pub fn with_hasher_and_storage(
        algorithm: A,
        policy: FullPolicy,
        hasher: S,
        storage: B,
    ) -> Self {
        Self::from_table(algorithm, policy, hasher, SetTable::with_slots(storage))
    }

    /// A table over `table`, which is empty.
    const fn from_table(
        algorithm: A,
        policy: FullPolicy,
        hasher: S,
        table: SetTable<K, A::State, N, B>,
    ) -> Self {
        Keyed {
            algorithm,
            policy,
            hasher,
            table,
            overflow: A::NEW_STATE,
            forgotten_settled_by: Instant::ZERO,
            stats: KeyedStats {
                replaced: 0,
                denied_no_room: 0,
                overflowed: 0,
            },
        }
    }

    /// Decides one request for `key` at `now`.
    pub fn check(&mut self, key: &K, now: Instant) -> Decision {
        self.check_borrowed(key, || key.clone(), now)
    }

    /// Decides one request for a key looked up by a borrowed form (a
    /// `&str` for `String` keys), building the owned key with `to_key`
    /// only when a new key is stored.
    pub fn check_borrowed<Q: Hash + Eq + ?Sized>(
        &mut self,
        key: &Q,
        to_key: impl FnOnce() -> K,
        now: Instant,
    ) -> Decision
    where
        K: Borrow<Q>,
    {
        self.decide(
            key,
            to_key,
            now,
            |algorithm, state| algorithm.check(state, now),
            Decision::is_allowed,
            |earliest| Decision::denied_until(earliest, now),
        )
    }

    /// Decides a request of `cost` units for `key` at `now`, with the
    /// key's quota; see [`Algorithm::check_n`].
    pub fn check_n(&mut self, key: &K, cost: u32, now: Instant) -> Result<Report, CostAboveLimit> {
        self.check_n_borrowed(key, || key.clone(), cost, now)
    }

    /// [`Self::check_n`] for a key looked up by a borrowed form; see
    /// [`Self::check_borrowed`].
    pub fn check_n_borrowed<Q: Hash + Eq + ?Sized>(
        &mut self,
        key: &Q,
        to_key: impl FnOnce() -> K,
        cost: u32,
        now: Instant,
    ) -> Result<Report, CostAboveLimit>
    where
        K: Borrow<Q>,
    {
        let limit = self.algorithm.limit();
        if cost > limit {
            return Err(CostAboveLimit { cost, limit });
        }
        Ok(self.decide(
            key,
            to_key,
            now,
            // cost <= limit was checked, so the algorithm never refuses
            // it as an error; were it to, the request is refused.
            |algorithm, state| {
                algorithm.check_n(state, cost, now).unwrap_or(Report {
                    decision: Decision::denied_until(Instant::MAX, now),
                    limit,
                    remaining: 0,
                    reset_after: core::time::Duration::ZERO,
                })
            },
            // A cost of zero counts nothing: a new key is not stored.
            |report| report.is_allowed() && cost > 0,
            |earliest| Report {
                decision: Decision::denied_until(earliest, now),
                limit,
                remaining: 0,
                reset_after: earliest.saturating_duration_since(now),
            },
        ))
    }

    /// One decision through the table, whatever it reports: `decide` runs
    /// the algorithm on a state, `counted` says whether it changed the
    /// state (so a new key must be stored), `no_room` builds the refusal
    /// of a new key that finds no slot, from the instant one frees.
    fn decide<Q: Hash + Eq + ?Sized, R>(
        &mut self,
        key: &Q,
        to_key: impl FnOnce() -> K,
        now: Instant,
        decide: impl Fn(&A, &mut A::State) -> R,
        counted: impl Fn(&R) -> bool,
        no_room: impl FnOnce(Instant) -> R,
    ) -> R
    where
        K: Borrow<Q>,
    {
        let hash = hash_of(&self.hasher, key);
        if let Some((_, state)) = self
            .table
            .find(hash, key)
            .and_then(|index| self.table.entry_mut(index))
        {
            return decide(&self.algorithm, state);
        }
        let mut state = self.untracked_key_state(now);
        let outcome = decide(&self.algorithm, &mut state);
        if !counted(&outcome) {
            // Nothing was counted, so storing the state would change no
            // decision; it would only take a slot.
            return outcome;
        }
        let (algorithm, hasher) = (&self.algorithm, &self.hasher);
        let Some(index) =
            self.table
                .vacancy(hash, |s| algorithm.is_fresh(s, now), |k| hash_of(hasher, k))
        else {
            return match self.policy {
                FullPolicy::DenyNewKeys => {
                    self.stats.denied_no_room = self.stats.denied_no_room.saturating_add(1);
                    no_room(self.earliest_vacancy(hash, now))
                }
                FullPolicy::SharedOverflow => {
                    self.stats.overflowed = self.stats.overflowed.saturating_add(1);
                    decide(&self.algorithm, &mut self.overflow)
                }
            };
        };
        // An entry still in the slot is one found forgettable at `now`.
        if let Some(settled) = self
            .table
            .entry(index)
            .map(|(_, forgotten)| algorithm.fresh_at(forgotten))
        {
            self.stats.replaced = self.stats.replaced.saturating_add(1);
            // A forgotten state was fresh at `now`, so it settled by `now`
            // (`fresh_at` is Some and at most `now`).
            self.remember_forgotten(settled.unwrap_or(now));
        }
        // Room was found apart from storing so that the state is moved
        // once, into its slot: a state can be large (32 KiB for a sliding
        // window of 4096 instants), and every copy on the way (into an
        // insert's arguments, out of its result) costs that much stack.
        self.table.put(index, to_key(), state);
        outcome
    }

    /// The state an untracked key starts from at `now`: a new key's,
    /// unless the table forgot a state that settled after `now`. This key
    /// may have been that one, forgotten at a later reading than this (out
    /// of order) one.
    fn untracked_key_state(&self, now: Instant) -> A::State {
        if now < self.forgotten_settled_by {
            self.algorithm.state_settled_at(self.forgotten_settled_by)
        } else {
            A::NEW_STATE
        }
    }

    /// When a slot for a new key of `hash` frees at the earliest: a state
    /// that never settles within the clock's range frees its slot at the
    /// end of the clock at the earliest.
    fn earliest_vacancy(&self, hash: u64, now: Instant) -> Instant {
        let algorithm = &self.algorithm;
        self.table
            .min_in_candidates(hash, |s| algorithm.fresh_at(s).unwrap_or(Instant::MAX))
            .unwrap_or(now)
    }

    /// Replaces the parameters at `now`, carrying every key's state over
    /// ([`Algorithm::carry_over`]); keys are kept, none is forgotten.
    pub fn reconfigure(&mut self, algorithm: A, now: Instant) {
        let previous = core::mem::replace(&mut self.algorithm, algorithm);
        let algorithm = &self.algorithm;
        self.table
            .for_each_value_mut(|state| algorithm.carry_over(&previous, state, now));
        algorithm.carry_over(&previous, &mut self.overflow, now);
        // Forgotten states settled by `forgotten_settled_by` under the old
        // parameters; the most restrictive of them, carried over, says by
        // when they settle under the new ones.
        if now < self.forgotten_settled_by {
            let mut bound = previous.state_settled_at(self.forgotten_settled_by);
            algorithm.carry_over(&previous, &mut bound, now);
            self.forgotten_settled_by = algorithm.fresh_at(&bound).unwrap_or(Instant::MAX);
        }
    }

    /// Records that a state which settled at `settled` was forgotten.
    fn remember_forgotten(&mut self, settled: Instant) {
        if settled > self.forgotten_settled_by {
            self.forgotten_settled_by = settled;
        }
    }

    /// The state stored for `key`, if it is tracked.
    pub fn state(&self, key: &K) -> Option<&A::State> {
        let hash = hash_of(&self.hasher, key);
        let index = self.table.find(hash, key)?;
        self.table.entry(index).map(|(_, state)| state)
    }

    /// Forgets every key whose state equals a new key's at `now`; returns
    /// how many. Never needed for correctness (full sets reuse such slots on
    /// their own); useful to report an accurate [`Self::len`].
    pub fn purge(&mut self, now: Instant) -> usize {
        let algorithm = &self.algorithm;
        let mut settled_by = self.forgotten_settled_by;
        let removed = self.table.remove_where(|_, s| {
            if !algorithm.is_fresh(s, now) {
                return false;
            }
            if let Some(at) = algorithm.fresh_at(s).filter(|&at| at > settled_by) {
                settled_by = at;
            }
            true
        });
        self.forgotten_settled_by = settled_by;
        removed
    }

    /// Forgets `key` as if it had never been seen, busy or not (as
    /// [`super::Limiter::reset`] does for one key); returns whether it was
    /// tracked. Its next call starts as a new key's: this is how to
    /// recover a key that a reading far in the future put out of reach.
    pub fn forget(&mut self, key: &K) -> bool {
        let hash = hash_of(&self.hasher, key);
        self.table.remove(hash, key).is_some()
    }

    /// Keys currently tracked.
    pub const fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key is tracked.
    pub const fn is_empty(&self) -> bool {
        self.table.len() == 0
    }

    /// The most keys the table can track.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Bounded-memory counters.
    pub const fn stats(&self) -> KeyedStats {
        self.stats
    }

    /// The parameters.
    pub const fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The policy for new keys when there is no room.
    pub const fn policy(&self) -> FullPolicy {
        self.policy
    }

    /// Forgets every key and the overflow state, busy or not: every key
    /// starts as new again, whatever readings the table has seen.
    pub fn clear(&mut self) {
        self.table.clear();
        self.overflow = A::NEW_STATE;
        self.forgotten_settled_by = Instant::ZERO;
    }
}

/// A [`Keyed`] table shared through `&self`, behind an
/// `embassy_sync` blocking mutex: a critical section on a microcontroller
/// (`CriticalSectionRawMutex`), a thread mutex on a server.
///
/// Every method holds the lock for one bounded table operation. Should an
/// [`Algorithm`] ever call back into the same table from `check`, the inner
/// call is refused (denied for 1 ns) rather than deadlocking or panicking.
///
/// It shares a [`Keyed`] table wherever its slots live: one built with
/// [`Keyed::with_storage`] keeps them on the heap.
pub struct SharedKeyed<
    M: RawMutex,
    K,
    A: Algorithm,
    const N: usize,
    S = DefaultHashState,
    B = KeyedSlots<K, A, N>,
> {
    inner: BlockingMutex<M, RefCell<Keyed<K, A, N, S, B>>>,
}

impl<K, A, const W: usize, const N: usize, S, B> Keyed<K, Bandwidths<A, W>, N, S, B>
where
    K: Hash + Eq + Clone,
    A: Algorithm,
    A::State: Clone,
    S: BuildHasher,
    B: BorrowMut<KeyedSlots<K, Bandwidths<A, W>, N>>,
{
    /// [`Self::check_n_borrowed`] with every bandwidth's report, in the
    /// order given (see [`Bandwidths::check_each`]). A new key that finds
    /// no room is refused in each, with the wait until a slot frees.
    pub fn check_each_borrowed<Q: Hash + Eq + ?Sized>(
        &mut self,
        key: &Q,
        to_key: impl FnOnce() -> K,
        cost: u32,
        now: Instant,
    ) -> Result<[Report; W], CostAboveLimit>
    where
        K: Borrow<Q>,
    {
        if let Some(too_much) = self
            .algorithm
            .limits()
            .iter()
            .find(|limit| cost > limit.limit())
        {
            return Err(CostAboveLimit {
                cost,
                limit: too_much.limit(),
            });
        }
        let mut each = self.algorithm.limits().iter();
        let quotas: [u32; W] = core::array::from_fn(|_| each.next().map_or(0, A::limit));
        let refused = move |at: Instant| -> [Report; W] {
            quotas.map(|limit| Report {
                decision: Decision::denied_until(at, now),
                limit,
                remaining: 0,
                reset_after: at.saturating_duration_since(now),
            })
        };
        Ok(self.decide(
            key,
            to_key,
            now,
            // No cost is above a bandwidth's quota (checked above); were
            // one refused as an error all the same, the request is refused.
            |policy, state| {
                policy
                    .check_each(state, cost, now)
                    .unwrap_or_else(|_| refused(Instant::MAX))
            },
            |each| cost > 0 && each.iter().all(Report::is_allowed),
            refused,
        ))
    }
}

impl<M, K, A, const N: usize, S, B> SharedKeyed<M, K, A, N, S, B>
where
    M: RawMutex,
    K: Hash + Eq + Clone,
    A: Algorithm,
    S: BuildHasher,
    B: BorrowMut<KeyedSlots<K, A, N>>,
{
    /// Shares `keyed` (usable in a `static`).
    #[cfg(not(guard_loom))]
    pub const fn new(keyed: Keyed<K, A, N, S, B>) -> Self {
        SharedKeyed {
            inner: BlockingMutex::new(RefCell::new(keyed)),
        }
    }

    /// Shares `keyed` (loom's mutex has no `const` constructor).
    #[cfg(guard_loom)]
    pub fn new(keyed: Keyed<K, A, N, S, B>) -> Self {
        SharedKeyed {
            inner: BlockingMutex::new(RefCell::new(keyed)),
        }
    }

    /// Decides one request for `key` at `now`.
    pub fn check(&self, key: &K, now: Instant) -> Decision {
        self.inner.lock(|k| match k.try_borrow_mut() {
            Ok(mut keyed) => keyed.check(key, now),
            Err(_) => Decision::denied_until(now, now),
        })
    }

    /// Decides a request of `cost` units for `key` at `now`; see
    /// [`Keyed::check_n`]. A call from inside the algorithm is refused
    /// for 1 ns, as in [`Self::check`].
    pub fn check_n(&self, key: &K, cost: u32, now: Instant) -> Result<Report, CostAboveLimit> {
        self.inner.lock(|k| match k.try_borrow_mut() {
            Ok(mut keyed) => keyed.check_n(key, cost, now),
            Err(_) => Ok(Report {
                decision: Decision::denied_until(now, now),
                limit: 0,
                remaining: 0,
                reset_after: core::time::Duration::ZERO,
            }),
        })
    }

    /// Replaces the parameters at `now`, keeping every key; see
    /// [`Keyed::reconfigure`]. Returns `false`, changing nothing, when
    /// called from inside the algorithm.
    pub fn reconfigure(&self, algorithm: A, now: Instant) -> bool {
        self.inner.lock(|k| {
            k.try_borrow_mut()
                .map(|mut keyed| keyed.reconfigure(algorithm, now))
                .is_ok()
        })
    }

    /// Forgets keys that are back to the new state; see [`Keyed::purge`].
    pub fn purge(&self, now: Instant) -> usize {
        self.inner
            .lock(|k| k.try_borrow_mut().map_or(0, |mut keyed| keyed.purge(now)))
    }

    /// Forgets `key`, busy or not; see [`Keyed::forget`]. Returns whether
    /// it was tracked (`false` also when called from inside `check`).
    pub fn forget(&self, key: &K) -> bool {
        self.inner
            .lock(|k| k.try_borrow_mut().is_ok_and(|mut keyed| keyed.forget(key)))
    }

    /// Keys currently tracked.
    pub fn len(&self) -> usize {
        self.inner
            .lock(|k| k.try_borrow().map_or(0, |keyed| keyed.len()))
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bounded-memory counters.
    pub fn stats(&self) -> KeyedStats {
        self.inner.lock(|k| {
            k.try_borrow()
                .map(|keyed| keyed.stats())
                .unwrap_or_default()
        })
    }
}

//! An in-memory keyed limiter for servers: sharded tables of guard-core's
//! bounded `Keyed`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher as _};
use std::sync::PoisonError;

use siphasher::sip128::{Hasher128 as _, SipHasher13};

use guard_core::limit::{
    Algorithm, Bandwidths, CostAboveLimit, Decision, DefaultHashState, FixedWindow, FullPolicy,
    Keyed, KeyedSlot, KeyedSlots, Report,
};

use super::{
    EachResult, FromQuota, KeysHeld, LimitError, LimitFuture, Quota, RateLimiter, ReconfigureError,
    check_key,
};
use crate::clock::{Clock, EpochClock, QuantaClock};
use crate::shared::BoxFuture;
use crate::sync::Mutex;

/// Keys per shard by default.
pub const SHARD_KEYS: usize = 1024;

/// The longest key a [`MemoryLimiter`] stores as it is: a longer one
/// (up to [`MAX_KEY_LEN`](super::MAX_KEY_LEN)) is stored as its keyed
/// 128-bit hash, [`HASHED_KEY_LEN`] bytes, so that no key costs the
/// table more than this many bytes of text.
pub const STORED_KEY_LEN: usize = 64;

/// The length of a long key's stored form: a NUL, then its keyed
/// SipHash-1-3-128 in 32 hexadecimal digits.
pub const HASHED_KEY_LEN: usize = 33;

/// The bytes the allocator may spend on one key's text besides the text
/// itself (its block header and rounding), counted in
/// [`MemoryLimiter::max_bytes`] so that the bound holds for the process,
/// not only for what was asked of the allocator.
const ALLOCATION_OVERHEAD: usize = 16;

/// A shard's table, its slots on the heap, so that building it never puts
/// them on the stack.
type Table<A, const S: usize> =
    Keyed<String, A, S, DefaultHashState, Box<KeyedSlots<String, A, S>>>;

/// One shard: its table once its first key has arrived.
type Shard<A, const S: usize> = Mutex<Option<Table<A, S>>>;

/// `S` empty slots, written one at a time straight into the heap: with
/// `Box::new(Keyed::new(..))` the whole table would be built on the stack
/// first, and one shard of sliding-window logs of 4096 instants is 32 MiB.
fn heap_slots<A: Algorithm, const S: usize>() -> Box<KeyedSlots<String, A, S>> {
    let mut slots = Vec::with_capacity(S);
    // A plain loop rather than `collect`: in an unoptimised build every
    // layer of iterator adapters keeps its own copy of the slot on the
    // stack, and a slot can be 32 KiB.
    for _ in 0..S {
        slots.push(KeyedSlot::EMPTY);
    }
    match slots.into_boxed_slice().try_into() {
        Ok(slots) => slots,
        Err(_) => unreachable!("exactly S slots were pushed"),
    }
}

/// Many keys in bounded memory, shared between threads.
///
/// The keys are spread over shards of guard-core's [`Keyed`] table
/// (`S` keys each, [`SHARD_KEYS`] by default), each behind its own mutex, so threads on
/// different keys rarely contend. A shard's table is built when its first
/// key arrives, so memory follows the keys: a limiter nothing uses costs
/// each shard's header (its lock and one state of `A`), a full one
/// `capacity` slots besides. Only keys whose state
/// equals a new key's are ever replaced, and a full shard applies the
/// [`FullPolicy`].
///
/// A key's shard, and its set of slots within the shard, follow from its
/// hash, so a new key can find its place full before the whole table is:
/// with distinct random keys the first new key was refused at 87–96% of
/// `capacity` (a trial of 10,000 and 1,024). Give it headroom over the
/// keys it must hold at once, or choose [`FullPolicy::SharedOverflow`],
/// under which a crowded-out key is still limited (all of them together
/// by one shared allowance) rather than refused.
///
/// Every shard's slots are built directly on the heap, so a limiter of any
/// size can be built on any thread; besides them, building or checking
/// puts at most a few of `A`'s per-key states on the stack. Memory, once
/// every shard has a key, is `capacity` times a slot (a `String` and
/// `A`'s state): a `SlidingWindow<N>` stores `N` instants of 8 bytes per
/// key, so choose the smallest `N` that holds the limit.
///
/// Each shard hashes keys with a seed of its own chosen at start-up, so
/// that clients cannot aim many keys at one set of a shard to crowd out
/// others.
///
/// # Bounded in bytes
///
/// A key of up to [`STORED_KEY_LEN`] bytes is stored as it is; a longer
/// one as a NUL and its SipHash-1-3-128 under a secret chosen at
/// start-up, in hexadecimal. So the whole table never takes more than
/// [`MemoryLimiter::max_bytes`]: `capacity` slots and, for each, at most
/// [`STORED_KEY_LEN`] bytes of text and the allocator's overhead (checked
/// by `tests/memory_bytes.rs` with a counting allocator, with keys of
/// [`MAX_KEY_LEN`](super::MAX_KEY_LEN) bytes). Two long keys share a
/// state only if their keyed hashes meet, which without the secret is a
/// 128-bit guess; a short key that starts with a NUL likewise. A table
/// of a given size in bytes is [`MemoryLimiter::keys_within`] keys.
pub struct MemoryLimiter<A: Algorithm, C: Clock = QuantaClock, const S: usize = SHARD_KEYS> {
    /// `None` until the shard's first key arrives.
    shards: Box<[Shard<A, S>]>,
    /// The parameters a shard built now starts with. Set before the built
    /// shards are reconfigured, and read by a shard being built under its
    /// own lock: a shard built during a reconfiguration gets the new
    /// parameters, or the old ones and then the reconfiguration.
    algorithm: Mutex<A>,
    /// Held through a whole reconfiguration, so two of them never
    /// interleave (the earlier would finish on shards the later already
    /// changed, leaving them on parameters no longer in force). Taken
    /// before any other lock, and only here.
    reconfiguring: Mutex<()>,
    policy: FullPolicy,
    /// Seeds each shard's hasher (its hash of the shard's number).
    seeds: RandomState,
    /// Picks a key's shard: foldhash with a seed chosen at start-up (the
    /// tables' own hasher; std's SipHash here cost a third of a keyed
    /// decision).
    router: DefaultHashState,
    /// The secret of the long keys' hash (two words from std's random
    /// keys), never shown.
    long_keys: (u64, u64),
    clock: C,
}

impl<A> MemoryLimiter<A, QuantaClock, SHARD_KEYS>
where
    A: Algorithm + Clone,
{
    /// Room for `capacity` keys rounded up to whole shards of `S` (see
    /// the type's documentation for when a new key finds no room), on
    /// the counter clock ([`QuantaClock`]).
    pub fn new(algorithm: A, capacity: usize, policy: FullPolicy) -> Self {
        Self::with_clock(algorithm, capacity, policy, QuantaClock::new())
    }
}

impl MemoryLimiter<FixedWindow, EpochClock, SHARD_KEYS> {
    /// Fixed windows aligned to the calendar: as [`MemoryLimiter::new`],
    /// on the wall clock read from the Unix epoch ([`EpochClock`]), so a
    /// window of a day starts at midnight UTC (or at the window's offset)
    /// and every replica's windows start together.
    pub fn aligned(window: FixedWindow, capacity: usize, policy: FullPolicy) -> Self {
        Self::with_clock(window, capacity, policy, EpochClock)
    }
}

impl<A, C, const S: usize> MemoryLimiter<A, C, S>
where
    A: Algorithm + Clone,
    C: Clock,
{
    /// As [`MemoryLimiter::new`], on `clock`.
    pub fn with_clock(algorithm: A, capacity: usize, policy: FullPolicy, clock: C) -> Self {
        let seeds = RandomState::new();
        let router = DefaultHashState::with_seed(seeds.hash_one(u64::MAX));
        let long_keys = (seeds.hash_one(u64::MAX - 1), seeds.hash_one(u64::MAX - 2));
        let count = capacity.div_ceil(S).max(1);
        MemoryLimiter {
            shards: (0..count).map(|_| Mutex::new(None)).collect(),
            algorithm: Mutex::new(algorithm),
            reconfiguring: Mutex::new(()),
            policy,
            seeds,
            router,
            long_keys,
            clock,
        }
    }

    /// The table of shard `index`, built with the parameters of now.
    fn table(&self, index: usize) -> Table<A, S> {
        // Std's keys are random, so its hash of the shard number is a
        // seed nobody outside can predict.
        let seed = DefaultHashState::with_seed(self.seeds.hash_one(index));
        Keyed::with_hasher_and_storage(self.algorithm(), self.policy, seed, heap_slots::<A, S>())
    }

    /// The most keys it tracks.
    pub fn capacity(&self) -> usize {
        self.shards.len() * S
    }

    /// The bytes one key may cost the table at most: its slot (the
    /// stored text's handle and `A`'s state), at most [`STORED_KEY_LEN`]
    /// bytes of text and the allocator's overhead for them.
    pub fn bytes_per_key() -> usize {
        std::mem::size_of::<KeyedSlot<String, A::State>>() + STORED_KEY_LEN + ALLOCATION_OVERHEAD
    }

    /// The most keys that fit `bytes` by [`Self::bytes_per_key`], in
    /// whole shards of `S` (a limiter built with this many keys stays
    /// within `bytes`); zero when not even one shard fits.
    pub fn keys_within(bytes: usize) -> usize {
        bytes / Self::bytes_per_key() / S * S
    }

    /// The most bytes the table takes once every shard holds its keys:
    /// `capacity` times [`Self::bytes_per_key`] (besides each shard's
    /// lock and one state of `A`).
    pub fn max_bytes(&self) -> usize {
        self.capacity().saturating_mul(Self::bytes_per_key())
    }

    /// Keys currently tracked.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .map_or(0, |table| table.len())
            })
            .sum()
    }

    /// Shards whose table has been built (a key arrived in each).
    pub fn shards_built(&self) -> usize {
        self.shards
            .iter()
            .filter(|s| s.lock().unwrap_or_else(PoisonError::into_inner).is_some())
            .count()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `decide` on the table of the shard that holds `key`, built
    /// first if it is the shard's first key, with the form `key` is
    /// stored under (see the type's "Bounded in bytes").
    fn with_table<R>(&self, key: &str, decide: impl FnOnce(&mut Table<A, S>, &str) -> R) -> R {
        let mut hashed = [0_u8; HASHED_KEY_LEN];
        let key = if key.len() <= STORED_KEY_LEN {
            key
        } else {
            self.hashed(key, &mut hashed)
        };
        // There is at least one shard, and the index is reduced modulo
        // their number.
        let index = (self.router.hash_one(key) as usize) % self.shards.len();
        let mut shard = self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        decide(shard.get_or_insert_with(|| self.table(index)), key)
    }

    /// The stored form of a key longer than [`STORED_KEY_LEN`], written
    /// into `out`: a NUL and its keyed hash in hexadecimal.
    fn hashed<'b>(&self, key: &str, out: &'b mut [u8; HASHED_KEY_LEN]) -> &'b str {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hasher = SipHasher13::new_with_keys(self.long_keys.0, self.long_keys.1);
        hasher.write(key.as_bytes());
        let hash = hasher.finish128().as_u128();
        out[0] = 0;
        for (i, digit) in out[1..].iter_mut().enumerate() {
            *digit = DIGITS[((hash >> (4 * (31 - i))) & 0xf) as usize];
        }
        // A NUL and hexadecimal digits: ASCII.
        std::str::from_utf8(out).unwrap_or_else(|_| unreachable!("ASCII is UTF-8"))
    }

    /// Decides one request for `key` now.
    pub fn check_now(&self, key: &str) -> Decision {
        self.with_table(key, |table, key| {
            // Read under the shard's lock: one clock order a shard.
            let now = self.clock.now();
            table.check_borrowed(key, || key.to_owned(), now)
        })
    }

    /// Decides a request of `cost` units for `key` now, with the key's
    /// quota; see guard-core's `Algorithm::check_n`.
    pub fn check_n_now(&self, key: &str, cost: u32) -> Result<Report, CostAboveLimit> {
        self.with_table(key, |table, key| {
            let now = self.clock.now();
            table.check_n_borrowed(key, || key.to_owned(), cost, now)
        })
    }

    /// The parameters every key is limited by.
    pub fn algorithm(&self) -> A {
        self.algorithm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the parameters now, keeping every key (guard-core's
    /// `Keyed::reconfigure`). Shards change one after the other: a
    /// decision made meanwhile on a shard not yet changed uses the old
    /// parameters, one made after its shard changed the new; a shard
    /// built from now on starts with the new. Concurrent reconfigurations
    /// take turns: every shard ends on the last one's parameters.
    pub fn reconfigure_with(&self, algorithm: A) {
        let _one_at_a_time = self
            .reconfiguring
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Set first, then released before any shard's lock is taken (a
        // shard being built holds its lock, then this one): never the
        // two in both orders.
        *self
            .algorithm
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = algorithm.clone();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(table) = shard.as_mut() {
                // Read under the shard's lock, so the carry-over and every
                // decision after it on this shard see one clock order.
                let now = self.clock.now();
                table.reconfigure(algorithm.clone(), now);
            }
        }
    }
}

impl<A, C, const S: usize> RateLimiter for MemoryLimiter<A, C, S>
where
    A: FromQuota + Clone + Send,
    A::State: Send,
    C: Clock,
{
    /// A key [`check_key`] refuses is [`LimitError::InvalidKey`], before
    /// it can take a place in the table.
    fn check_n<'a>(&'a self, key: &'a str, cost: u32) -> LimitFuture<'a> {
        let result = match check_key(key) {
            Ok(()) => self.check_n_now(key, cost).map_err(Into::into),
            Err(e) => Err(LimitError::InvalidKey(e)),
        };
        LimitFuture::Ready(Some(result))
    }

    fn quota(&self) -> Quota {
        self.algorithm().quota()
    }

    fn reconfigure(&self, quota: Quota) -> Result<(), ReconfigureError> {
        self.reconfigure_with(A::from_quota(quota)?);
        Ok(())
    }

    fn keys_held(&self) -> Option<KeysHeld> {
        Some(KeysHeld {
            held: self.len(),
            capacity: self.capacity(),
            max_bytes: self.max_bytes(),
        })
    }
}

impl<A, C, const W: usize, const S: usize> MemoryLimiter<Bandwidths<A, W>, C, S>
where
    A: Algorithm + Clone,
    A::State: Clone,
    C: Clock,
{
    /// Decides `cost` units for `key` now by every bandwidth, all or
    /// nothing, with each one's report; see guard-core's
    /// `Bandwidths::check_each`.
    pub fn check_each_now(&self, key: &str, cost: u32) -> Result<[Report; W], CostAboveLimit> {
        self.with_table(key, |table, key| {
            let now = self.clock.now();
            table.check_each_borrowed(key, || key.to_owned(), cost, now)
        })
    }
}

/// Several bandwidths on one key in memory: decided as one
/// (`check_n` reports the tightest), with every bandwidth's report from
/// `check_each`. Its `quota` is the first bandwidth's; a new policy is set
/// with [`MemoryLimiter::reconfigure_with`], as one quota cannot say which
/// bandwidth to change.
impl<A, C, const W: usize, const S: usize> RateLimiter for MemoryLimiter<Bandwidths<A, W>, C, S>
where
    A: FromQuota + Clone + Send + Sync,
    A::State: Clone + Send,
    C: Clock,
{
    /// A key [`check_key`] refuses is [`LimitError::InvalidKey`], before
    /// it can take a place in the table.
    fn check_n<'a>(&'a self, key: &'a str, cost: u32) -> LimitFuture<'a> {
        let result = match check_key(key) {
            Ok(()) => self.check_n_now(key, cost).map_err(Into::into),
            Err(e) => Err(LimitError::InvalidKey(e)),
        };
        LimitFuture::Ready(Some(result))
    }

    fn quota(&self) -> Quota {
        let policy = self.algorithm();
        policy
            .limits()
            .iter()
            .map(FromQuota::quota)
            .next()
            .unwrap_or_else(|| unreachable!("a policy has at least one bandwidth"))
    }

    fn reconfigure(&self, _: Quota) -> Result<(), ReconfigureError> {
        Err(ReconfigureError::SeveralBandwidths { bandwidths: W })
    }

    fn keys_held(&self) -> Option<KeysHeld> {
        Some(KeysHeld {
            held: self.len(),
            capacity: self.capacity(),
            max_bytes: self.max_bytes(),
        })
    }

    fn bandwidths(&self) -> Option<Vec<Quota>> {
        Some(
            self.algorithm()
                .limits()
                .iter()
                .map(FromQuota::quota)
                .collect(),
        )
    }

    fn check_each<'a>(&'a self, key: &'a str, cost: u32) -> BoxFuture<'a, EachResult> {
        let result = match check_key(key) {
            Ok(()) => self
                .check_each_now(key, cost)
                .map(Vec::from)
                .map_err(Into::into),
            Err(e) => Err(LimitError::InvalidKey(e)),
        };
        Box::pin(std::future::ready(result))
    }
}

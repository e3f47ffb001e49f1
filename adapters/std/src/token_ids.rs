//! Random token ids without a random-number crate.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use guard_core::lock::TokenId;

/// Mints token ids: 16 bytes from two SipHash outputs, keyed by the
/// operating system's randomness (std's `RandomState`), over a counter.
/// Ids never repeat within a source and cannot be predicted from outside
/// the process; ids from different processes collide with probability
/// 2^-128.
#[derive(Debug)]
pub struct TokenIds {
    keys: RandomState,
    counter: AtomicU64,
}

impl TokenIds {
    /// A source with fresh random keys.
    pub fn new() -> Self {
        TokenIds {
            keys: RandomState::new(),
            counter: AtomicU64::new(0),
        }
    }

    /// The next id.
    pub fn next_id(&self) -> TokenId {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let mut id = [0u8; 16];
        let (hi, lo) = id.split_at_mut(8);
        hi.copy_from_slice(&self.keys.hash_one((n, 0u8)).to_le_bytes());
        lo.copy_from_slice(&self.keys.hash_one((n, 1u8)).to_le_bytes());
        TokenId(id)
    }
}

impl Default for TokenIds {
    fn default() -> Self {
        Self::new()
    }
}

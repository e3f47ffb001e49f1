//! Deduplicators: remember what was seen, answer "seen before?".
//!
//! [`Deduplicator::check_and_mark`] is the one operation to use when
//! deciding whether to process an item: `Ok(false)` means new and now
//! marked, `Ok(true)` means duplicate. Types here are single-owner
//! (`&mut self`), so each call is atomic; wrap one in a mutex to share it.

mod bloom;
mod secret;
mod windowed;

pub use bloom::{BloomError, BloomFilter, BloomParams, MAX_HASHES};
pub use secret::SecretHashState;
pub use windowed::WindowedDeduplicator;

use core::fmt;

use crate::time::Instant;

/// The deduplicator has no room to remember a new item.
///
/// The item was **not** seen before (it is not a duplicate) but it is not
/// remembered either, so a later copy would not be recognised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CapacityExceeded;

impl fmt::Display for CapacityExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deduplicator is full: the item is new but could not be remembered")
    }
}

impl core::error::Error for CapacityExceeded {}

/// A time window of zero remembers nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ZeroWindow;

impl fmt::Display for ZeroWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deduplication window must be positive (got 0)")
    }
}

impl core::error::Error for ZeroWindow {}

/// The deduplication contract.
pub trait Deduplicator<T: ?Sized> {
    /// Whether `item` counts as seen at `now`; changes nothing.
    fn is_duplicate(&self, item: &T, now: Instant) -> bool;

    /// Remembers `item` as seen at `now`.
    fn mark_as_seen(&mut self, item: &T, now: Instant) -> Result<(), CapacityExceeded>;

    /// In one step: `Ok(true)` if `item` is a duplicate, `Ok(false)` if it is
    /// new and is now marked.
    fn check_and_mark(&mut self, item: &T, now: Instant) -> Result<bool, CapacityExceeded>;

    /// Forgets everything.
    fn clear(&mut self);

    /// Distinct items that count as seen at `now`.
    fn unique_count(&self, now: Instant) -> usize;
}

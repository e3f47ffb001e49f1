//! Done at most once, retried until done: claims on a delivery.
//!
//! A [`OnceGuard`](crate::guard::OnceGuard) claim is kept whatever
//! happens after it is won. That suits a schedule slot (a missed run heals
//! on the next slot) and nothing that must not be lost: a webhook whose
//! handler fails after winning would be skipped for the claim's whole
//! TTL. A claim here has a life, kept in one record per delivery key:
//!
//! ```text
//!   (no record) ──begin──▶ running ──complete──▶ done: kept for `keep`, with its result
//!                           │  │                  (a begin answers Done and the result)
//!                           │  └──fail──▶ failed ──begin──▶ running, attempt n+1, after a failure
//!                           └──lease ends──────────begin──▶ running, attempt n+1, after an expiry
//!   a begin while a lease runs answers Running, with the lease's time left
//!   every record is forgotten `keep` after its last write (at the earliest
//!   when its lease ends)
//! ```
//!
//! A [`ClaimStore`] keeps the records (guard-std's `LocalLocker` in one
//! process; guard-redis's `RedisLocker`, guard-postgres's `PgLocker` and
//! guard-etcd's `EtcdLocker` across replicas, beside their locks) and
//! [`Claims`] drives it for one scope. The contract, which every store
//! passes in guard-testkit's `claims` suite:
//!
//! - a begin starts an attempt only when there is no record, the last
//!   attempt failed, or its lease ended; at most one attempt's lease runs
//!   at a time;
//! - each started attempt's fence is greater than every earlier fence of
//!   the key, and its number is one more than the last attempt's;
//! - `complete` and `fail` take effect only for the attempt that holds the
//!   record (its token), even after its lease ended, as long as no other
//!   attempt began; otherwise they change nothing and answer
//!   [`Settled::Superseded`];
//! - `extend` resets a running lease only while it runs (never once it
//!   ended: another replica may already be starting the next attempt);
//! - a done record answers every begin with its result until it is
//!   forgotten.
//!
//! What it does not promise: an attempt whose lease ended can still be
//! running when the next one starts (a process paused past its lease), so
//! the work is done at most once *per attempt that finished*, and the
//! fence is what lets the resource refuse the older attempt's writes.
//! Keep the lease above the handler's longest run, or extend it.

mod guard;
pub mod redis;

pub use guard::{
    Claim, ClaimConfigError, ClaimError, ClaimEvent, ClaimObserver, ClaimOutcome, ClaimStep,
    Claims, DEFAULT_CLAIM_KEEP, DEFAULT_CLAIM_LEASE, MAX_RESULT_LEN,
};

use core::fmt;
use core::time::Duration;

use crate::lock::{Renewal, Token, Ttl};

/// Why an attempt started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Start {
    /// No record: the first attempt (or the first since the last record
    /// was forgotten).
    Fresh,
    /// The last attempt failed and gave the delivery back.
    AfterFailure,
    /// The last attempt's lease ended before it completed or failed: its
    /// worker died, hung or lost its store.
    AfterExpiry,
}

impl Start {
    /// A short name for logs and metric labels.
    pub const fn name(&self) -> &'static str {
        match self {
            Start::Fresh => "fresh",
            Start::AfterFailure => "after_failure",
            Start::AfterExpiry => "after_expiry",
        }
    }
}

/// A store's answer to [`ClaimStore::try_begin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Begin {
    /// An attempt started: run the work under `token`'s fence.
    Started {
        /// Proof of holding the attempt, with its fence.
        token: Token,
        /// 1 for the first attempt, one more for each after it.
        attempt: u32,
        /// Why it started.
        after: Start,
    },
    /// Another attempt's lease runs: nothing changed.
    Running {
        /// The time left on that lease, on the store's clock (zero when
        /// the store cannot tell).
        lease_left: Duration,
    },
    /// The work was done: the stored result (possibly empty) is in the
    /// caller's buffer, `result_len` bytes; when that is more than the
    /// buffer holds, the buffer has its first bytes only.
    Done {
        /// The stored result's length in bytes.
        result_len: usize,
    },
}

impl Begin {
    /// [`Begin::Done`] for the `stored` result, copying into `buffer` as
    /// much of it as fits.
    pub fn done_with(stored: &[u8], buffer: &mut [u8]) -> Begin {
        let n = stored.len().min(buffer.len());
        if let (Some(to), Some(from)) = (buffer.get_mut(..n), stored.get(..n)) {
            to.copy_from_slice(from);
        }
        Begin::Done {
            result_len: stored.len(),
        }
    }
}

/// A store's answer to [`ClaimStore::complete`] and [`ClaimStore::fail`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Settled {
    /// Recorded: the delivery is done (complete) or given back (fail).
    Recorded,
    /// Another attempt began after this one's lease ended, or the record
    /// was forgotten: nothing changed.
    Superseded,
}

/// A store of claim records; see the module documentation for the
/// contract. [`SendClaimStore`] is its variant with `Send` futures, as
/// [`SendLocker`](crate::lock::SendLocker) is `Locker`'s.
#[trait_variant::make(SendClaimStore: Send)]
#[allow(async_fn_in_trait, reason = "Send-ness follows the concrete store")]
pub trait ClaimStore {
    /// A backend failure (connection, timeout, bad reply).
    type Error: fmt::Debug + fmt::Display;

    /// Starts an attempt on `key` under a lease of `lease` unless one
    /// runs or the work is done; a done record's result is copied into
    /// `result`. A record is kept at least `keep` (and at least its
    /// lease) after this write.
    async fn try_begin(
        &self,
        key: &str,
        lease: Ttl,
        keep: Ttl,
        result: &mut [u8],
    ) -> Result<Begin, Self::Error>;

    /// Resets the lease of `token`'s attempt to `lease` from now, if it
    /// holds the record and its lease has not ended.
    async fn extend(&self, key: &str, token: &Token, lease: Ttl) -> Result<Renewal, Self::Error>;

    /// Records `token`'s attempt as done, with `result` (empty for none),
    /// kept for `keep` from now.
    async fn complete(
        &self,
        key: &str,
        token: &Token,
        keep: Ttl,
        result: &[u8],
    ) -> Result<Settled, Self::Error>;

    /// Records `token`'s attempt as failed, so the next begin starts
    /// another at once; the record (its attempt count) is kept for `keep`.
    async fn fail(&self, key: &str, token: &Token, keep: Ttl) -> Result<Settled, Self::Error>;
}

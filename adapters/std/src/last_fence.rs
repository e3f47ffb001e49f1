//! How far a lock service's fences have gone for a key: what an operator
//! tool asks before it repeats an old leader's work (the gateway's `dlq
//! replay` refuses a letter read under a fence older than the last one).

use std::future::Future;

/// A lock service that tells the last fence it granted for a key.
///
/// The answer is never below any fence granted for the key: exactly the
/// last one where the service keeps it (an etcd key that is held, a
/// PostgreSQL row before its purge, the in-process locker), otherwise the
/// least bound the service can give above it (a Redis key's domain's
/// fence counter, etcd's revision, PostgreSQL's fence sequence). `None`:
/// the service knows of no grant (a store that lost its data says so
/// too). The contract case is
/// `guard_testkit::contract::last_fence_is_never_below_a_granted_one`.
pub trait LastFence {
    /// The lock service's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// At least the last fence granted for `key` (see the trait).
    fn last_fence(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<u64>, Self::Error>> + Send;
}

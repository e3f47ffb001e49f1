//! guard-etcd: a linearizable, fenced `Locker` and `LeaseRenewer` on etcd,
//! for users who cannot accept a second holder (DESIGN: "Linearizable
//! backends (etcd, PostgreSQL) are offered for users who cannot accept a
//! second holder").
//!
//! [`EtcdLocker`] keeps each lock as one etcd key, as given (a prefix is
//! part of the caller's key), whose value is the token id's 32 hex digits
//! and which is attached to a lease of the TTL:
//!
//! - `try_lock`: grant a lease, then one transaction "if neither the key
//!   nor its grant record `<key>\x01grant` exists (create revision 0), put
//!   both on the lease"; the fence is the put's revision. If either exists
//!   the lease is revoked and the answer is `None`.
//! - `unlock`: one transaction "if the value is the token and the create
//!   revision is the fence, delete it and its record, else delete the
//!   record if it is the token's", then revoke the freed lease.
//! - `renew`: grant a new lease of the TTL, one transaction "if the value
//!   is the token and the create revision is the fence, put the key and
//!   its record on the new lease" (which keeps the create revision), then
//!   revoke the old lease. etcd cannot change a lease's TTL, so renewal
//!   moves the key.
//!
//! It is also a `ClaimStore` (guard-core's `claim`: done at most once,
//! retried until done): a record key on a keep lease and a lease key that
//! exists exactly while the attempt's lease runs (layout in its module,
//! `tests/contract.rs::a_three_member_cluster_passes_the_claim_contract`).
//! And a `Semaphore` (guard-core's `semaphore`: at most N holders of a
//! key): a permit is a key of its own on its own lease, put only while
//! the permits counted have not changed since the count.
//!
//! Guarantees:
//! - **One holder per key while etcd's quorum holds.** Every request is a
//!   raft-committed, linearizable transaction: two grants of a key cannot
//!   both see it absent, whichever members the requests reach. A member
//!   that has lost its quorum grants nothing: it cannot commit, and with
//!   `require_leader` it answers `etcdserver: no leader` at once (or the
//!   request times out): an error, never a token.
//! - **The fence is the key's create revision.** etcd's revision is one
//!   counter for the whole cluster, strictly increasing and never reused,
//!   so each grant's fence is greater than every earlier fence of the key,
//!   also across member crashes and leader changes, as long as a quorum's
//!   data survives (etcd keeps its log on disk; a cluster rebuilt from an
//!   old snapshot starts again from the snapshot's revision).
//! - **A lost key is granted to nobody before its holder's lease ends.**
//!   The grant record lives on the holder's lease, so a key deleted by
//!   hand mid-lease leaves it, and no acquisition succeeds until that
//!   lease ends; the holder's renewal reports the loss
//!   (`tests/contract.rs::a_lost_lock_key_is_granted_to_nobody_before_its_holder_s_deadline`).
//!   A lock key with NUL or U+0001 (the permits' and the record's
//!   separators) is refused.
//! - **Stale tokens release and renew nothing.** The checks compare both
//!   the value (the token id) and the create revision (the fence): a later
//!   incarnation of the key is never mistaken for the one a token holds.
//! - **Leases run on the etcd leader's clock, and only ever run long.**
//!   A lease expires when the leader's timer says so; after a leader
//!   change the new leader restarts every lease's countdown at its full
//!   TTL plus an election timeout, so a key can outlive its TTL (a standby takes over later than
//!   the TTL), never the reverse. A holder that demotes itself at
//!   `sent_at + ttl - drift` (guard-core's `ActiveGuard`) has stopped
//!   before its key can be gone.
//! - **TTL granularity is one second.** Leases are whole seconds: a TTL
//!   is rounded up, and the server raises a lease below its minimum (1.5
//!   election timeouts rounded up to a second: 2 s with etcd's default
//!   1 s election timeout) to that minimum. The lock is never held for
//!   less than asked; it can be held longer.
//! - **A lost member costs at most one failed call.** Each endpoint has
//!   a client; a request refused unapplied (connection refused, "no
//!   leader") is tried on the next endpoint at once, and a call that
//!   failed otherwise sends the next one elsewhere. During an election
//!   (about an election timeout) every member answers "no leader": calls
//!   fail fast, and the caller's policy decides (an active guard demotes
//!   on a failed renewal; its key, lengthened by the new leader, keeps
//!   standbys out until it expires).
//! - **Errors are values.** Every request is bounded by the configured
//!   timeout ([`DEFAULT_TIMEOUT`], 2 s); an unreachable cluster, a refused
//!   request and a reply the locker cannot use are an [`EtcdError`] naming
//!   the call and the endpoint, never a panic. An error is not a "no": a
//!   `try_lock` that failed after its transaction was applied leaves the
//!   key on a lease it revokes if it can, else it expires at its TTL,
//!   with no token anywhere; a `renew` that failed may have moved the key
//!   to its new lease, which is then kept (the key lives the longer of the
//!   two leases).
//!
//! Limits:
//! - **etcd keeps every revision until it is compacted.** Each grant,
//!   renewal (a put on the new lease) and release writes a revision; run
//!   etcd with `--auto-compaction-retention` (as Kubernetes does), or its
//!   space quota fills and it refuses writes (every guard then fails
//!   closed).
//! - **Fail-fast is for a member that knows it has no leader.** A member
//!   cut off from its quorum answers "no leader" once its election
//!   timeout has passed; before that, a request it forwards waits for the
//!   request timeout.
//!
//! It works inside a tokio runtime and outside one (smol, async-io, a
//! plain `block_on`): etcd-client needs tokio's reactor, and each call runs
//! inside async-compat's `Compat`, which enters the caller's tokio runtime
//! or async-compat's own. Its futures are `Send` (it is a `SendLocker`),
//! and it is a `guard_std::DynLocker`, for a `SharedLocker` and a
//! `GuardConfig`.
//!
//! ```no_run
//! # futures_lite::future::block_on(async {
//! use std::time::Duration;
//!
//! use guard_core::lock::{Locker, Ttl};
//! use guard_etcd::{EtcdConfig, EtcdLocker};
//!
//! let config = EtcdConfig::new(["http://127.0.0.1:2379", "http://127.0.0.1:22379"])
//!     .with_timeout(Duration::from_secs(1));
//! let locker = EtcdLocker::connect(config).await?;
//! if let Some(token) = locker.try_lock("myapp/locks/report", Ttl::from_secs(10)?).await? {
//!     // Hand `token.fence()` to the resource with every side effect.
//!     println!("held with fence {}", token.fence());
//!     locker.unlock("myapp/locks/report", &token).await?;
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # });
//! ```
// docs.rs (nightly, `--cfg docsrs`) marks each feature-gated item with
// the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod locker;

pub use error::{Call, EtcdError};
pub use locker::{DEFAULT_TIMEOUT, EtcdConfig, EtcdLocker};

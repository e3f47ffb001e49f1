//! The error of the etcd locker.

use std::error::Error;
use std::fmt;

/// The etcd request that failed, as named in an [`EtcdError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Call {
    /// Building the client ([`EtcdLocker::connect`](crate::EtcdLocker::connect)).
    Connect,
    /// `LeaseGrant`: the lease a grant or a renewal puts the key on.
    LeaseGrant,
    /// The transaction of `try_lock` (put if absent).
    Acquire,
    /// The transaction of `unlock` (compare and delete).
    Release,
    /// The transaction of `renew` (compare and move to the new lease).
    Renew,
    /// `LeaseRevoke` of a lease no key uses any more (best effort: only
    /// logged).
    LeaseRevoke,
    /// `Status` of a member ([`EtcdLocker::check`](crate::EtcdLocker::check)).
    Status,
    /// A claim's read of its record and lease keys.
    ClaimRead,
    /// The transaction of a claim's begin (compare and start an attempt).
    ClaimBegin,
    /// The transaction of a claim's extend (compare and move the lease).
    ClaimExtend,
    /// The transaction of a claim's complete or fail.
    ClaimSettle,
    /// `LeaseKeepAlive` of a claim record's lease at an extend.
    LeaseKeepAlive,
    /// The count of a semaphore's permits.
    PermitCount,
    /// The transaction of a permit's acquisition (put if the permits
    /// counted are unchanged).
    PermitAcquire,
    /// The read of a key's last fence (`LastFence`).
    LastFence,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Call::Connect => "connect",
            Call::LeaseGrant => "lease grant",
            Call::Acquire => "acquire transaction",
            Call::Release => "release transaction",
            Call::Renew => "renew transaction",
            Call::LeaseRevoke => "lease revoke",
            Call::Status => "status",
            Call::ClaimRead => "claim read",
            Call::ClaimBegin => "claim begin transaction",
            Call::ClaimExtend => "claim extend transaction",
            Call::PermitCount => "permit count",
            Call::PermitAcquire => "permit acquire transaction",
            Call::ClaimSettle => "claim settle transaction",
            Call::LeaseKeepAlive => "lease keep-alive",
            Call::LastFence => "last fence read",
        })
    }
}

/// An etcd locker failure: what was asked, of which cluster, and why.
///
/// The message names the [`Call`] and the endpoint that failed it (when
/// every endpoint refused a request, the last one tried);
/// [`source`](Error::source) is etcd-client's error where there is one. A reply the locker cannot use
/// is [`EtcdError::BadReply`], never a panic.
#[derive(Debug)]
#[non_exhaustive]
pub enum EtcdError {
    /// The request failed: unreachable, timed out, refused by the server
    /// (`etcdserver: no leader` from a member cut off from its quorum,
    /// a lease TTL beyond etcd's maximum, an empty key, ...).
    Request {
        /// The request.
        call: Call,
        /// The endpoint that failed it.
        endpoint: String,
        /// etcd-client's error.
        source: etcd_client::Error,
    },
    /// The server answered something the locker cannot have asked for
    /// (a missing header, an operation reply of another kind).
    BadReply {
        /// The request.
        call: Call,
        /// The endpoint that answered.
        endpoint: String,
        /// What was wrong with the reply.
        detail: String,
    },
    /// The locker was given no endpoint.
    NoEndpoints,
    /// A parameter or key the locker refuses before asking etcd.
    InvalidInput {
        /// What was refused: `lock key` or `request timeout`.
        parameter: &'static str,
        /// The value given, as text.
        value: String,
        /// The rule it breaks.
        rule: String,
    },
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdError::Request {
                call,
                endpoint,
                source,
            } => write!(f, "etcd {call} at {endpoint} failed: {source}"),
            EtcdError::BadReply {
                call,
                endpoint,
                detail,
            } => write!(f, "etcd {call} at {endpoint}: unexpected reply: {detail}"),
            EtcdError::NoEndpoints => f.write_str("etcd locker: no endpoint given"),
            EtcdError::InvalidInput {
                parameter,
                value,
                rule,
            } => write!(f, "etcd locker: invalid {parameter} {value:?}: {rule}"),
        }
    }
}

impl Error for EtcdError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            EtcdError::Request { source, .. } => Some(source),
            _ => None,
        }
    }
}

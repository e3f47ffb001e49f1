//! A linearizable, fenced lock service on etcd (see the crate
//! documentation for what it guarantees), and a claim store and a
//! semaphore beside it.

mod claims;
mod semaphore;

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_compat::Compat;
use etcd_client::proto::{PbKeyValue, PbTxnOpResponse};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, PutOptions, Txn, TxnOp, TxnResponse,
};
use guard_core::lock::{
    MAX_KEY_LEN, Renewal, SendLeaseRenewer, SendLocker, Token, TokenId, Ttl, UnlockError,
};
use guard_std::TokenIds;

use crate::error::{Call, EtcdError};

/// How long one request to etcd may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the etcd cluster is and how long a request may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    timeout: Duration,
}

impl EtcdConfig {
    /// The cluster's client URLs (`http://host:2379`; a request goes to
    /// any of them), with the [`DEFAULT_TIMEOUT`].
    pub fn new<E: Into<String>>(endpoints: impl IntoIterator<Item = E>) -> Self {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// How long one request (and a connection attempt) may take before it
    /// is an error. A call of the locker makes two or three requests, each
    /// tried on more than one endpoint only when an endpoint refused it
    /// unapplied (at once, as a refused connection or "no leader" are).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// A `Locker` and `LeaseRenewer` on etcd: the key as given, its value the
/// token id's 32 hex digits, attached to a lease of the TTL; the fence is
/// the key's create revision.
///
/// Beside each lock, on the same lease, its *grant record*
/// `<key>\x01grant` holds the same token. An acquisition is refused while
/// either exists, so a lock key deleted by hand mid-lease (an operator's
/// `etcdctl del`) is granted to nobody while its holder may still believe
/// it holds it: the record lives until the holder's lease ends, and the
/// holder's next renewal, finding its key gone, tells it so. A renewal
/// moves both to the new lease; a release deletes both, or the record
/// alone when the key was lost (the holder believes nothing any more).
/// **The limit:** a loss of both (a revoked lease, a cluster restored
/// from an older snapshot) can grant the key again while its old holder
/// still believes it, until that holder's next renewal.
///
/// Keys are used as given: a prefix that namespaces an application
/// (`myapp/locks/`) is the caller's, part of the key.
///
/// Each endpoint has a client of its own. A request goes to the endpoint
/// that answered last; one that refuses the connection, or answers
/// `etcdserver: no leader` (a member cut off from its quorum, which
/// rejects the request before doing anything), is tried on the next
/// endpoint at once, each endpoint once: such a request was never
/// applied, so trying it elsewhere cannot apply it twice. Any other error
/// (a timeout, a reset connection: the request may have been applied) is
/// returned, and the next call starts at the next endpoint.
///
/// Calls work from any runtime: each runs inside async-compat's `Compat`,
/// which enters the caller's tokio runtime or async-compat's own (a
/// thread of its own, started on first use), since etcd-client's sockets
/// and timers need tokio's reactor. Its futures are `Send`.
pub struct EtcdLocker {
    members: Vec<Member>,
    /// The endpoint to try first: the last one that answered.
    preferred: AtomicUsize,
    ids: TokenIds,
}

/// One endpoint and its client.
struct Member {
    endpoint: String,
    client: Client,
}

impl fmt::Debug for EtcdLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLocker")
            .field("endpoints", &self.endpoints().collect::<Vec<_>>())
            .field("preferred", &self.preferred.load(Ordering::Relaxed))
            .finish()
    }
}

/// Runs `work` where etcd-client can: inside the caller's tokio runtime,
/// or async-compat's (as guard-endpoints' `on_tokio`).
async fn on_tokio<F: Future>(work: F) -> F::Output {
    Compat::new(work).await
}

/// Whole seconds for `ttl`, rounded up and at least 1, so the lease is
/// never shorter than asked. A TTL beyond etcd's maximum lease (about 285
/// years) is sent as it is, for the server to refuse: an error rather
/// than a shorter lease.
fn lease_secs(ttl: Ttl) -> i64 {
    i64::try_from(ttl.as_millis_ceil().div_ceil(1_000).max(1)).unwrap_or(i64::MAX)
}

/// Whether `error` proves the request was not applied, so that another
/// member may be asked: the connection was refused (nothing was sent), or
/// the member has no leader (etcd's require-leader check rejects the
/// request before it is proposed; raft proposals never fail with it).
fn never_applied(error: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn StdError + 'static)> = match error {
        etcd_client::Error::GRpcStatus(status) => {
            if status.message() == "etcdserver: no leader" {
                return true;
            }
            status.source()
        }
        etcd_client::Error::TransportError(e) => e.source(),
        etcd_client::Error::IoError(e) => Some(e),
        _ => None,
    };
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        source = e.source();
    }
    false
}

impl EtcdLocker {
    /// A locker on the cluster at `config`'s endpoints.
    ///
    /// Connections are made on the first request (an unreachable cluster
    /// is an error of the first call, not of this one). Every request is
    /// bounded by the config's timeout and requires the member it reaches
    /// to have a leader, so a member cut off from its quorum answers
    /// `etcdserver: no leader` at once rather than hanging.
    ///
    /// Call it where the locker will be used: inside a tokio runtime the
    /// clients' connection tasks run on that runtime (which must outlive
    /// the locker), outside one on async-compat's.
    pub async fn connect(config: EtcdConfig) -> Result<Self, EtcdError> {
        if config.endpoints.is_empty() {
            return Err(EtcdError::NoEndpoints);
        }
        if config.timeout < Duration::from_millis(1) {
            return Err(EtcdError::InvalidInput {
                parameter: "request timeout",
                value: format!("{:?}", config.timeout),
                rule: "must be at least 1 ms".to_owned(),
            });
        }
        // No HTTP/2 keep-alive (etcd-client's default): every request has
        // its own timeout, and etcd answers pings more often than every 5 s,
        // or on an idle connection, with GOAWAY.
        let options = ConnectOptions::new()
            .with_timeout(config.timeout)
            .with_connect_timeout(config.timeout)
            .with_require_leader(true);
        let mut members = Vec::with_capacity(config.endpoints.len());
        for endpoint in config.endpoints {
            let client = on_tokio(Client::connect([endpoint.as_str()], Some(options.clone())))
                .await
                .map_err(|source| EtcdError::Request {
                    call: Call::Connect,
                    endpoint: endpoint.clone(),
                    source,
                })?;
            members.push(Member { endpoint, client });
        }
        Ok(EtcdLocker {
            members,
            preferred: AtomicUsize::new(0),
            ids: TokenIds::new(),
        })
    }

    /// Asks a member for its status, as any request would (the preferred
    /// endpoint, then the next while one refuses): `Ok` once a member with
    /// a leader answered. For an application that must find an
    /// unreachable cluster at start rather than at its first grant.
    pub async fn check(&self) -> Result<(), EtcdError> {
        let (reply, endpoint) = self
            .request(
                Call::Status,
                |mut c| async move { on_tokio(c.status()).await },
            )
            .await?;
        if reply.leader() == 0 {
            return Err(Self::bad_reply(
                Call::Status,
                endpoint,
                "the member has no leader",
            ));
        }
        Ok(())
    }

    /// The endpoints, in the order given.
    pub fn endpoints(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|m| m.endpoint.as_str())
    }

    /// Sends one request, `op` on a member's client, as the type's
    /// documentation says: on the preferred member, then on the next ones
    /// while the answer proves it was not applied. The reply and the
    /// endpoint that gave it.
    async fn request<T, F, Fut>(&self, call: Call, op: F) -> Result<(T, &str), EtcdError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.members.len();
        let first = self.preferred.load(Ordering::Relaxed) % n.max(1);
        let mut last = None;
        for i in (first..n).chain(0..first) {
            let Some(member) = self.members.get(i) else {
                continue;
            };
            match op(member.client.clone()).await {
                Ok(reply) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok((reply, &member.endpoint));
                }
                Err(source) => {
                    let retry = never_applied(&source);
                    let error = EtcdError::Request {
                        call,
                        endpoint: member.endpoint.clone(),
                        source,
                    };
                    if !retry {
                        // Start the next call elsewhere: this member may be
                        // gone or frozen; one failed call each is the cost.
                        let _ = self.preferred.compare_exchange(
                            first,
                            (i + 1) % n,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                        return Err(error);
                    }
                    tracing::debug!("{error}; trying the next endpoint");
                    last = Some(error);
                }
            }
        }
        Err(last.unwrap_or(EtcdError::NoEndpoints))
    }

    fn bad_reply(call: Call, endpoint: &str, detail: impl Into<String>) -> EtcdError {
        EtcdError::BadReply {
            call,
            endpoint: endpoint.to_owned(),
            detail: detail.into(),
        }
    }

    /// A new lease of `ttl` (in whole seconds, see [`lease_secs`]): its id.
    async fn grant_lease(&self, ttl: Ttl) -> Result<i64, EtcdError> {
        let secs = lease_secs(ttl);
        let (reply, endpoint) = self
            .request(Call::LeaseGrant, |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        if !reply.error().is_empty() {
            return Err(Self::bad_reply(Call::LeaseGrant, endpoint, reply.error()));
        }
        if reply.id() == 0 {
            return Err(Self::bad_reply(Call::LeaseGrant, endpoint, "lease id 0"));
        }
        Ok(reply.id())
    }

    /// Revokes `lease`, best effort: one that no key uses any more (or that
    /// failed to take a key) would expire on its own at its TTL anyway.
    async fn revoke(&self, lease: i64) {
        if lease == 0 {
            return;
        }
        let revoked = self
            .request(Call::LeaseRevoke, |mut c| async move {
                c.lease_revoke(lease).await
            })
            .await;
        if let Err(e) = revoked {
            tracing::debug!("lease {lease:x} left to expire: {e}");
        }
    }

    async fn txn(&self, call: Call, txn: Txn) -> Result<(TxnResponse, &str), EtcdError> {
        self.request(call, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// `key`'s grant record (see the type's documentation). A lock key
    /// holds no U+0001 ([`checked_key`]), so no lock is another's record,
    /// and no NUL, so no semaphore counts it among its permits.
    fn grant_record(key: &str) -> String {
        format!("{key}\u{1}grant")
    }

    /// The compares that prove `token` holds `key`: its value is the
    /// token's id and it is the same incarnation of the key (created at
    /// the token's fence), not a later one that happens to carry an equal
    /// value. `None` for a fence no etcd revision can be.
    fn held_by(key: &str, token: &Token) -> Option<[Compare; 2]> {
        let fence = i64::try_from(token.fence()).ok()?;
        Some([
            Compare::value(key, CompareOp::Equal, hex(token.id())),
            Compare::create_revision(key, CompareOp::Equal, fence),
        ])
    }

    async fn try_lock_inner(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, EtcdError> {
        checked_key(key)?;
        let id = self.ids.next_id();
        let lease = self.grant_lease(ttl).await?;
        // Absent (create revision 0), with no grant record left by a lost
        // key, is the only state in which the key is taken; the put's
        // revision then is its create revision: the fence.
        let record = Self::grant_record(key);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, 0),
                Compare::create_revision(record.as_str(), CompareOp::Equal, 0),
            ])
            .and_then([
                TxnOp::put(key, hex(&id), Some(PutOptions::new().with_lease(lease))),
                TxnOp::put(record, hex(&id), Some(PutOptions::new().with_lease(lease))),
            ]);
        let (reply, endpoint) = match self.txn(Call::Acquire, txn).await {
            Ok(reply) => reply,
            Err(e) => {
                // The token is never handed out, so the lease may go even
                // if the put was applied and only its answer lost: that
                // frees the key now instead of at the TTL.
                self.revoke(lease).await;
                return Err(e);
            }
        };
        if !reply.succeeded() {
            self.revoke(lease).await;
            return Ok(None);
        }
        let fence = match reply
            .0
            .responses
            .first()
            .and_then(|op| op.response.as_ref())
        {
            Some(PbTxnOpResponse::ResponsePut(put)) => put.header.as_ref().map(|h| h.revision),
            _ => None,
        };
        match fence.and_then(|r| u64::try_from(r).ok()).filter(|&r| r > 0) {
            Some(fence) => Ok(Some(Token::new(id, fence))),
            None => Err(Self::bad_reply(
                Call::Acquire,
                endpoint,
                format!("no put revision in {:?}", reply.0.responses),
            )),
        }
    }

    async fn unlock_inner(&self, key: &str, token: &Token) -> Result<(), UnlockError<EtcdError>> {
        checked_key(key).map_err(UnlockError::Backend)?;
        self.unlock_held(key, token).await
    }

    /// Deletes `key` and its grant record if `token` holds it (compare
    /// and delete), and revokes its lease: a lock's release. When the key
    /// is gone but the record is `token`'s, the record alone is deleted
    /// (and the release is still `NotHeld`).
    async fn unlock_held(&self, key: &str, token: &Token) -> Result<(), UnlockError<EtcdError>> {
        let record = Self::grant_record(key);
        let forget = Txn::new()
            .when([Compare::value(
                record.as_str(),
                CompareOp::Equal,
                hex(token.id()),
            )])
            .and_then([TxnOp::delete(record.as_str(), None)]);
        self.delete_held(
            key,
            token,
            &[TxnOp::delete(record.as_str(), None)],
            &[TxnOp::txn(forget)],
        )
        .await
    }

    /// Deletes `key` if `token` holds it (compare and delete), with
    /// `also` in the same transaction, and revokes its lease; otherwise
    /// runs `otherwise`: a lock's release, and a permit's.
    async fn delete_held(
        &self,
        key: &str,
        token: &Token,
        also: &[TxnOp],
        otherwise: &[TxnOp],
    ) -> Result<(), UnlockError<EtcdError>> {
        let Some(held) = Self::held_by(key, token) else {
            return Err(UnlockError::NotHeld);
        };
        let mut ops = vec![TxnOp::delete(
            key,
            Some(DeleteOptions::new().with_prev_key()),
        )];
        ops.extend_from_slice(also);
        let txn = Txn::new()
            .when(held)
            .and_then(ops)
            .or_else(otherwise.to_vec());
        let (reply, endpoint) = self
            .txn(Call::Release, txn)
            .await
            .map_err(UnlockError::Backend)?;
        if !reply.succeeded() {
            return Err(UnlockError::NotHeld);
        }
        let lease = match reply
            .0
            .responses
            .first()
            .and_then(|op| op.response.as_ref())
        {
            Some(PbTxnOpResponse::ResponseDeleteRange(deleted)) => {
                deleted.prev_kvs.first().map(|kv: &PbKeyValue| kv.lease)
            }
            _ => None,
        };
        match lease {
            // Released; the lease now holds no key.
            Some(lease) => {
                self.revoke(lease).await;
                Ok(())
            }
            None => Err(UnlockError::Backend(Self::bad_reply(
                Call::Release,
                endpoint,
                format!("no deleted key in {:?}", reply.0.responses),
            ))),
        }
    }

    /// etcd cannot change a lease's TTL (a keep-alive restarts it at the
    /// TTL it was granted with), so a renewal moves the key to a new lease
    /// of the asked TTL: grant it, then one transaction that checks the
    /// token still holds the key and puts the same value on the new lease
    /// (a put on an existing key keeps its create revision, so the fence
    /// stays), then revoke the old lease. Three round trips, and the only
    /// change of the key is atomic with the check: there is no moment in
    /// which the key is free or held by another lease of ours.
    async fn renew_inner(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, EtcdError> {
        checked_key(key)?;
        self.move_held(key, token, ttl, Some(&Self::grant_record(key)))
            .await
    }

    /// Moves `key` (and `record`, its grant record, if it has one) to a
    /// new lease of `ttl` if `token` holds it (see
    /// [`renew_inner`](Self::renew_inner)): a lock's renewal, and a
    /// permit's.
    async fn move_held(
        &self,
        key: &str,
        token: &Token,
        ttl: Ttl,
        record: Option<&str>,
    ) -> Result<Renewal, EtcdError> {
        let Some(held) = Self::held_by(key, token) else {
            return Ok(Renewal::Lost);
        };
        let lease = self.grant_lease(ttl).await?;
        let mut ops = vec![TxnOp::put(
            key,
            hex(token.id()),
            Some(PutOptions::new().with_lease(lease).with_prev_key()),
        )];
        ops.extend(record.map(|record| {
            TxnOp::put(
                record,
                hex(token.id()),
                Some(PutOptions::new().with_lease(lease)),
            )
        }));
        let txn = Txn::new().when(held).and_then(ops);
        // On an error the new lease is kept: the put may have been applied
        // with its answer lost, and revoking would then delete the key
        // before the old lease's end, while the holder may still act until
        // its renew deadline (measured from its last successful renewal).
        let (reply, endpoint) = self.txn(Call::Renew, txn).await?;
        if !reply.succeeded() {
            self.revoke(lease).await;
            return Ok(Renewal::Lost);
        }
        let old = match reply
            .0
            .responses
            .first()
            .and_then(|op| op.response.as_ref())
        {
            Some(PbTxnOpResponse::ResponsePut(put)) => put.prev_kv.as_ref().map(|kv| kv.lease),
            _ => None,
        };
        match old {
            Some(old) => {
                // The key is on the new lease now; the old one holds nothing.
                if old != lease {
                    self.revoke(old).await;
                }
                Ok(Renewal::Held)
            }
            None => Err(Self::bad_reply(
                Call::Renew,
                endpoint,
                format!("no previous key in {:?}", reply.0.responses),
            )),
        }
    }
}

/// Refuses a key no lock can have: empty (etcd refuses it too), longer
/// than the guards' [`MAX_KEY_LEN`], as every other locker does, with a
/// NUL (the separator of a semaphore's permits: a lock `k\0x` would count
/// as a permit of semaphore `k`; PostgreSQL refuses NUL too) or with a
/// U+0001 (the separator of a grant record: a lock `k\x01grant` would be
/// lock `k`'s). Guard-built keys escape both (`%00`, `%01`).
fn checked_key(key: &str) -> Result<(), EtcdError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN || key.contains(['\0', '\u{1}']) {
        return Err(EtcdError::InvalidInput {
            parameter: "lock key",
            value: key.to_owned(),
            rule: format!("must be 1 to {MAX_KEY_LEN} bytes without NUL or U+0001"),
        });
    }
    Ok(())
}

fn hex(id: &TokenId) -> String {
    id.to_string()
}

impl SendLocker for EtcdLocker {
    type Error = EtcdError;

    fn is_invalid_input(error: &EtcdError) -> bool {
        matches!(error, EtcdError::InvalidInput { .. })
    }

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, EtcdError> {
        on_tokio(self.try_lock_inner(key, ttl)).await
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<EtcdError>> {
        on_tokio(self.unlock_inner(key, token)).await
    }
}

impl SendLeaseRenewer for EtcdLocker {
    async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, EtcdError> {
        on_tokio(self.renew_inner(key, token, ttl)).await
    }
}

/// The key's create revision while it is held (its grant's fence), else
/// the cluster's revision, above every fence granted so far.
impl guard_std::LastFence for EtcdLocker {
    type Error = EtcdError;

    async fn last_fence(&self, key: &str) -> Result<Option<u64>, EtcdError> {
        checked_key(key)?;
        let key = key.to_owned();
        let (reply, endpoint) = on_tokio(self.request(Call::LastFence, |mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        }))
        .await?;
        let revision = match reply.kvs().first() {
            Some(kv) => kv.create_revision(),
            None => reply.header().map_or(0, |h| h.revision()),
        };
        match u64::try_from(revision) {
            Ok(0) => Ok(None),
            Ok(fence) => Ok(Some(fence)),
            Err(_) => Err(Self::bad_reply(
                Call::LastFence,
                endpoint,
                format!("revision {revision}"),
            )),
        }
    }
}

guard_std::impl_dyn_locker!(EtcdLocker);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connection_was_never_applied_a_reset_one_may_have_been() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(never_applied(&etcd_client::Error::IoError(refused)));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!never_applied(&etcd_client::Error::IoError(reset)));
        assert!(!never_applied(&etcd_client::Error::InvalidArgs("x".into())));
    }

    #[test]
    fn a_lease_is_never_shorter_than_the_ttl() {
        let secs = |ms| lease_secs(Ttl::from_millis(ms).unwrap());
        assert_eq!(secs(1), 1);
        assert_eq!(secs(999), 1);
        assert_eq!(secs(1_000), 1);
        assert_eq!(secs(1_001), 2);
        assert_eq!(secs(2_400), 3);
        // The longest TTL, rounded up too (etcd refuses it: beyond its maximum).
        let longest = Ttl::new(Duration::MAX).unwrap();
        assert_eq!(lease_secs(longest), 18_446_744_073_709_552);
    }
}

//! A lock service with Redis semantics: TTLs on the server's clock,
//! `SET NX` plus a fence counter in one script, compare-and-expire,
//! compare-and-delete; and asynchronous replication to a replica that a
//! failover promotes, losing the writes it had not received.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::clock::Nanos;

/// One lock entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Who holds it (the token's id).
    pub token: u128,
    /// Its fence.
    pub fence: u64,
    /// When it expires, on the server's clock.
    pub expires_at: Nanos,
}

/// A request to the lock service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockOp {
    /// `SET key token NX PX ttl` and `INCR fence:key` in one script.
    Acquire {
        /// The key.
        key: String,
        /// The token the client chose.
        token: u128,
        /// Lease length.
        ttl_ns: u64,
    },
    /// `PEXPIRE key ttl` if the key holds `token`.
    Renew {
        /// The key.
        key: String,
        /// The holder's token.
        token: u128,
        /// Lease length.
        ttl_ns: u64,
    },
    /// `DEL key` if the key holds `token`.
    Release {
        /// The key.
        key: String,
        /// The holder's token.
        token: u128,
    },
}

/// The answer to a [`LockOp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockReply {
    /// Acquired with this fence.
    Granted(u64),
    /// Held by someone else.
    Busy,
    /// Renewed or released.
    Done,
    /// Not held by this token.
    NotHeld,
}

/// The data a lock service keeps: leases and fence counters.
#[derive(Clone, Debug, Default)]
struct Store {
    leases: HashMap<String, Lease>,
    fences: HashMap<String, u64>,
    /// Expiry index, so expired keys are swept in order (bounded memory
    /// over millions of slot keys).
    by_expiry: BTreeMap<(Nanos, u128), String>,
}

impl Store {
    fn live(&self, key: &str, now: Nanos) -> Option<Lease> {
        self.leases.get(key).copied().filter(|l| l.expires_at > now)
    }

    fn set(&mut self, key: &str, lease: Lease) {
        if let Some(old) = self.leases.insert(key.to_owned(), lease) {
            self.by_expiry.remove(&(old.expires_at, old.token));
        }
        self.by_expiry
            .insert((lease.expires_at, lease.token), key.to_owned());
    }

    fn delete(&mut self, key: &str) {
        if let Some(old) = self.leases.remove(key) {
            self.by_expiry.remove(&(old.expires_at, old.token));
        }
    }

    fn sweep(&mut self, now: Nanos) {
        while let Some(entry) = self.by_expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            if self.leases.get(&key).is_some_and(|l| l.expires_at <= now) {
                self.leases.remove(&key);
            }
        }
    }

    /// Applies `op` at `now`; the reply and whether it wrote.
    fn apply(&mut self, op: &LockOp, now: Nanos) -> (LockReply, bool) {
        match op {
            LockOp::Acquire { key, token, ttl_ns } => {
                if self.live(key, now).is_some() {
                    return (LockReply::Busy, false);
                }
                let fence = self.fences.entry(key.clone()).or_insert(0);
                *fence += 1;
                let fence = *fence;
                self.set(
                    key,
                    Lease {
                        token: *token,
                        fence,
                        expires_at: now + ttl_ns,
                    },
                );
                (LockReply::Granted(fence), true)
            }
            LockOp::Renew { key, token, ttl_ns } => match self.live(key, now) {
                Some(lease) if lease.token == *token => {
                    self.set(
                        key,
                        Lease {
                            expires_at: now + ttl_ns,
                            ..lease
                        },
                    );
                    (LockReply::Done, true)
                }
                _ => (LockReply::NotHeld, false),
            },
            LockOp::Release { key, token } => match self.live(key, now) {
                Some(lease) if lease.token == *token => {
                    self.delete(key);
                    (LockReply::Done, true)
                }
                _ => (LockReply::NotHeld, false),
            },
        }
    }
}

/// The lock service: a primary that answers, and a replica that applies
/// the primary's writes `replication_lag_ns` later (Redis replicates
/// asynchronously; a script's effects travel together).
#[derive(Debug)]
pub struct LockService {
    primary: Store,
    replica: Store,
    /// Writes on their way to the replica: (apply at, op, primary's time).
    in_transit: VecDeque<(Nanos, LockOp, Nanos)>,
    replication_lag_ns: u64,
    /// Unavailable until this time (a failover in progress).
    down_until: Nanos,
    ops_since_sweep: u32,
    /// Writes the last failover lost.
    pub lost_writes: u64,
}

impl LockService {
    /// A service whose replica lags by `replication_lag_ns`.
    pub fn new(replication_lag_ns: u64) -> Self {
        LockService {
            primary: Store::default(),
            replica: Store::default(),
            in_transit: VecDeque::new(),
            replication_lag_ns,
            down_until: 0,
            ops_since_sweep: 0,
            lost_writes: 0,
        }
    }

    /// Whether the service answers at `now`.
    pub fn is_up(&self, now: Nanos) -> bool {
        now >= self.down_until
    }

    /// Handles `op` at `now`; `None` while a failover is in progress (the
    /// request is lost, the client times out).
    pub fn handle(&mut self, op: &LockOp, now: Nanos) -> Option<LockReply> {
        if !self.is_up(now) {
            return None;
        }
        self.replicate(now);
        self.ops_since_sweep += 1;
        if self.ops_since_sweep >= 1024 {
            self.ops_since_sweep = 0;
            self.primary.sweep(now);
            self.replica.sweep(now);
        }
        let (reply, wrote) = self.primary.apply(op, now);
        if wrote {
            self.in_transit
                .push_back((now + self.replication_lag_ns, op.clone(), now));
        }
        Some(reply)
    }

    /// Applies to the replica every write that has reached it by `now`.
    fn replicate(&mut self, now: Nanos) {
        while self.in_transit.front().is_some_and(|(at, _, _)| *at <= now) {
            if let Some((_, op, written_at)) = self.in_transit.pop_front() {
                // The replica executes the write as the primary did, at the
                // primary's time (Redis propagates absolute expiries).
                let _ = self.replica.apply(&op, written_at);
            }
        }
    }

    /// The replica becomes the primary at `now`, unavailable for
    /// `downtime_ns`; writes it had not received are lost.
    pub fn fail_over(&mut self, now: Nanos, downtime_ns: u64) {
        self.replicate(now);
        self.lost_writes += self.in_transit.len() as u64;
        self.in_transit.clear();
        self.primary = self.replica.clone();
        self.down_until = now + downtime_ns;
    }

    /// The live lease of `key` by the primary's view.
    pub fn holder(&self, key: &str, now: Nanos) -> Option<Lease> {
        self.primary.live(key, now)
    }
}

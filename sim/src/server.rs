//! A lock service with Redis semantics: TTLs on the serving node's wall
//! clock, `SET NX` plus a fence in one script, compare-and-expire,
//! compare-and-delete; asynchronous replication to a replica that a
//! failover promotes, losing the writes it had not received; and restarts
//! without persistence, which lose everything.
//!
//! The fence of a grant is `max(counter + 1, server time in µs)`, stored as
//! the counter ([`FenceRule::ServerTime`]), so a node that lost the counter
//! still hands out larger fences while its wall clock reads more than the
//! largest fence lost. [`FenceRule::PlainCounter`] is the old derivation.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::clock::{Clock, Nanos};
use crate::config::FenceRule;

/// One lock entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Who holds it (the token's id).
    pub token: u128,
    /// Its fence.
    pub fence: u64,
    /// When it expires, on the clock of the node that wrote it (Redis
    /// replicates absolute expiries).
    pub expires_at: Nanos,
    /// The length it was granted or last renewed for.
    pub ttl_ns: u64,
}

/// A request to the lock service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockOp {
    /// `SET key token NX PX ttl` and the fence of `fence:key` in one script.
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

/// What a write replaced: applying it in reverse restores the store to
/// before the write (the replica's view, which has not received it).
#[derive(Clone, Debug)]
struct Undo {
    key: String,
    lease: Option<Lease>,
    grant: Option<Lease>,
    fence: Option<u64>,
}

/// The serving node's clock at one instant.
#[derive(Clone, Copy, Debug)]
struct Now {
    /// Its wall reading in nanoseconds since the run's start (expiries).
    local: Nanos,
    /// Its wall reading in microseconds since the Unix epoch (`TIME`).
    micros: u64,
}

/// The data a lock service keeps: leases, their grant records and fence
/// counters.
#[derive(Clone, Debug, Default)]
struct Store {
    leases: HashMap<String, Lease>,
    /// Each key's last grant, kept beside its lease and ending with it
    /// (the scripts' grant record, `core/src/lock/redis.rs`): a lease lost
    /// alone ([`LockService::lose_key`]) leaves it, and an acquisition is
    /// refused while it lives.
    grants: HashMap<String, Lease>,
    fences: HashMap<String, u64>,
    /// Expiry index, so expired keys are swept in order (bounded memory
    /// over millions of slot keys).
    by_expiry: BTreeMap<(Nanos, u128), String>,
    /// The grant records' expiry index.
    grants_by_expiry: BTreeMap<(Nanos, u128), String>,
}

impl Store {
    fn live(&self, key: &str, now: Nanos) -> Option<Lease> {
        self.leases.get(key).copied().filter(|l| l.expires_at > now)
    }

    /// `key`'s grant record, while it lives.
    fn granted(&self, key: &str, now: Nanos) -> Option<Lease> {
        self.grants.get(key).copied().filter(|l| l.expires_at > now)
    }

    fn set_grant(&mut self, key: &str, lease: Lease) {
        if let Some(old) = self.grants.insert(key.to_owned(), lease) {
            self.grants_by_expiry.remove(&(old.expires_at, old.token));
        }
        self.grants_by_expiry
            .insert((lease.expires_at, lease.token), key.to_owned());
    }

    fn delete_grant(&mut self, key: &str) {
        if let Some(old) = self.grants.remove(key) {
            self.grants_by_expiry.remove(&(old.expires_at, old.token));
        }
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
        while let Some(entry) = self.grants_by_expiry.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            if self.grants.get(&key).is_some_and(|l| l.expires_at <= now) {
                self.grants.remove(&key);
            }
        }
    }

    /// Every lease live at `now` (by the clock that wrote it) runs again
    /// from `restart` (by the clock that now serves) for its full length:
    /// what etcd's lessor does on promotion. Leases that had ended are
    /// dropped.
    fn extend_live(&mut self, now: Nanos, restart: Nanos) {
        let again = |leases: &HashMap<String, Lease>| -> Vec<(String, Lease)> {
            leases
                .iter()
                .filter(|(_, l)| l.expires_at > now)
                .map(|(k, l)| {
                    let expires_at = restart + l.ttl_ns;
                    (k.clone(), Lease { expires_at, ..*l })
                })
                .collect()
        };
        let (live, granted) = (again(&self.leases), again(&self.grants));
        self.leases.clear();
        self.by_expiry.clear();
        self.grants.clear();
        self.grants_by_expiry.clear();
        for (key, lease) in live {
            self.set(&key, lease);
        }
        for (key, grant) in granted {
            self.set_grant(&key, grant);
        }
    }

    /// What a write to `key` is about to replace.
    fn before(&self, key: &str) -> Undo {
        Undo {
            key: key.to_owned(),
            lease: self.leases.get(key).copied(),
            grant: self.grants.get(key).copied(),
            fence: self.fences.get(key).copied(),
        }
    }

    /// Puts back what a write replaced.
    fn undo(&mut self, undo: Undo) {
        match undo.lease {
            Some(lease) => self.set(&undo.key, lease),
            None => self.delete(&undo.key),
        }
        match undo.grant {
            Some(grant) => self.set_grant(&undo.key, grant),
            None => self.delete_grant(&undo.key),
        }
        match undo.fence {
            Some(fence) => self.fences.insert(undo.key, fence),
            None => self.fences.remove(&undo.key),
        };
    }

    /// Applies `op` at `now`; the reply and, if it wrote, what it replaced.
    fn apply(&mut self, op: &LockOp, now: Now, rule: FenceRule) -> (LockReply, Option<Undo>) {
        match op {
            LockOp::Acquire { key, token, ttl_ns } => {
                // Held, or its last grant may still be believed (the key
                // lost before the grant's end): refused all the same.
                if self.live(key, now.local).is_some() || self.granted(key, now.local).is_some() {
                    return (LockReply::Busy, None);
                }
                let undo = self.before(key);
                let counter = self.fences.get(key).copied().unwrap_or(0);
                let fence = match rule {
                    // The invariant the tests hold: fences of a key only
                    // grow, across failovers and restarts, while the
                    // granting node's clock reads more than the largest
                    // fence lost.
                    FenceRule::ServerTime => (counter + 1).max(now.micros),
                    FenceRule::PlainCounter => counter + 1,
                };
                self.fences.insert(key.clone(), fence);
                let lease = Lease {
                    token: *token,
                    fence,
                    expires_at: now.local + ttl_ns,
                    ttl_ns: *ttl_ns,
                };
                self.set(key, lease);
                self.set_grant(key, lease);
                (LockReply::Granted(fence), Some(undo))
            }
            LockOp::Renew { key, token, ttl_ns } => match self.live(key, now.local) {
                Some(lease) if lease.token == *token => {
                    let undo = self.before(key);
                    let renewed = Lease {
                        expires_at: now.local + ttl_ns,
                        ttl_ns: *ttl_ns,
                        ..lease
                    };
                    self.set(key, renewed);
                    self.set_grant(key, renewed);
                    (LockReply::Done, Some(undo))
                }
                _ => (LockReply::NotHeld, None),
            },
            LockOp::Release { key, token } => {
                let undo = self.before(key);
                // The holder's record goes, whether its key is there or
                // not: it believes nothing any more.
                let forgot = self.grants.get(key).is_some_and(|g| g.token == *token);
                if forgot {
                    self.delete_grant(key);
                }
                match self.live(key, now.local) {
                    Some(lease) if lease.token == *token => {
                        self.delete(key);
                        (LockReply::Done, Some(undo))
                    }
                    _ => (LockReply::NotHeld, forgot.then_some(undo)),
                }
            }
        }
    }
}

/// The lock service: two nodes, each with its own clock. The primary
/// answers; the replica has every write the primary made more than
/// `replication_lag_ns` ago (Redis replicates asynchronously; a script's
/// effects travel together). One store holds the primary's data, and the
/// writes not yet replicated keep what they replaced, so a failover takes
/// them back and the replica's data is what remains.
///
/// A [linearizable](LockService::linearizable) service, modelled on etcd's
/// Raft, answers a write only once a quorum has it: a failover loses
/// nothing, and the new leader runs every live lease again for its full
/// length from the end of the downtime (etcd's lessor on promotion; a
/// lease outlives its holder's deadline, never the reverse). Its restarts
/// keep the data (a log on disk), with the same extension. (A PostgreSQL
/// primary with a synchronous standby loses no write either, but keeps
/// absolute expiries on the new primary's clock: not this model.)
#[derive(Debug)]
pub struct LockService {
    store: Store,
    /// Writes on their way to the replica: (replicated at, what it replaced).
    in_transit: VecDeque<(Nanos, Undo)>,
    replication_lag_ns: u64,
    /// The nodes' clocks; `primary` indexes the one serving.
    clocks: [Clock; 2],
    primary: usize,
    fence_rule: FenceRule,
    /// Writes are answered only once a quorum has them (see the type).
    linearizable: bool,
    /// Unavailable until this time (a failover or restart in progress).
    down_until: Nanos,
    ops_since_sweep: u32,
    /// Writes the failovers lost.
    pub lost_writes: u64,
}

impl LockService {
    /// A service whose replica lags by `replication_lag_ns`, whose nodes
    /// keep `clocks` and derive fences by `fence_rule`.
    pub fn new(replication_lag_ns: u64, clocks: [Clock; 2], fence_rule: FenceRule) -> Self {
        LockService {
            store: Store::default(),
            in_transit: VecDeque::new(),
            replication_lag_ns,
            clocks,
            primary: 0,
            fence_rule,
            linearizable: false,
            down_until: 0,
            ops_since_sweep: 0,
            lost_writes: 0,
        }
    }

    /// The same service, linearizable: no write is lost by a failover or
    /// a restart (see the type).
    pub fn linearizable(mut self) -> Self {
        self.linearizable = true;
        self
    }

    /// Whether the service answers at `now`.
    pub fn is_up(&self, now: Nanos) -> bool {
        now >= self.down_until
    }

    /// The serving node's clock at true time `now`.
    fn node_now(&self, now: Nanos) -> Now {
        let local = self.clocks[self.primary].local_ns(now);
        Now {
            local,
            micros: Clock::micros_of_local(local),
        }
    }

    /// Handles `op` at `now`; `None` while a failover or restart is in
    /// progress (the request is lost, the client times out).
    pub fn handle(&mut self, op: &LockOp, now: Nanos) -> Option<LockReply> {
        if !self.is_up(now) {
            return None;
        }
        self.replicate(now);
        let node = self.node_now(now);
        self.ops_since_sweep += 1;
        if self.ops_since_sweep >= 1024 {
            self.ops_since_sweep = 0;
            self.store.sweep(node.local);
        }
        let (reply, undo) = self.store.apply(op, node, self.fence_rule);
        // A linearizable service answered only once a quorum had the
        // write: nothing is left for a failover to take back.
        if let Some(undo) = undo.filter(|_| !self.linearizable) {
            self.in_transit
                .push_back((now + self.replication_lag_ns, undo));
        }
        Some(reply)
    }

    /// Forgets what the writes the replica has received by `now` replaced:
    /// a failover no longer takes them back.
    fn replicate(&mut self, now: Nanos) {
        while self.in_transit.front().is_some_and(|(at, _)| *at <= now) {
            self.in_transit.pop_front();
        }
    }

    /// The replica becomes the primary at `now`, unavailable for
    /// `downtime_ns`; writes it had not received are lost. The old primary
    /// rejoins as its replica, resynchronised.
    pub fn fail_over(&mut self, now: Nanos, downtime_ns: u64) {
        self.replicate(now);
        self.lost_writes += self.in_transit.len() as u64;
        while let Some((_, undo)) = self.in_transit.pop_back() {
            self.store.undo(undo);
        }
        let ended_on_old = self.node_now(now).local;
        self.primary = 1 - self.primary;
        self.down_until = now + downtime_ns;
        if self.linearizable {
            let back = self.node_now(self.down_until).local;
            self.store.extend_live(ended_on_old, back);
        }
    }

    /// The primary restarts at `now` without persistence: unavailable for
    /// `downtime_ns`, then empty (the replica resynchronises from it, so it
    /// is empty too). Its clock runs on. A linearizable service keeps its
    /// data and extends its live leases as on a failover.
    pub fn restart(&mut self, now: Nanos, downtime_ns: u64) {
        self.down_until = now + downtime_ns;
        if self.linearizable {
            // Its log on disk brings every write back.
            let (stopped, back) = (
                self.node_now(now).local,
                self.node_now(self.down_until).local,
            );
            self.store.extend_live(stopped, back);
            return;
        }
        self.store = Store::default();
        self.in_transit.clear();
    }

    /// The primary loses `key`'s lease alone at `now` (an operator's `DEL`,
    /// an eviction): its grant record and fence counter stay. Replicated
    /// as any write. Whether there was a lease to lose.
    pub fn lose_key(&mut self, key: &str, now: Nanos) -> bool {
        if !self.is_up(now) {
            return false;
        }
        self.replicate(now);
        let node = self.node_now(now);
        if self.store.live(key, node.local).is_none() {
            return false;
        }
        let undo = self.store.before(key);
        self.store.delete(key);
        if !self.linearizable {
            self.in_transit
                .push_back((now + self.replication_lag_ns, undo));
        }
        true
    }

    /// The live lease of `key` by the primary's view.
    pub fn holder(&self, key: &str, now: Nanos) -> Option<Lease> {
        self.store.live(key, self.node_now(now).local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn acquire(key: &str, token: u128, ttl_ns: u64) -> LockOp {
        LockOp::Acquire {
            key: key.to_owned(),
            token,
            ttl_ns,
        }
    }

    fn service(linearizable: bool) -> LockService {
        let service = LockService::new(
            10 * SECOND,
            [Clock::EXACT, Clock::EXACT],
            FenceRule::PlainCounter,
        );
        if linearizable {
            service.linearizable()
        } else {
            service
        }
    }

    #[test]
    fn a_linearizable_failover_keeps_every_write_and_runs_live_leases_again_for_their_ttl() {
        let mut s = service(true);
        assert_eq!(
            s.handle(&acquire("live", 1, 3 * SECOND), 0),
            Some(LockReply::Granted(1))
        );
        s.handle(&acquire("ended", 2, SECOND), 0);
        // At 2 s: "live" has 1 s left, "ended" is over.
        s.fail_over(2 * SECOND, SECOND / 2);
        assert_eq!(s.lost_writes, 0);
        let lease = s.holder("live", 2 * SECOND + SECOND / 2).expect("kept");
        assert_eq!(
            lease.expires_at,
            2 * SECOND + SECOND / 2 + 3 * SECOND,
            "a full TTL from the end of the downtime"
        );
        assert_eq!(s.holder("ended", 2 * SECOND + SECOND / 2), None);
        // The same with Redis's asynchronous replication: the grants the
        // replica had not received are gone.
        let mut s = service(false);
        s.handle(&acquire("live", 1, 3 * SECOND), 0);
        s.fail_over(2 * SECOND, SECOND / 2);
        assert_eq!(
            (s.lost_writes, s.holder("live", 2 * SECOND + SECOND / 2)),
            (1, None)
        );
    }
}

//! What a run simulates: replicas, clocks, network, guards and faults.

use core::time::Duration;

use guard_core::guard::ActiveConfig;
use guard_core::lock::Ttl;

use crate::clock::{Clock, ClockSync};

/// Who a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// This replica.
    Replica(usize),
    /// Whichever replica leads when the fault starts (none: no effect).
    Leader,
}

/// A fault injected at a point of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The replica crashes (loses all state) and restarts after `down_for`.
    Crash {
        /// Who.
        target: Target,
        /// When, from the start of the run.
        at: Duration,
        /// How long it stays down.
        down_for: Duration,
    },
    /// A stop-the-world pause: the replica runs nothing for `length`. A
    /// leader pauses just after deciding a side effect, which it sends
    /// when it resumes (the GC-pause case).
    Pause {
        /// Who.
        target: Target,
        /// When.
        at: Duration,
        /// How long.
        length: Duration,
    },
    /// The replica cannot reach the lock service for `length` (the
    /// protected resource stays reachable).
    Partition {
        /// Who.
        target: Target,
        /// When.
        at: Duration,
        /// How long.
        length: Duration,
    },
    /// The lock service's replica takes over, without the writes it had
    /// not yet received; the service answers nothing for `downtime`.
    Failover {
        /// When.
        at: Duration,
        /// How long the service is unavailable.
        downtime: Duration,
    },
    /// The lock service restarts without persistence: it answers nothing
    /// for `downtime`, then comes back empty (no lease, no fence counter;
    /// its replica resynchronises from it and is empty too).
    Restart {
        /// When.
        at: Duration,
        /// How long the service is unavailable.
        downtime: Duration,
    },
    /// The lock service loses the leader's lease key alone (an operator's
    /// `DEL`, an eviction): its grant record and fence counter stay.
    LoseKey {
        /// When.
        at: Duration,
    },
}

impl Fault {
    /// When the fault starts.
    pub const fn at(&self) -> Duration {
        match self {
            Fault::Crash { at, .. }
            | Fault::Pause { at, .. }
            | Fault::Partition { at, .. }
            | Fault::Failover { at, .. }
            | Fault::Restart { at, .. }
            | Fault::LoseKey { at } => *at,
        }
    }
}

/// How the lock service derives a grant's fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceRule {
    /// `max(counter + 1, server time in µs)`, stored as the counter: a
    /// service that lost the counter (a promoted replica, a restart without
    /// persistence) still hands out larger fences, unless the granting
    /// node's clock reads no more than the largest fence lost.
    ServerTime,
    /// `counter + 1`: a lost counter hands out fences again.
    PlainCounter,
}

/// Scheduled work deduplicated by slot (a OnceGuard per slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotConfig {
    /// The schedule's period (epoch-aligned).
    pub period: Duration,
    /// How long a claimed slot key is kept by the lock service.
    pub key_ttl: Ttl,
}

/// A sliding-window limiter on each replica, fed random requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimiterConfig {
    /// The window.
    pub window: Duration,
    /// Admissions allowed per window (at most 64).
    pub limit: u32,
    /// The longest gap between two requests (uniform from zero).
    pub max_gap: Duration,
}

/// Everything a run needs; scenarios build one.
#[derive(Clone, Debug)]
pub struct WorldConfig {
    /// The seed of every random choice.
    pub seed: u64,
    /// Number of replicas.
    pub replicas: usize,
    /// Simulated time.
    pub duration: Duration,
    /// Each replica's clock is steered to an offset uniform in
    /// `-max_offset..=max_offset` (a free clock starts there).
    pub max_offset: Duration,
    /// Each clock's oscillator rate error is uniform in `-max..=max` ppm.
    pub max_drift_ppm: i64,
    /// How every clock (replicas' and lock-service nodes') is disciplined;
    /// `None`: they drift freely, without bound (a fault).
    pub clock_sync: Option<ClockSync>,
    /// Each lock-service node's clock is steered to an offset uniform in
    /// `-service_max_offset..=service_max_offset`.
    pub service_max_offset: Duration,
    /// How the lock service derives fences.
    pub fence_rule: FenceRule,
    /// One-way latency bounds of every link.
    pub latency: (Duration, Duration),
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice.
    pub duplication: f64,
    /// How long a client waits for a lock-service reply.
    pub request_timeout: Duration,
    /// How far the lock service's replica lags its primary.
    pub replication_lag: Duration,
    /// Whether the lock service is linearizable, modelled on etcd: no
    /// failover or restart loses a write it answered, and live leases run
    /// again for their full length after one. `replication_lag` then
    /// plays no part.
    pub linearizable: bool,
    /// The leader lease (none: no ActiveGuard).
    pub active: Option<ActiveConfig>,
    /// How often a leader writes to the protected resource.
    pub work_period: Duration,
    /// Whether the resource rejects stale fences.
    pub fencing: bool,
    /// Slot-deduplicated scheduled work (none: no OnceGuard).
    pub slots: Option<SlotConfig>,
    /// Rate limiters (none: no limiter).
    pub limiter: Option<LimiterConfig>,
    /// The faults, in any order.
    pub faults: Vec<Fault>,
}

impl WorldConfig {
    /// Three replicas on a quiet network with a 3 s lease, fencing on and
    /// no fault: the base every scenario changes.
    pub fn base(seed: u64) -> Self {
        let ttl = Ttl::from_secs(3).unwrap_or(Ttl::MIN);
        WorldConfig {
            seed,
            replicas: 3,
            duration: Duration::from_secs(60),
            max_offset: Duration::from_millis(50),
            max_drift_ppm: 100,
            clock_sync: Some(ClockSync::NTP),
            service_max_offset: Duration::from_millis(5),
            fence_rule: FenceRule::ServerTime,
            latency: (Duration::from_micros(200), Duration::from_millis(5)),
            loss: 0.0,
            duplication: 0.0,
            request_timeout: Duration::from_millis(300),
            replication_lag: Duration::from_millis(5),
            linearizable: false,
            active: Some(
                ActiveConfig::new()
                    .with_ttl(ttl)
                    .with_interval(Duration::from_secs(1))
                    .with_drift(Duration::from_millis(300)),
            ),
            work_period: Duration::from_millis(100),
            fencing: true,
            slots: Some(SlotConfig {
                period: Duration::from_secs(1),
                key_ttl: Ttl::from_secs(10).unwrap_or(Ttl::MIN),
            }),
            limiter: Some(LimiterConfig {
                window: Duration::from_secs(1),
                limit: 20,
                max_gap: Duration::from_millis(80),
            }),
            faults: Vec::new(),
        }
    }

    /// The largest offset of a replica's wall clock from true time over
    /// the run.
    pub fn clock_bound(&self) -> Duration {
        Clock::bound(
            self.max_offset,
            self.max_drift_ppm,
            self.clock_sync,
            self.duration,
        )
    }

    /// The most two lock-service nodes' wall clocks disagree by, and the
    /// most one node's wall clock can step back by, over the run: twice a
    /// node's bound. A fence derived from server time cannot repeat or go
    /// backwards when every failover's and restart's downtime exceeds it
    /// (the lost grant came before the fault, the next one after it).
    pub fn service_clock_disagreement(&self) -> Duration {
        2 * Clock::bound(
            self.service_max_offset,
            self.max_drift_ppm,
            self.clock_sync,
            self.duration,
        )
    }
}

//! What a run measured, and the timeline it draws.

use std::fmt::{self, Write as _};

use crate::clock::{Clock, Nanos};
use crate::resource::Effect;

/// Counts and checks of one run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The seed (printed first: it replays the run).
    pub seed: u64,
    /// Replicas simulated.
    pub replicas: usize,
    /// Events processed.
    pub events: u64,
    /// FNV-1a hash of the event log: equal for equal seeds.
    pub log_hash: u64,
    /// Invariant violations, each described.
    pub violations: Vec<String>,

    /// Slot timers fired (all replicas).
    pub slot_fires: u64,
    /// Slot claims that got an answer or a time-out.
    pub claims: u64,
    /// Slots planned inside the run.
    pub slots_planned: u64,
    /// Slot runs in total.
    pub slot_runs: u64,
    /// Runs beyond the first of a slot.
    pub duplicate_runs: u64,
    /// Planned slots nobody ran.
    pub slots_missed: u64,

    /// Promotions to leader.
    pub promotions: u64,
    /// Crash-to-new-leader delays, in nanoseconds.
    pub takeovers: Vec<u64>,
    /// The takeover promise in nanoseconds.
    pub takeover_bound_ns: u64,
    /// Most replicas acting as leader at once (paused ones excluded).
    pub max_leaders: usize,
    /// Time during which two or more replicas acted as leader.
    pub dual_leader_ns: u64,
    /// Side effects the resource applied with the newest fence.
    pub accepted: u64,
    /// Stale side effects applied (fencing off).
    pub accepted_stale: u64,
    /// Stale side effects refused (fencing on).
    pub rejected_stale: u64,
    /// Whether the resource rejected stale fences (the scenario promises
    /// fencing).
    pub fencing: bool,
    /// Side effects by a second lease grant under a fence already used:
    /// the lock service handed one fence out twice.
    pub fence_reused: u64,
    /// Side effects whose fence was out of grant order against the newest
    /// accepted one (a newer lease's fence below an older one's).
    pub fence_out_of_order: u64,
    /// Grants of the leader key whose fence was not above every earlier
    /// grant's: the fences went backwards or repeated.
    pub fence_regressions: u64,
    /// Lock-service writes lost by failovers.
    pub lost_writes: u64,

    /// A user handler's side effects applied (see [`crate::handler`]).
    pub user_effects: u64,
    /// Of those, effects whose identity had been applied before.
    pub user_duplicates: u64,
    /// The first identities applied twice.
    pub user_duplicate_ids: Vec<u64>,
    /// A user handler's leader effects refused for a stale fence.
    pub user_rejected_stale: u64,
    /// A user handler's stale leader effects applied (fencing off).
    pub user_accepted_stale: u64,

    /// Limiter admissions.
    pub limiter_admitted: u64,
    /// Limiter denials.
    pub limiter_denied: u64,

    /// Faults injected.
    pub crashes: u64,
    /// Pauses injected.
    pub pauses: u64,
    /// Partitions injected.
    pub partitions: u64,
    /// Lock-service failovers.
    pub failovers: u64,
    /// Lock-service restarts without persistence.
    pub restarts: u64,
    /// Leases the lock service lost alone, their grant records kept.
    pub keys_lost: u64,

    /// The largest offset of a replica's wall clock from true time seen at
    /// a slot timer, in nanoseconds.
    pub largest_clock_offset_ns: u64,
    /// The bound the clocks promise for it.
    pub clock_bound_ns: u64,
}

impl Report {
    /// An empty report of a run of `seed`.
    pub fn new(seed: u64, replicas: usize) -> Self {
        Report {
            seed,
            replicas,
            ..Report::default()
        }
    }

    /// The longest takeover, in milliseconds.
    pub fn max_takeover_ms(&self) -> Option<u64> {
        self.takeovers.iter().max().map(|n| n / 1_000_000)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |n: u64| format!("{:.1} ms", n as f64 / 1e6);
        let rows: Vec<(&str, String)> = vec![
            ("seed", self.seed.to_string()),
            ("replicas", self.replicas.to_string()),
            ("events", self.events.to_string()),
            ("event-log hash", format!("{:016x}", self.log_hash)),
            ("slots planned", self.slots_planned.to_string()),
            ("slot runs", self.slot_runs.to_string()),
            ("duplicate slot runs", self.duplicate_runs.to_string()),
            ("missed slots", self.slots_missed.to_string()),
            ("promotions", self.promotions.to_string()),
            (
                "longest takeover",
                self.takeovers.iter().max().map_or("-".into(), |&n| {
                    format!("{} (bound {})", ms(n), ms(self.takeover_bound_ns))
                }),
            ),
            ("most leaders at once", self.max_leaders.to_string()),
            ("time with two leaders", ms(self.dual_leader_ns)),
            ("side effects accepted", self.accepted.to_string()),
            ("stale effects accepted", self.accepted_stale.to_string()),
            ("stale effects rejected", self.rejected_stale.to_string()),
            ("fence handed out twice", self.fence_reused.to_string()),
            (
                "fence out of grant order",
                self.fence_out_of_order.to_string(),
            ),
            (
                "grants not above earlier fences",
                self.fence_regressions.to_string(),
            ),
            ("lock writes lost", self.lost_writes.to_string()),
            (
                "handler effects / duplicates / stale refused",
                format!(
                    "{} / {} / {}",
                    self.user_effects, self.user_duplicates, self.user_rejected_stale
                ),
            ),
            (
                "limiter admitted / denied",
                format!("{} / {}", self.limiter_admitted, self.limiter_denied),
            ),
            (
                "faults",
                format!(
                    "{} crashes, {} pauses, {} partitions, {} failovers, {} restarts, {} keys lost",
                    self.crashes,
                    self.pauses,
                    self.partitions,
                    self.failovers,
                    self.restarts,
                    self.keys_lost
                ),
            ),
            (
                "largest clock offset",
                format!(
                    "{} (bound {})",
                    ms(self.largest_clock_offset_ns),
                    ms(self.clock_bound_ns)
                ),
            ),
            ("violations", self.violations.len().to_string()),
        ];
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (k, v) in rows {
            writeln!(f, "{k:<width$}  {v}")?;
        }
        for v in &self.violations {
            writeln!(f, "  violation: {v}")?;
        }
        Ok(())
    }
}

/// A replica's term as leader.
#[derive(Clone, Copy, Debug)]
pub struct Term {
    /// Who led.
    pub replica: usize,
    /// From (true time).
    pub from: Nanos,
    /// To.
    pub to: Nanos,
    /// Its fence.
    pub fence: u64,
}

/// A lease granted by the lock service.
#[derive(Clone, Copy, Debug)]
pub struct Grant {
    /// Granted at.
    pub from: Nanos,
    /// Would expire at, unless renewed.
    pub to: Nanos,
    /// Its fence.
    pub fence: u64,
    /// To whom.
    pub replica: usize,
}

/// A fault on the timeline.
#[derive(Clone, Debug)]
pub struct FaultSpan {
    /// Who (`usize::MAX`: the lock service).
    pub replica: usize,
    /// "crash", "pause", "partition", "failover" or "restart".
    pub kind: &'static str,
    /// From.
    pub from: Nanos,
    /// To.
    pub to: Nanos,
}

/// Who led when, the leases, the side effects and the faults of a run.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// Replicas.
    pub replicas: usize,
    /// Their clocks.
    pub clocks: Vec<Clock>,
    /// Terms as leader.
    pub terms: Vec<Term>,
    /// Lease grants of the leader key.
    pub grants: Vec<Grant>,
    /// Side effects (the first 20,000).
    pub effects: Vec<Effect>,
    /// Faults.
    pub faults: Vec<FaultSpan>,
    /// The end of the run.
    pub end: Nanos,
}

/// The most terms and grants kept for drawing.
const KEPT: usize = 20_000;

impl Timeline {
    /// An empty timeline of `replicas`.
    pub fn new(replicas: usize, clocks: Vec<Clock>) -> Self {
        Timeline {
            replicas,
            clocks,
            ..Timeline::default()
        }
    }

    /// A lease was granted.
    pub fn lease(&mut self, from: Nanos, to: Nanos, fence: u64, replica: usize) {
        if self.grants.len() < KEPT {
            self.grants.push(Grant {
                from,
                to,
                fence,
                replica,
            });
        }
    }

    /// A replica led from `from` to `to`.
    pub fn led(&mut self, replica: usize, from: Nanos, to: Nanos, fence: u64) {
        if self.terms.len() < KEPT {
            self.terms.push(Term {
                replica,
                from,
                to,
                fence,
            });
        }
    }

    /// A fault hit `replica` from `from` to `to`.
    pub fn fault(&mut self, replica: usize, kind: &'static str, from: Nanos, to: Nanos) {
        self.faults.push(FaultSpan {
            replica,
            kind,
            from,
            to,
        });
    }

    /// The lock service failed over.
    pub fn failover(&mut self, at: Nanos) {
        self.fault(usize::MAX, "failover", at, at);
    }
}

/// Writes `text` escaped for XML into `out`.
pub(crate) fn xml_escape(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            c => {
                let _ = out.write_char(c);
            }
        }
    }
}

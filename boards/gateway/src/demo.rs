//! Replicas in one process, to see at-most-once execution at work.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use guard_core::guard::ActiveConfig;
use guard_core::lock::{Scope, Ttl};
use guard_core::slot::Every;
use guard_smol::{ActiveRunner, RunHandle, Scheduler, control};
use guard_std::{GuardConfig, LocalLocker, SharedLocker};

/// What to run.
#[derive(Clone, Debug)]
pub struct DemoOptions {
    /// Replicas (at least 2 for a takeover).
    pub replicas: usize,
    /// How long the demo runs; the leader is stopped half-way.
    pub duration: Duration,
    /// The lease of the leader-only consumer.
    pub lease: Ttl,
    /// Its renew and poll interval.
    pub interval: Duration,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            replicas: 3,
            duration: Duration::from_secs(10),
            lease: Ttl::from_secs(2).unwrap_or(Ttl::MIN),
            interval: Duration::from_millis(200),
        }
    }
}

/// A progress snapshot, a few times a second.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Time since the start.
    pub elapsed: Duration,
    /// Slots run so far.
    pub slots: usize,
    /// The current leader.
    pub leader: Option<usize>,
}

/// The outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoReport {
    /// Replicas run.
    pub replicas: usize,
    /// Distinct slots executed.
    pub slots: usize,
    /// Slot executions per replica.
    pub executions: Vec<usize>,
    /// Broadcast messages each replica consumed while leading.
    pub consumed: Vec<u64>,
    /// Slots executed more than once (must be 0).
    pub duplicates: usize,
    /// Slots between the first and the last that nobody executed.
    pub missed: u64,
    /// Promotions after the first.
    pub leader_changes: usize,
    /// The replica stopped half-way, if a leader was.
    pub stopped_leader: Option<usize>,
    /// From stopping the leader to another replica's promotion.
    pub takeover: Option<Duration>,
}

impl DemoReport {
    /// Whether the run kept the guard's promises: slots ran, none twice,
    /// none missed. The demo exits with status 1 otherwise.
    pub fn kept_promises(&self) -> bool {
        self.slots > 0 && self.duplicates == 0 && self.missed == 0
    }
}

impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "replicas          {}", self.replicas)?;
        writeln!(f, "slots             {}", self.slots)?;
        for (id, (runs, consumed)) in self.executions.iter().zip(&self.consumed).enumerate() {
            writeln!(
                f,
                "replica {id:<9} {runs} slot runs, {consumed} broadcast messages consumed"
            )?;
        }
        writeln!(f, "duplicates        {}", self.duplicates)?;
        writeln!(f, "missed slots      {}", self.missed)?;
        writeln!(f, "leader changes    {}", self.leader_changes)?;
        match (self.stopped_leader, self.takeover) {
            (Some(old), Some(t)) => {
                writeln!(f, "takeover          {t:.0?} after stopping replica {old}")
            }
            (Some(old), None) => writeln!(f, "takeover          none after stopping replica {old}"),
            (None, _) => writeln!(f, "takeover          no leader was stopped"),
        }
    }
}

struct Replica {
    handle: RunHandle,
    thread: thread::JoinHandle<()>,
}

/// Runs the demo; `progress` is called about four times a second.
pub fn run(
    options: &DemoOptions,
    mut progress: impl FnMut(Progress),
) -> Result<DemoReport, Box<dyn std::error::Error>> {
    let config = GuardConfig::new()
        .with_locker(SharedLocker::new(LocalLocker::new()))
        .with_owner("gateway-demo");
    let timing = ActiveConfig::new()
        .with_ttl(options.lease)
        .with_interval(options.interval);
    let runs: Arc<Mutex<BTreeMap<u64, Vec<usize>>>> = Arc::default();
    let leader = Arc::new(AtomicUsize::new(usize::MAX));
    let consumed: Arc<Vec<AtomicU64>> =
        Arc::new((0..options.replicas).map(|_| AtomicU64::new(0)).collect());
    let promotions: Arc<Mutex<Vec<(Instant, usize)>>> = Arc::default();
    let start = Instant::now();

    let mut replicas: Vec<Option<Replica>> = Vec::new();
    for id in 0..options.replicas {
        let mut scheduler = Scheduler::new(config.clone());
        let job_runs = runs.clone();
        scheduler.add_job(
            "heartbeat",
            "gateway",
            Every::new(Duration::from_secs(1))?,
            move |run| {
                let runs = job_runs.clone();
                async move {
                    runs.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(run.slot.as_millis())
                        .or_default()
                        .push(id)
                }
            },
        )?;
        let runner = ActiveRunner::new(
            &config,
            &Scope::new("broadcast")?.segment("source", "sensors")?,
        )?
        .with_settings(timing)?;
        let (handle, ctl) = control();
        let (leader, consumed, promotions) = (leader.clone(), consumed.clone(), promotions.clone());
        let thread = thread::spawn(move || {
            let active = Arc::new(AtomicBool::new(false));
            let (on, off) = (active.clone(), active.clone());
            let consume = async {
                // A broadcast source: a message every 50 ms that only the
                // active replica processes.
                loop {
                    async_io::Timer::after(Duration::from_millis(50)).await;
                    if active.load(Ordering::SeqCst)
                        && let Some(count) = consumed.get(id)
                    {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            };
            let lead = runner.run(
                ctl.clone(),
                move |_fence| {
                    on.store(true, Ordering::SeqCst);
                    leader.store(id, Ordering::SeqCst);
                    promotions
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((Instant::now(), id));
                    async { Ok::<(), String>(()) }
                },
                move |_reason| {
                    off.store(false, Ordering::SeqCst);
                    async {}
                },
            );
            smol::block_on(futures_lite::future::zip(
                scheduler.run(ctl),
                futures_lite::future::or(lead, consume),
            ));
        });
        replicas.push(Some(Replica { handle, thread }));
    }

    let mut stopped: Option<(Instant, usize)> = None;
    while start.elapsed() < options.duration {
        thread::sleep(Duration::from_millis(250));
        if stopped.is_none() && start.elapsed() >= options.duration / 2 {
            let current = leader.load(Ordering::SeqCst);
            if let Some(replica) = replicas.get_mut(current).and_then(Option::take) {
                stopped = Some((Instant::now(), current));
                replica.handle.stop();
                let _ = replica.thread.join();
            }
        }
        let current = leader.load(Ordering::SeqCst);
        progress(Progress {
            elapsed: start.elapsed(),
            slots: runs.lock().unwrap_or_else(|e| e.into_inner()).len(),
            leader: (current != usize::MAX).then_some(current),
        });
    }
    for replica in replicas.into_iter().flatten() {
        replica.handle.stop();
        let _ = replica.thread.join();
    }

    let runs = runs.lock().unwrap_or_else(|e| e.into_inner());
    let promotions = promotions.lock().unwrap_or_else(|e| e.into_inner());
    let missed = match (runs.keys().next(), runs.keys().last()) {
        (Some(first), Some(last)) => ((last - first) / 1000 + 1).saturating_sub(runs.len() as u64),
        _ => 0,
    };
    let takeover = stopped.and_then(|(at, old)| {
        promotions
            .iter()
            .find(|(t, id)| *t > at && *id != old)
            .map(|(t, _)| t.duration_since(at))
    });
    Ok(DemoReport {
        replicas: options.replicas,
        slots: runs.len(),
        executions: (0..options.replicas)
            .map(|id| runs.values().filter(|r| r.contains(&id)).count())
            .collect(),
        consumed: consumed.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        duplicates: runs.values().filter(|r| r.len() > 1).count(),
        missed,
        leader_changes: promotions.len().saturating_sub(1),
        stopped_leader: stopped.map(|(_, id)| id),
        takeover,
    })
}

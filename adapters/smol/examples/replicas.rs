//! Three gateway replicas in one process, sharing an in-process locker:
//! an every-second scheduled job runs once per slot across them, and one
//! leader at a time consumes a broadcast source. Half-way through, the
//! leader is stopped and a standby takes over.
//!
//! Run: `cargo run --release -p guard-smol --example replicas [seconds]`
//! Exits with status 1 if any slot ran twice.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use guard_core::guard::ActiveConfig;
use guard_core::lock::{Scope, Ttl};
use guard_core::slot::Every;
use guard_smol::{ActiveRunner, Scheduler, control};
use guard_std::{GuardConfig, LocalLocker, SharedLocker};

const REPLICAS: usize = 3;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(8);
    let config = GuardConfig::new()
        .with_locker(SharedLocker::new(LocalLocker::new()))
        .with_owner("gateway-demo");
    let timing = ActiveConfig::new()
        .with_ttl(Ttl::from_secs(2)?)
        .with_interval(Duration::from_millis(200));
    let runs: Arc<Mutex<BTreeMap<u64, Vec<usize>>>> = Arc::default();
    let leader = Arc::new(AtomicUsize::new(usize::MAX));
    let consumed: Arc<[AtomicU64; REPLICAS]> = Arc::new(Default::default());
    let start = Instant::now();
    let leader_changes: Arc<Mutex<Vec<(Duration, usize)>>> = Arc::default();

    let mut handles = Vec::new();
    for id in 0..REPLICAS {
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
                        .unwrap()
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
        let (leader, consumed, changes) =
            (leader.clone(), consumed.clone(), leader_changes.clone());
        let thread = thread::spawn(move || {
            smol::block_on(futures_lite::future::zip(
                scheduler.run(ctl.clone()),
                async {
                    let active = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let (on, off) = (active.clone(), active.clone());
                    let consume = async {
                        // The broadcast source: a message every 50 ms that only
                        // the active replica processes.
                        loop {
                            async_io::Timer::after(Duration::from_millis(50)).await;
                            if active.load(Ordering::SeqCst) {
                                consumed[id].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    };
                    let run = runner.run(
                        ctl,
                        move |_fence| {
                            on.store(true, Ordering::SeqCst);
                            leader.store(id, Ordering::SeqCst);
                            changes.lock().unwrap().push((start.elapsed(), id));
                            async { Ok::<(), String>(()) }
                        },
                        move |_reason| {
                            off.store(false, Ordering::SeqCst);
                            async {}
                        },
                    );
                    futures_lite::future::or(run, consume).await
                },
            ))
        });
        handles.push(Some((handle, thread)));
    }

    let total = Duration::from_secs(seconds);
    let mut stopped = None;
    while start.elapsed() < total {
        thread::sleep(Duration::from_millis(250));
        if stopped.is_none() && start.elapsed() >= total / 2 {
            let current = leader.load(Ordering::SeqCst);
            if let Some((handle, thread)) = handles.get_mut(current).and_then(Option::take) {
                stopped = Some((start.elapsed(), current));
                handle.stop();
                thread.join().expect("replica thread");
            }
        }
        let slots = runs.lock().unwrap().len();
        eprint!(
            "\r{:>4.1}s  slots run: {slots:<3} leader: replica {}   ",
            start.elapsed().as_secs_f32(),
            leader.load(Ordering::SeqCst)
        );
    }
    eprintln!();
    for (handle, thread) in handles.into_iter().flatten() {
        handle.stop();
        thread.join().expect("replica thread");
    }

    let runs = runs.lock().unwrap();
    let duplicates = runs.values().filter(|r| r.len() > 1).count();
    let (first, last) = (
        runs.keys().next().copied().unwrap_or(0),
        runs.keys().last().copied().unwrap_or(0),
    );
    let missed = if runs.is_empty() {
        0
    } else {
        (last - first) / 1000 + 1 - runs.len() as u64
    };
    let changes = leader_changes.lock().unwrap();
    let takeover = stopped.and_then(|(at, old)| {
        changes
            .iter()
            .find(|(t, id)| *t > at && *id != old)
            .map(|(t, _)| t.saturating_sub(at))
    });
    println!("replicas          {REPLICAS}");
    println!("slots             {}", runs.len());
    for id in 0..REPLICAS {
        let executed = runs.values().filter(|r| r.contains(&id)).count();
        println!(
            "replica {id}         {executed} slot runs, {} broadcast messages consumed",
            consumed[id].load(Ordering::Relaxed)
        );
    }
    println!("duplicates        {duplicates}");
    println!("missed slots      {missed}");
    println!("leader changes    {}", changes.len().saturating_sub(1));
    match (stopped, takeover) {
        (Some((_, old)), Some(t)) => {
            println!("takeover          {t:?} after stopping replica {old}")
        }
        (Some((_, old)), None) => println!("takeover          none after stopping replica {old}"),
        _ => println!("takeover          leader not stopped"),
    }
    if duplicates > 0 {
        std::process::exit(1);
    }
    Ok(())
}

//! The embassy runners on the host (embassy-time's std driver) over
//! guard-std's in-process locker: single leader and takeover, the renew
//! deadline while a renewal hangs, and slots run once across devices.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use embassy_sync::signal::Signal;
use guard_core::guard::{ActiveConfig, DemoteReason, OnceGuard};
use guard_core::lock::{LeaseRenewer, Locker, Renewal, Scope, Token, Ttl, UnlockError};
use guard_core::slot::{Every, UnixMillis};
use guard_embassy::{ActiveControl, ActiveRunner, run_slots};
use guard_std::LocalLocker;

type Control = ActiveControl<CriticalSectionRawMutex>;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Promoted(usize, u64),
    Demoted(usize, DemoteReason),
}

fn settings() -> ActiveConfig {
    ActiveConfig::new()
        .with_ttl(Ttl::from_millis(300).unwrap())
        .with_interval(Duration::from_millis(100))
}

/// Runs `runner` for device `id` on its own thread.
fn device<L: LeaseRenewer + Send + Sync + 'static>(
    id: usize,
    locker: Arc<L>,
    control: &'static Control,
    seen: &Arc<Mutex<Vec<Seen>>>,
) -> thread::JoinHandle<()> {
    let seen = seen.clone();
    thread::spawn(move || {
        let runner = ActiveRunner::new("guard:active:consumer:sensors", settings()).unwrap();
        let (up, down) = (seen.clone(), seen);
        futures_lite::future::block_on(runner.run(
            &*locker,
            control,
            move |fence| {
                up.lock().unwrap().push(Seen::Promoted(id, fence));
                async { Ok::<(), ()>(()) }
            },
            move |reason| {
                down.lock().unwrap().push(Seen::Demoted(id, reason));
                async {}
            },
        ))
    })
}

fn leak() -> &'static Control {
    Box::leak(Box::new(Control::new()))
}

#[test]
fn one_device_leads_and_a_standby_takes_over_when_it_stops() {
    let locker = Arc::new(LocalLocker::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let controls = [leak(), leak()];
    let first = device(0, locker.clone(), controls[0], &seen);
    thread::sleep(Duration::from_millis(100));
    let second = device(1, locker, controls[1], &seen);
    thread::sleep(Duration::from_millis(600));
    assert_eq!(*seen.lock().unwrap(), vec![Seen::Promoted(0, 1)]);

    controls[0].stop();
    first.join().unwrap();
    thread::sleep(Duration::from_millis(300));
    controls[1].stop();
    second.join().unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            Seen::Promoted(0, 1),
            Seen::Demoted(0, DemoteReason::Stopping),
            Seen::Promoted(1, 2),
            Seen::Demoted(1, DemoteReason::Stopping),
        ]
    );
}

/// Grants locks, but its renewals never answer.
struct RenewHangs(LocalLocker);

impl Locker for RenewHangs {
    type Error = std::convert::Infallible;

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, Self::Error> {
        self.0.try_lock(key, ttl).await
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<Self::Error>> {
        self.0.unlock(key, token).await
    }
}

impl LeaseRenewer for RenewHangs {
    async fn renew(&self, _: &str, _: &Token, _: Ttl) -> Result<Renewal, Self::Error> {
        core::future::pending().await
    }
}

#[test]
fn a_hung_renewal_demotes_by_the_renew_deadline() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let control = leak();
    let started = std::time::Instant::now();
    let runner = device(0, Arc::new(RenewHangs(LocalLocker::new())), control, &seen);
    let demoted = guard_testkit::wait_until("demotion", Duration::from_secs(2), || {
        seen.lock().unwrap().len() == 2
    });
    let elapsed = started.elapsed();
    control.stop();
    runner.join().unwrap();
    assert!(demoted.is_ok(), "{:?}", seen.lock().unwrap());
    assert_eq!(
        seen.lock().unwrap()[1],
        Seen::Demoted(0, DemoteReason::RenewDeadline)
    );
    // The renew deadline is ttl - drift = 270 ms after the grant.
    assert!(
        elapsed < Duration::from_millis(300),
        "demoted after {elapsed:?}"
    );
}

fn wall() -> UnixMillis {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    UnixMillis::from_millis(u64::try_from(ms).unwrap())
}

#[test]
fn three_devices_run_each_slot_once() {
    let locker = Arc::new(LocalLocker::new());
    let runs: Arc<Mutex<BTreeMap<u64, Vec<usize>>>> = Arc::default();
    let stops: Vec<&'static Signal<CriticalSectionRawMutex, ()>> = (0..3)
        .map(|_| &*Box::leak(Box::new(Signal::new())))
        .collect();
    let threads: Vec<_> = (0..3)
        .map(|id| {
            let (locker, runs, stop) = (locker.clone(), runs.clone(), stops[id]);
            thread::spawn(move || {
                let scope = Scope::new("schedule")
                    .and_then(|s| s.segment("router", "tick"))
                    .unwrap();
                let guard = OnceGuard::new(Some(&*locker), scope);
                let every = Every::new(Duration::from_millis(200)).unwrap();
                futures_lite::future::block_on(run_slots(&guard, every, wall, stop, |run| {
                    runs.lock()
                        .unwrap()
                        .entry(run.slot.as_millis())
                        .or_default()
                        .push(id);
                    async {}
                }))
                .unwrap()
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(1_500));
    stops.iter().for_each(|s| s.signal(()));
    let ran: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let runs = runs.lock().unwrap();
    assert!(runs.len() >= 6, "{runs:?}");
    assert!(
        runs.values().all(|r| r.len() == 1),
        "a slot ran twice: {runs:?}"
    );
    assert_eq!(ran, runs.len() as u64);
    let (first, last) = (*runs.keys().next().unwrap(), *runs.keys().last().unwrap());
    assert_eq!(
        runs.len() as u64,
        (last - first) / 200 + 1,
        "a slot was missed: {runs:?}"
    );
}

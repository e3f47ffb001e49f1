//! A queued sink holding its sender back on a full queue: each append is
//! made only while the lease the message was read under is valid, and the
//! waits for room are not retries.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use guard_core::retry::{RetryPolicy, WithoutRandom};
use guard_endpoints::sink::queued::{QueuedSink, WhenFull};
use guard_endpoints::sink::{LeaseGate, Outgoing, SinkError, deliver};
use guard_std::disk_queue::{DiskQueue, QueueSettings, SyncPolicy};

struct Lease(AtomicBool);

impl LeaseGate for Lease {
    fn fence(&self) -> u64 {
        7
    }
    fn is_valid(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

fn full_queue(dir: &std::path::Path) -> QueuedSink {
    let settings = QueueSettings::new(4096, SyncPolicy::Every(Duration::from_millis(50)))
        .unwrap()
        .with_segment_bytes(512)
        .unwrap();
    let (queue, _) = DiskQueue::open(dir, settings).unwrap();
    // Filled to the last few bytes: no message fits.
    while queue.append(&[0u8; 1]).is_ok() {}
    QueuedSink::new("uplink", queue, WhenFull::Wait(Duration::from_millis(10)))
}

fn message() -> Outgoing<'static> {
    Outgoing {
        id: "orders:1-0",
        origin: "orders",
        fence: Some(7),
        payload: b"held back",
    }
}

/// Delivers `message()` through `sink`, full, under `lease`; 100 ms in,
/// `meanwhile` runs, then the queue is emptied (room again).
fn delivered_once_room_comes(
    sink: &QueuedSink,
    lease: Option<&Lease>,
    meanwhile: impl FnOnce(),
) -> guard_endpoints::sink::Delivery {
    smol::block_on(futures_lite::future::zip(
        deliver(
            sink,
            &message(),
            &RetryPolicy::no_retry(),
            &mut WithoutRandom,
            lease.map(|l| l as &dyn LeaseGate),
        ),
        async {
            async_io::Timer::after(Duration::from_millis(100)).await;
            meanwhile();
            while sink.queue().peek().unwrap().is_some() {
                sink.queue().advance().unwrap();
            }
        },
    ))
    .0
}

#[test]
fn a_lease_that_ends_while_the_sender_is_held_back_queues_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sink = full_queue(dir.path());
    let appended = sink.queue().stats().appended;
    let lease = Lease(AtomicBool::new(true));
    // The lease ends, then room comes.
    let delivery = delivered_once_room_comes(&sink, Some(&lease), || {
        lease.0.store(false, Ordering::SeqCst)
    });
    assert_eq!(delivery.outcome, Err(SinkError::LeaseEnded { fence: 7 }));
    assert_eq!(sink.queue().stats().appended, appended, "nothing queued");
}

#[test]
fn waiting_for_room_spends_no_retry() {
    let dir = tempfile::tempdir().unwrap();
    let sink = full_queue(dir.path());
    let delivery = delivered_once_room_comes(&sink, None, || {});
    assert_eq!(delivery.outcome, Ok(()));
    assert_eq!(delivery.attempts, 1, "the waits for room are not attempts");
    let queued = guard_endpoints::sink::queued::decode(&sink.queue().peek().unwrap().unwrap());
    assert_eq!(
        queued.unwrap().outgoing(),
        message(),
        "queued once room came"
    );
}

//! A queued sink holding its sender back on a full queue: each append is
//! made only while the lease the message was read under is valid, and the
//! waits for room are not retries. Its forwarding with a window in
//! flight: the queue moves in order, never past a message not taken.

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use guard_core::retry::{RetryPolicy, WithoutRandom};
use guard_endpoints::sink::queued::{QueuedSink, WhenFull, forward};
use guard_endpoints::sink::{LeaseGate, MessageSink, Outgoing, SinkError, deliver};
use guard_std::BoxFuture;
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

/// A sink that records, for every send, the message's number and how
/// many messages the queue had moved past then; it answers after a
/// delay that shrinks with the number (later messages overtake earlier
/// ones) and refuses message `failing`, slowest of all, transiently
/// while `down` holds.
struct Recording {
    queue: DiskQueue,
    sends: Mutex<Vec<(u64, u64)>>,
    out: AtomicUsize,
    most_out: AtomicUsize,
    failing: u64,
    down: AtomicBool,
}

/// Counts a send out until it is dropped.
struct Out<'a>(&'a AtomicUsize);

impl Drop for Out<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl MessageSink for Recording {
    fn send<'a>(&'a self, message: &'a Outgoing<'a>) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let n: u64 = message.id.parse().unwrap();
            let forwarded = self.queue.stats().forwarded;
            self.sends.lock().unwrap().push((n, forwarded));
            let out = self.out.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_out.fetch_max(out, Ordering::SeqCst);
            // No longer out when answered or dropped (a window cleared).
            let _out = Out(&self.out);
            // The failing one answers last: those behind it are done
            // first, and must not move the queue past it.
            let answer_in = if n == self.failing {
                60
            } else {
                20 - n % 4 * 5
            };
            async_io::Timer::after(Duration::from_millis(answer_in)).await;
            if n == self.failing && self.down.load(Ordering::SeqCst) {
                return Err(SinkError::Transient {
                    reason: "down".to_owned(),
                    retry_after: None,
                });
            }
            Ok(())
        })
    }
}

/// 40 messages queued, forwarded `in_flight` at once through a sink
/// that is down for message 10 until 300 ms in.
fn forwarded_through_a_window(in_flight: usize) -> (Vec<(u64, u64)>, usize) {
    let dir = tempfile::tempdir().unwrap();
    let settings = QueueSettings::new(1 << 20, SyncPolicy::Every(Duration::from_millis(50)))
        .unwrap()
        .with_segment_bytes(1024)
        .unwrap();
    let (queue, _) = DiskQueue::open(dir.path(), settings).unwrap();
    let queued = QueuedSink::new("uplink", queue.clone(), WhenFull::Refuse);
    for n in 0..40u64 {
        let id = n.to_string();
        let message = Outgoing {
            id: &id,
            origin: "orders",
            fence: None,
            payload: &[7u8; 60],
        };
        smol::block_on(queued.send(&message)).unwrap();
    }
    let sink = Recording {
        queue: queue.clone(),
        sends: Mutex::new(Vec::new()),
        out: AtomicUsize::new(0),
        most_out: AtomicUsize::new(0),
        failing: 10,
        down: AtomicBool::new(true),
    };
    let window = NonZeroUsize::new(in_flight).unwrap();
    // No retry: a head the sink is down for waits 100 ms (the shortest
    // wait), then sending starts again from it.
    let policy = RetryPolicy::no_retry().with_max_delay(Duration::from_millis(1));
    smol::block_on(futures_lite::future::or(
        forward(&queued, &sink, &policy, window, |_| {
            panic!("nothing is dead-lettered")
        }),
        async {
            async_io::Timer::after(Duration::from_millis(300)).await;
            sink.down.store(false, Ordering::SeqCst);
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while queue.stats().pending > 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "in flight {in_flight}: not all forwarded within 30 s"
                );
                async_io::Timer::after(Duration::from_millis(5)).await;
            }
        },
    ));
    assert_eq!(queue.stats().forwarded, 40, "all forwarded");
    assert!(queue.peek().unwrap().is_none(), "the queue is empty");
    let most = sink.most_out.load(Ordering::SeqCst);
    assert!(
        most <= in_flight,
        "{most} out at once, more than {in_flight}"
    );
    (sink.sends.into_inner().unwrap(), most)
}

#[test]
fn a_window_in_flight_moves_the_queue_in_order_and_sends_again_from_a_failed_head() {
    for in_flight in [1, 4] {
        let (sends, most_out) = forwarded_through_a_window(in_flight);
        let window = in_flight as u64;
        for &(n, forwarded) in &sends {
            // Never past a message not yet sent, and never more than the
            // window ahead of the head.
            assert!(
                forwarded <= n && n < forwarded + window,
                "in flight {in_flight}: message {n} sent with {forwarded} forwarded"
            );
        }
        for n in 0..40 {
            assert!(
                sends.iter().any(|&(m, _)| m == n),
                "in flight {in_flight}: message {n} never sent"
            );
        }
        // Message 10 was refused until the sink came back; the queue
        // stayed at it, and sending started again from it.
        let tries_of_10 = sends.iter().filter(|&&(n, _)| n == 10).count();
        assert!(
            tries_of_10 >= 2,
            "in flight {in_flight}: message 10 tried {tries_of_10} time(s)"
        );
        let taken_10 = sends.iter().rposition(|&(n, _)| n == 10).unwrap();
        assert!(
            sends[..taken_10].iter().all(|&(_, f)| f <= 10),
            "in flight {in_flight}: the queue moved past 10 before it was taken"
        );
        if in_flight == 1 {
            let order: Vec<u64> = sends.iter().map(|&(n, _)| n).collect();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(order, sorted, "one in flight: in queue order");
            assert_eq!(sends.len(), 40 + tries_of_10 - 1, "nothing else sent twice");
        } else {
            // The window was used: more than one out at once, and what
            // was behind the failed head sent again.
            assert!(most_out > 1, "in flight {in_flight}: one at a time");
            assert!(
                sends.iter().filter(|&&(n, _)| n == 11).count() >= 2,
                "in flight {in_flight}: message 11 not sent again from the head"
            );
        }
    }
}

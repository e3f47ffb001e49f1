//! Store-and-forward: a sink's messages through a queue on disk
//! (guard-std's [`DiskQueue`]), so a sink that is down, slow or held back
//! by its quota holds nobody up until the queue is full.
//!
//! - [`QueuedSink`] is the [`MessageSink`] a source sends through: a
//!   message is taken once it is in the queue (written, and synced as
//!   the queue's [`SyncPolicy`] says),
//!   with its id, origin and fence, so the source acknowledges it then.
//! - [`forward`] takes the queue's messages to the real sink in the order
//!   they were queued (one at a time, or a window of them in flight),
//!   each with [`deliver`] under the sink's retry policy, and moves the
//!   queue past a message only once it and all before it are done; a
//!   message the sink is down for stays at the head and is tried again
//!   (a queue rides out an outage: it is never dead-lettered for a
//!   transient failure); one the sink refuses for good or as stale goes
//!   to the caller's dead letters, then the queue moves on.
//! - A full queue holds its senders back ([`WhenFull::Wait`]: the send
//!   waits a while for room, then answers [`SinkError::HeldBack`], which
//!   [`deliver`] asks again at once, the lease checked first, and counts
//!   as no attempt; so a source reads nothing more meanwhile and its
//!   order is kept) or refuses at once
//!   ([`WhenFull::Refuse`]: a permanent refusal, counted, which a source
//!   dead-letters). Both are counted, and logged once per interval.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use guard_core::retry::{RetryPolicy, WithoutRandom};
use guard_std::BoxFuture;
use guard_std::disk_queue::{AppendError, DiskQueue, SyncPolicy};

use super::{Delivery, MessageSink, Outgoing, SinkError, deliver};

/// What a full queue does with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenFull {
    /// Waits for room up to this long (forwarding freeing some ends the
    /// wait sooner), then answers [`SinkError::HeldBack`]: [`deliver`]
    /// asks again, the lease checked first, as long as it takes. The
    /// sender, and so its source, is held back, and what comes after the
    /// message waits behind it, in order. Race the delivery with a stop.
    Wait(Duration),
    /// Refuses it at once, for good (counted in
    /// [`QueuedSink::refused`]).
    Refuse,
}

/// A sink in front of a [`DiskQueue`]: see the [module](self).
pub struct QueuedSink {
    name: String,
    queue: DiskQueue,
    when_full: WhenFull,
    refused: AtomicU64,
    /// A flood of full-queue warnings is logged once per interval.
    warnings: guard_std::Throttle,
    /// The gauges [`measure`](Self::measure) sets, looked up once.
    pending: metrics::Gauge,
    bytes: metrics::Gauge,
}

impl QueuedSink {
    /// Queues what is sent in `queue`; `when_full` says what a full queue
    /// does. `name` labels its metrics ([`QUEUE_FULL`],
    /// [`QUEUE_PENDING`], [`QUEUE_BYTES`], [`QUEUE_MAX_BYTES`]).
    ///
    /// [`QUEUE_FULL`]: guard_std::metrics::QUEUE_FULL
    /// [`QUEUE_PENDING`]: guard_std::metrics::QUEUE_PENDING
    /// [`QUEUE_BYTES`]: guard_std::metrics::QUEUE_BYTES
    /// [`QUEUE_MAX_BYTES`]: guard_std::metrics::QUEUE_MAX_BYTES
    pub fn new(name: &str, queue: DiskQueue, when_full: WhenFull) -> Self {
        // Both outcomes exported from the start, at 0.
        for outcome in ["held_back", "refused"] {
            metrics::counter!(guard_std::metrics::QUEUE_FULL, "name" => name.to_owned(), "outcome" => outcome)
                .increment(0);
        }
        metrics::gauge!(guard_std::metrics::QUEUE_MAX_BYTES, "name" => name.to_owned())
            .set(queue.stats().max_bytes as f64);
        QueuedSink {
            name: name.to_owned(),
            queue,
            when_full,
            refused: AtomicU64::new(0),
            warnings: guard_std::Throttle::new(),
            pending: metrics::gauge!(guard_std::metrics::QUEUE_PENDING, "name" => name.to_owned()),
            bytes: metrics::gauge!(guard_std::metrics::QUEUE_BYTES, "name" => name.to_owned()),
        }
    }

    /// Sets the queue's gauges to what it holds now.
    pub fn measure(&self) {
        let stats = self.queue.stats();
        self.pending.set(stats.pending as f64);
        self.bytes.set(stats.bytes as f64);
    }

    fn count_full(&self, outcome: &'static str) {
        metrics::counter!(guard_std::metrics::QUEUE_FULL, "name" => self.name.clone(), "outcome" => outcome)
            .increment(1);
    }

    /// The queue.
    pub fn queue(&self) -> &DiskQueue {
        &self.queue
    }

    /// Messages refused since the start because the queue was full (or
    /// the disk).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    async fn append(&self, record: Arc<Vec<u8>>) -> Result<(), AppendError> {
        match self.queue.settings().sync() {
            // A sync per record: off the caller's thread.
            SyncPolicy::EveryWrite => {
                let queue = self.queue.clone();
                blocking::unblock(move || queue.append(&record)).await
            }
            // A write to the kernel's cache: microseconds.
            SyncPolicy::Every(_) => self.queue.append(&record),
        }
    }
}

impl MessageSink for QueuedSink {
    fn send<'a>(&'a self, message: &'a Outgoing<'a>) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(async move {
            let record = Arc::new(encode(message));
            let len = record.len();
            let error = match self.append(record).await {
                Ok(()) => {
                    self.measure();
                    return Ok(());
                }
                Err(e) => e,
            };
            match (error.is_back_pressure(), self.when_full) {
                (true, WhenFull::Wait(look_again)) => {
                    self.count_full("held_back");
                    if let Some(more) = self.warnings.admit() {
                        tracing::warn!(
                            "sink {}: {error}; its sources are held back until there is room ({more} more not logged)",
                            self.name
                        );
                    }
                    // Room under the bound comes when forwarding frees a
                    // segment; a full disk, when forwarding frees one or
                    // other files go: wait for that, or a while either
                    // way. Then the caller asks again, the lease it read
                    // the message under checked first: nothing is
                    // appended after a wait here.
                    let room = async {
                        if matches!(error, AppendError::Full { .. }) {
                            self.queue.space(len).await;
                        } else {
                            self.queue.freed().await;
                        }
                    };
                    futures_lite::future::or(room, async {
                        async_io::Timer::after(look_again).await;
                    })
                    .await;
                    Err(SinkError::HeldBack {
                        reason: error.to_string(),
                    })
                }
                (true, WhenFull::Refuse) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    self.count_full("refused");
                    if let Some(more) = self.warnings.admit() {
                        tracing::warn!(
                            "sink {}: {error}; refused ({more} more not logged)",
                            self.name
                        );
                    }
                    Err(SinkError::Permanent {
                        reason: format!("{error} (refused: when full, refuse)"),
                    })
                }
                (false, _) => {
                    let reason = format!("not queued: {error}");
                    Err(if matches!(error, AppendError::TooLarge { .. }) {
                        SinkError::Permanent { reason }
                    } else {
                        SinkError::Transient {
                            reason,
                            retry_after: None,
                        }
                    })
                }
            }
        })
    }
}

/// A message as the queue keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queued {
    /// Its id.
    pub id: String,
    /// Its origin.
    pub origin: String,
    /// The fence it was read under.
    pub fence: Option<u64>,
    /// When it was queued, in milliseconds since the Unix epoch.
    pub queued_at_ms: u64,
    /// Its payload.
    pub payload: Vec<u8>,
}

impl Queued {
    /// The message, to send.
    pub fn outgoing(&self) -> Outgoing<'_> {
        Outgoing {
            id: &self.id,
            origin: &self.origin,
            fence: self.fence,
            payload: &self.payload,
        }
    }
}

/// The shortest wait before a head the sink is down for is tried again
/// (a policy without delays would spin).
const MIN_HEAD_WAIT: Duration = Duration::from_millis(100);

/// The record format's version, its first byte.
const VERSION: u8 = 1;

/// A message's record: version, fence (flag and value), the time queued,
/// the id's and origin's lengths and bytes, then the payload.
fn encode(message: &Outgoing<'_>) -> Vec<u8> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut record =
        Vec::with_capacity(26 + message.id.len() + message.origin.len() + message.payload.len());
    record.push(VERSION);
    record.push(u8::from(message.fence.is_some()));
    record.extend_from_slice(&message.fence.unwrap_or(0).to_le_bytes());
    record.extend_from_slice(&now_ms.to_le_bytes());
    for text in [message.id, message.origin] {
        // An id or origin longer than 4 GiB is no id: cut, never a panic.
        let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
        record.extend_from_slice(&len.to_le_bytes());
        record.extend_from_slice(&text.as_bytes()[..len as usize]);
    }
    record.extend_from_slice(message.payload);
    record
}

/// A record read back; `Err` names what is wrong with it.
pub fn decode(record: &[u8]) -> Result<Queued, String> {
    let mut rest = record;
    let mut take = |n: usize, what: &str| -> Result<&[u8], String> {
        if rest.len() < n {
            return Err(format!("a queued record cut short in its {what}"));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let u64_of = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let version = take(1, "version")?[0];
    if version != VERSION {
        return Err(format!(
            "a queued record of version {version}, this build reads {VERSION}"
        ));
    }
    let fenced = take(1, "fence")?[0] == 1;
    let fence = u64_of(take(8, "fence")?);
    let queued_at_ms = u64_of(take(8, "time")?);
    let mut text = |what: &str| -> Result<String, String> {
        let len = take(4, what)?;
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        String::from_utf8(take(len, what)?.to_vec())
            .map_err(|_| format!("a queued {what} not UTF-8"))
    };
    let id = text("id")?;
    let origin = text("origin")?;
    Ok(Queued {
        id,
        origin,
        fence: fenced.then_some(fence),
        queued_at_ms,
        payload: rest.to_vec(),
    })
}

/// A queued message the sink did not take, for the dead letters.
#[derive(Debug)]
pub struct NotTaken {
    /// The message (`None`: its record could not be read back).
    pub message: Option<Queued>,
    /// Why: the sink's last answer, or what is wrong with the record.
    pub error: SinkError,
    /// Calls of the sink made.
    pub attempts: u32,
}

/// What became of the message at the front of the window.
struct Sent {
    /// The message (`Err`: what is wrong with its record).
    message: Result<Queued, String>,
    /// How its delivery ended (none for a record that cannot be read).
    delivery: Delivery,
}

/// Reads `record` and delivers it through `sink` under `policy`.
async fn send_record(record: Vec<u8>, sink: &dyn MessageSink, policy: &RetryPolicy) -> Sent {
    match decode(&record) {
        Ok(message) => {
            let delivery =
                deliver(sink, &message.outgoing(), policy, &mut WithoutRandom, None).await;
            Sent {
                message: Ok(message),
                delivery,
            }
        }
        Err(reason) => Sent {
            message: Err(reason.clone()),
            delivery: Delivery {
                attempts: 0,
                outcome: Err(SinkError::Permanent { reason }),
            },
        },
    }
}

/// Forwards `queued`'s messages to `sink` for as long as it is polled
/// (race it with a stop), up to `in_flight` at once, taken off the queue
/// in order:
///
/// - each is sent with `policy`'s retries ([`deliver`]);
/// - the queue moves past a message only once it and every message
///   before it are done (taken, or dead-lettered), so a crash sends again
///   at most the window, each under its own id;
/// - a message still failing transiently stays at the head: what is in
///   flight behind it is dropped, and after the policy's longest delay
///   sending starts again at the head (a message behind it that had
///   arrived is sent again, under its id);
/// - one refused for good or as stale goes to `dead_letter`, which
///   answers whether it kept it: then the queue moves on; if not, the
///   message stays at the head and is sent again after a second (nothing
///   leaves the queue that is not kept elsewhere);
/// - a queue that cannot be read is read again after a second.
///
/// With `in_flight` 1 the receiver gets the messages in the order they
/// were queued, one at a time. With more, they leave in that order but
/// may arrive in any order within a window of `in_flight`; the sink
/// decides how many it carries at once (an
/// [`HttpSink`](super::http::HttpSink) keeps as many connections as its
/// own `in_flight`).
pub async fn forward(
    queued: &QueuedSink,
    sink: &dyn MessageSink,
    policy: &RetryPolicy,
    in_flight: NonZeroUsize,
    mut dead_letter: impl FnMut(NotTaken) -> bool,
) {
    let queue = &queued.queue;
    // Since when the sink has not taken the head (an outage), to log its
    // start and its end once each.
    let mut down_since: Option<std::time::Instant> = None;
    let mut sending = FuturesOrdered::new();
    // The queue said it held more than was handed out, yet read nothing
    // (a damaged record ahead): wait before asking again, never spin.
    let mut read_nothing = false;
    loop {
        let mut read_all = false;
        while sending.len() < in_flight.get() {
            match queue.read_next() {
                Ok(Some(record)) => sending.push_back(send_record(record, sink, policy)),
                Ok(None) => {
                    read_all = true;
                    break;
                }
                Err(e) => {
                    tracing::error!("{e}; reading again in 1 s");
                    sending.clear();
                    queue.rewind();
                    async_io::Timer::after(Duration::from_secs(1)).await;
                    break;
                }
            }
        }
        if sending.is_empty() {
            if read_all && read_nothing {
                async_io::Timer::after(MIN_HEAD_WAIT).await;
            }
            read_nothing = read_all;
            queue.unread().await;
            continue;
        }
        read_nothing = false;
        // The oldest in flight: the only one the queue may move past.
        let Some(Sent { message, delivery }) = sending.next().await else {
            continue;
        };
        let Delivery { attempts, outcome } = delivery;
        if outcome.is_ok()
            && let Some(since) = down_since.take()
        {
            tracing::info!(
                "sink {}: forwarding again after {:?}",
                queued.name,
                since.elapsed()
            );
        }
        let taken = match (outcome, message) {
            (Ok(()), _) => true,
            (
                Err(SinkError::Transient {
                    retry_after,
                    ref reason,
                }),
                _,
            ) => {
                // Still down: the head waits, nothing behind it passes
                // (order), nothing is dropped.
                let wait = retry_after
                    .unwrap_or_default()
                    .max(policy.max_delay())
                    .max(MIN_HEAD_WAIT);
                if down_since.is_none() {
                    down_since = Some(std::time::Instant::now());
                    tracing::warn!(
                        "sink {}: not taken after {attempts} attempt(s): {reason}; {} message(s) wait in the queue, tried again every {wait:?}",
                        queued.name,
                        queue.stats().pending
                    );
                }
                sending.clear();
                async_io::Timer::after(wait).await;
                false
            }
            (Err(error), message) => {
                let kept = dead_letter(NotTaken {
                    message: message.ok(),
                    error,
                    attempts,
                });
                if !kept {
                    // Not kept elsewhere: it stays, and is tried again.
                    sending.clear();
                    async_io::Timer::after(Duration::from_secs(1)).await;
                }
                kept
            }
        };
        if taken {
            if let Err(e) = queue.advance() {
                tracing::error!("{e}");
            }
            queued.measure();
        } else {
            // Sent again from the head, the window after it too.
            sending.clear();
            queue.rewind();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_the_message_it_was() {
        for fence in [None, Some(0), Some(u64::MAX)] {
            let message = Outgoing {
                id: "orders:1-0",
                origin: "orders",
                fence,
                payload: &[0, 159, 255, b'\n'],
            };
            let queued = decode(&encode(&message)).unwrap();
            assert_eq!(queued.outgoing(), message);
        }
    }

    #[test]
    fn a_record_cut_short_or_of_another_version_is_an_error_not_a_panic() {
        let record = encode(&Outgoing {
            id: "id",
            origin: "origin",
            fence: Some(3),
            payload: b"payload",
        });
        // Cut anywhere before the payload.
        for cut in 0..(1 + 1 + 8 + 8 + 4 + 2 + 4 + 6) {
            assert!(decode(&record[..cut]).is_err(), "cut at {cut}");
        }
        let mut other = record.clone();
        other[0] = 2;
        assert!(decode(&other).unwrap_err().contains("version 2"));
    }
}

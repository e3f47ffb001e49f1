//! The bounded queue between a broadcast source's reader and its handler.
//!
//! A broadcast source (Redis Pub/Sub) keeps nothing for a slow
//! subscriber: Redis buffers what the subscriber has not read and, past
//! its `client-output-buffer-limit`, closes the connection and discards
//! the buffer, uncounted. So the endpoint reads as fast as the server
//! sends, on a thread of its own, into this queue, and the handler takes
//! from it at its own speed. When the handler falls behind, the queue
//! fills and its [`WhenFull`] policy drops a message: counted and logged,
//! never silent, and never a reason for the server to disconnect.
//!
//! The queue is bounded in messages and in bytes (what its messages
//! weigh: channel and payload), so a producer's long channel names or
//! large payloads fill it at its bytes, never past them.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Messages a queue holds by default: 1024, under a second of backlog
/// for a handler of a few thousand messages a second.
pub const DEFAULT_QUEUE: usize = 1024;

/// The bytes a queue's messages weigh at most by default: 16 MiB.
pub const DEFAULT_QUEUE_BYTES: usize = 16 << 20;

/// Which message a full queue drops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WhenFull {
    /// The arriving message: the queue keeps the oldest, the handler sees
    /// an unbroken run of what arrived first (a NATS client's behaviour
    /// with a slow consumer).
    #[default]
    DropNewest,
    /// The oldest queued message, making room: the handler sees the
    /// freshest (a `tokio::sync::broadcast` receiver that lags).
    DropOldest,
}

impl WhenFull {
    /// Its name in configuration.
    pub fn name(self) -> &'static str {
        match self {
            WhenFull::DropNewest => "drop-newest",
            WhenFull::DropOldest => "drop-oldest",
        }
    }
}

impl fmt::Display for WhenFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a [`WhenFull`] policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownWhenFull(pub String);

impl fmt::Display for UnknownWhenFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown policy {:?}: expected \"drop-newest\" or \"drop-oldest\"",
            self.0
        )
    }
}

impl std::error::Error for UnknownWhenFull {}

impl FromStr for WhenFull {
    type Err = UnknownWhenFull;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "drop-newest" => Ok(WhenFull::DropNewest),
            "drop-oldest" => Ok(WhenFull::DropOldest),
            other => Err(UnknownWhenFull(other.to_owned())),
        }
    }
}

/// The sending side of a bounded queue with a [`WhenFull`] policy.
pub(crate) struct Feeder<T> {
    tx: async_channel::Sender<T>,
    /// A receiver of its own, to take the oldest out under
    /// [`WhenFull::DropOldest`] when the bytes are full.
    oldest: async_channel::Receiver<T>,
    policy: WhenFull,
    bytes: Bytes<T>,
}

/// What a queue's messages weigh together, shared by its two sides: added
/// before a message is sent, taken off once it is received, so that the
/// count never falls below what is queued.
struct Bytes<T> {
    held: Arc<AtomicUsize>,
    max: usize,
    weigh: fn(&T) -> usize,
}

impl<T> Clone for Bytes<T> {
    fn clone(&self) -> Self {
        Bytes {
            held: self.held.clone(),
            max: self.max,
            weigh: self.weigh,
        }
    }
}

impl<T> Bytes<T> {
    fn taken(&self, item: &T) {
        self.held.fetch_sub((self.weigh)(item), Ordering::AcqRel);
    }
}

/// The receiving side: the messages in the order they were queued.
pub(crate) struct Drain<T> {
    rx: async_channel::Receiver<T>,
    bytes: Bytes<T>,
}

impl<T> Clone for Drain<T> {
    fn clone(&self) -> Self {
        Drain {
            rx: self.rx.clone(),
            bytes: self.bytes.clone(),
        }
    }
}

impl<T> Drain<T> {
    /// The next message, once there is one; an error once the queue is
    /// closed and empty.
    pub(crate) async fn recv(&self) -> Result<T, async_channel::RecvError> {
        let item = self.rx.recv().await?;
        self.bytes.taken(&item);
        Ok(item)
    }

    /// The next message if one waits.
    pub(crate) fn try_recv(&self) -> Result<T, async_channel::TryRecvError> {
        let item = self.rx.try_recv()?;
        self.bytes.taken(&item);
        Ok(item)
    }

    /// What the queued messages weigh now.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.held.load(Ordering::Acquire)
    }
}

impl<T> Feeder<T> {
    /// A queue of `capacity` messages (at least 1) weighing at most
    /// `max_bytes` by `weigh`, and its receiving side.
    pub(crate) fn bounded(
        capacity: usize,
        max_bytes: usize,
        weigh: fn(&T) -> usize,
        policy: WhenFull,
    ) -> (Self, Drain<T>) {
        let (tx, rx) = async_channel::bounded(capacity.max(1));
        let bytes = Bytes {
            held: Arc::new(AtomicUsize::new(0)),
            max: max_bytes,
            weigh,
        };
        let feeder = Feeder {
            tx,
            oldest: rx.clone(),
            policy,
            bytes: bytes.clone(),
        };
        (feeder, Drain { rx, bytes })
    }

    /// Queues `item` without waiting; each message the policy leaves out
    /// to make room (the arriving one, or the oldest ones) goes to
    /// `left_out`, so the caller can account for it. A message heavier
    /// than the whole bound, or arriving at a closed queue (the handler
    /// has gone), is left out itself.
    pub(crate) fn push(&self, item: T, mut left_out: impl FnMut(T)) {
        let weight = (self.bytes.weigh)(&item);
        // Heavier than the whole bound, or no receiver left but the
        // feeder's own: the handler has gone.
        if weight > self.bytes.max || self.tx.receiver_count() <= 1 {
            return left_out(item);
        }
        // The bytes are reserved before the message is sent, in one step,
        // so that two pushes at once (a reader stopping while the next
        // starts) never pass the bound together.
        let reserved = || {
            self.bytes
                .held
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                    held.checked_add(weight).filter(|&n| n <= self.bytes.max)
                })
                .is_ok()
        };
        let mut room = reserved();
        if self.policy == WhenFull::DropOldest {
            while !room {
                match self.oldest.try_recv() {
                    Ok(oldest) => {
                        self.bytes.taken(&oldest);
                        left_out(oldest);
                        room = reserved();
                    }
                    // Empty, the rest being received right now.
                    Err(_) => break,
                }
            }
        }
        if !room {
            return left_out(item);
        }
        let sent = match self.policy {
            WhenFull::DropNewest => self
                .tx
                .try_send(item)
                .map(|()| None)
                .map_err(|e| e.into_inner()),
            WhenFull::DropOldest => self
                .tx
                .force_send(item)
                .map_err(|closed| closed.into_inner()),
        };
        match sent {
            Ok(None) => {}
            Ok(Some(oldest)) => {
                self.bytes.taken(&oldest);
                left_out(oldest);
            }
            Err(item) => {
                self.bytes.taken(&item);
                left_out(item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `feeder` left out of pushing each of `items`.
    fn pushed<T>(feeder: &Feeder<T>, items: impl IntoIterator<Item = T>) -> Vec<T> {
        let mut out = Vec::new();
        for item in items {
            feeder.push(item, |left| out.push(left));
        }
        out
    }

    #[test]
    fn a_full_queue_drops_by_its_policy_and_says_so() {
        let unit = |_: &u32| 1;
        let (newest, rx) = Feeder::bounded(2, usize::MAX, unit, WhenFull::DropNewest);
        assert!(pushed(&newest, [1, 2]).is_empty());
        assert_eq!(pushed(&newest, [3]), [3], "the arriving one is handed back");
        assert_eq!((rx.try_recv(), rx.try_recv()), (Ok(1), Ok(2)));

        let (oldest, rx) = Feeder::bounded(2, usize::MAX, unit, WhenFull::DropOldest);
        assert!(pushed(&oldest, [1, 2]).is_empty());
        assert_eq!(pushed(&oldest, [3]), [1], "the oldest is handed back");
        assert_eq!((rx.try_recv(), rx.try_recv()), (Ok(2), Ok(3)));
        assert_eq!(rx.bytes(), 0);

        drop(rx);
        assert_eq!(pushed(&oldest, [4]), [4], "a closed queue keeps nothing");
    }

    #[test]
    fn a_queue_is_bounded_in_bytes_as_well_as_in_messages() {
        // Room for 100 messages but 1,000 bytes: long names fill the bytes.
        let weigh = |s: &String| s.len();
        let (newest, rx) = Feeder::bounded(100, 1000, weigh, WhenFull::DropNewest);
        let long = |c: char| c.to_string().repeat(400);
        assert!(pushed(&newest, [long('a'), long('b')]).is_empty());
        assert_eq!(pushed(&newest, [long('c')]), [long('c')], "1,200 > 1,000");
        assert!(pushed(&newest, ["d".to_owned()]).is_empty());
        assert_eq!(rx.bytes(), 801);
        assert_eq!(rx.try_recv(), Ok(long('a')));
        assert_eq!(rx.bytes(), 401);
        assert!(pushed(&newest, [long('e')]).is_empty());
        // Heavier than the whole bound: never queued.
        assert_eq!(pushed(&newest, ["f".repeat(1001)]), ["f".repeat(1001)]);

        let (oldest, rx) = Feeder::bounded(100, 1000, weigh, WhenFull::DropOldest);
        assert!(pushed(&oldest, [long('a'), "b".to_owned(), long('c')]).is_empty());
        // 801 held: 400 more leave out the oldest until they fit.
        assert_eq!(pushed(&oldest, [long('d')]), [long('a')]);
        assert_eq!(rx.bytes(), 801);
        assert_eq!(
            pushed(&oldest, ["e".repeat(1000)]),
            ["b".to_owned(), long('c'), long('d')]
        );
        assert_eq!((rx.try_recv(), rx.bytes()), (Ok("e".repeat(1000)), 0));
    }

    #[test]
    fn policies_parse_from_their_names_only() {
        for policy in [WhenFull::DropNewest, WhenFull::DropOldest] {
            assert_eq!(policy.name().parse(), Ok(policy));
        }
        let err = "drop".parse::<WhenFull>().unwrap_err();
        assert!(err.to_string().contains("drop-newest"), "{err}");
    }
}

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

use std::fmt;
use std::str::FromStr;

/// Messages a queue holds by default: 1024, under a second of backlog
/// for a handler of a few thousand messages a second.
pub const DEFAULT_QUEUE: usize = 1024;

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
    policy: WhenFull,
}

impl<T> Feeder<T> {
    /// A queue of `capacity` (at least 1) and its receiving side.
    pub(crate) fn bounded(capacity: usize, policy: WhenFull) -> (Self, async_channel::Receiver<T>) {
        let (tx, rx) = async_channel::bounded(capacity.max(1));
        (Feeder { tx, policy }, rx)
    }

    /// Queues `item` without waiting; when the policy makes room by
    /// leaving one out (the arriving item or the oldest), hands that one
    /// back, so the caller can account for it. A closed queue (the
    /// handler has gone) hands the arriving item back.
    pub(crate) fn push(&self, item: T) -> Option<T> {
        match self.policy {
            WhenFull::DropNewest => self.tx.try_send(item).err().map(|e| e.into_inner()),
            WhenFull::DropOldest => match self.tx.force_send(item) {
                Ok(oldest) => oldest,
                Err(closed) => Some(closed.into_inner()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_by_its_policy_and_says_so() {
        let (newest, rx) = Feeder::bounded(2, WhenFull::DropNewest);
        assert_eq!((newest.push(1), newest.push(2)), (None, None));
        assert_eq!(newest.push(3), Some(3), "the arriving one is handed back");
        assert_eq!((rx.try_recv(), rx.try_recv()), (Ok(1), Ok(2)));

        let (oldest, rx) = Feeder::bounded(2, WhenFull::DropOldest);
        assert_eq!((oldest.push(1), oldest.push(2)), (None, None));
        assert_eq!(oldest.push(3), Some(1), "the oldest is handed back");
        assert_eq!((rx.try_recv(), rx.try_recv()), (Ok(2), Ok(3)));

        drop(rx);
        assert_eq!(oldest.push(4), Some(4), "a closed queue keeps nothing");
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

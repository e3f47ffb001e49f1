//! The sink contract, as a suite every sink runs against its real
//! receiver, in the spirit of the Locker [`contract`](crate::contract).
//!
//! A sink (guard-endpoints' `MessageSink`) promises:
//!
//! 1. **Delivered means taken, as sent.** `Ok` only once the receiver
//!    has the message, with its payload, id, origin and fence unchanged;
//!    one call, one message taken ([`delivered_means_taken_as_sent`]).
//! 2. **Down is transient, and passes.** While the receiver cannot be
//!    reached the answer is transient (never `Ok`, never a refusal for
//!    good), and once it is back the same sink delivers: the message sent
//!    again arrives, once on a deduplicating receiver (a transient answer
//!    does not say it was not taken: a request may land after its
//!    timeout) ([`down_is_transient_and_recovers`]).
//! 3. **A repeat carries its id.** The same message sent twice reaches
//!    the receiver under the same id both times, and a sink that
//!    deduplicates takes it once ([`a_repeat_carries_its_id`]).
//! 4. **Stale fences are refused, fences never go back.** Once a fenced
//!    receiver has taken fence N, a message under a lower fence is
//!    refused as stale, naming both fences, and nothing of it is taken;
//!    N and above still pass ([`stale_fences_are_refused`]).
//!
//! A sink plugs in through [`SinkUnderTest`], which also controls its
//! receiver; `adapters/testkit/tests/sinks.rs` shows that each check
//! catches a sink breaking its rule. A check panics naming the rule.

use std::future::Future;

/// One message as the suite sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The stable id.
    pub id: String,
    /// Where it came from.
    pub origin: String,
    /// The fence it was read under, if any.
    pub fence: Option<u64>,
    /// The payload.
    pub payload: Vec<u8>,
}

impl Sent {
    /// A message with `id`, a payload of its own and no fence.
    pub fn new(id: &str) -> Self {
        Sent {
            id: id.to_owned(),
            origin: "contract.origin".to_owned(),
            fence: None,
            payload: format!("{{\"id\":\"{id}\"}}").into_bytes(),
        }
    }

    /// This message under `fence`.
    #[must_use]
    pub fn under(mut self, fence: u64) -> Self {
        self.fence = Some(fence);
        self
    }
}

/// A sink's answer, as the suite judges it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answered {
    /// The receiver has it.
    Delivered,
    /// Not this time.
    Transient(String),
    /// Never.
    Permanent(String),
    /// Refused as a stale leader's.
    StaleFence {
        /// The message's fence.
        fence: u64,
        /// The highest the receiver has taken.
        highest: u64,
    },
}

/// A sink with the receiver it writes to.
pub trait SinkUnderTest {
    /// Sends `message` once through the sink.
    fn send(&self, message: &Sent) -> impl Future<Output = Answered>;
    /// Every message the receiver has taken so far, in order (what a
    /// deduplicating receiver kept once counts once).
    fn taken(&self) -> Vec<Sent>;
    /// Makes the receiver unreachable (`true`) or reachable again.
    fn set_down(&self, down: bool);
    /// Whether the receiver keeps a message sent twice once (a duplicate
    /// window); otherwise it records each arrival.
    fn deduplicates(&self) -> bool;
    /// Makes the receiver fenced, if it is not by nature: `false` for a
    /// receiver that has no fences (a JetStream stream), whose sink then
    /// skips rule 4.
    fn fence_receiver(&self) -> bool;
}

/// Every check, each with messages whose ids start with `prefix` (so a
/// receiver shared between runs is not confused).
pub async fn run_all(sink: &impl SinkUnderTest, prefix: &str) {
    delivered_means_taken_as_sent(sink, prefix).await;
    a_repeat_carries_its_id(sink, prefix).await;
    stale_fences_are_refused(sink, prefix).await;
    down_is_transient_and_recovers(sink, prefix).await;
}

fn taken_with(sink: &impl SinkUnderTest, id: &str) -> Vec<Sent> {
    sink.taken().into_iter().filter(|t| t.id == id).collect()
}

/// Rule 1: `Ok` means the receiver has exactly that message, once.
pub async fn delivered_means_taken_as_sent(sink: &impl SinkUnderTest, prefix: &str) {
    for (n, message) in [
        Sent::new(&format!("{prefix}:plain")),
        Sent::new(&format!("{prefix}:fenced")).under(3),
        Sent {
            payload: (0..=255).collect(),
            ..Sent::new(&format!("{prefix}:binary"))
        },
    ]
    .into_iter()
    .enumerate()
    {
        let answered = sink.send(&message).await;
        assert_eq!(
            answered,
            Answered::Delivered,
            "delivered means taken: message {n} was not delivered"
        );
        let taken = taken_with(sink, &message.id);
        assert_eq!(
            taken,
            vec![message.clone()],
            "delivered means taken as sent: message {n} ({}) arrived otherwise",
            message.id
        );
    }
}

/// Rule 3: a message sent twice arrives under its id both times; a
/// deduplicating receiver takes it once.
pub async fn a_repeat_carries_its_id(sink: &impl SinkUnderTest, prefix: &str) {
    let message = Sent::new(&format!("{prefix}:repeat"));
    for attempt in 1..=2 {
        assert_eq!(
            sink.send(&message).await,
            Answered::Delivered,
            "a repeat carries its id: attempt {attempt} was not delivered"
        );
    }
    // By content, so that a repeat under another id is found too.
    let arrivals: Vec<Sent> = sink
        .taken()
        .into_iter()
        .filter(|t| t.payload == message.payload)
        .collect();
    let expected = if sink.deduplicates() { 1 } else { 2 };
    assert_eq!(
        arrivals.len(),
        expected,
        "a repeat carries its id: {} arrival(s) of {}, expected {expected}: {arrivals:?}",
        arrivals.len(),
        message.id
    );
    assert!(
        arrivals.iter().all(|t| t == &message),
        "a repeat carries its id: a repeat arrived changed: {arrivals:?}"
    );
}

/// Rule 4: below the highest fence taken, refused as stale and not taken.
pub async fn stale_fences_are_refused(sink: &impl SinkUnderTest, prefix: &str) {
    if !sink.fence_receiver() {
        return;
    }
    let at = |n: &str, fence| Sent::new(&format!("{prefix}:fence-{n}")).under(fence);
    // Above 2^53, where a fence read as a floating-point number (a Lua
    // script's `tonumber`) equals its neighbour.
    let high = (1 << 53) + 1;
    assert_eq!(
        sink.send(&at("high", high)).await,
        Answered::Delivered,
        "stale fences are refused: the first fence was not delivered"
    );
    let stale = at("stale", high - 1);
    assert_eq!(
        sink.send(&stale).await,
        Answered::StaleFence {
            fence: high - 1,
            highest: high
        },
        "stale fences are refused: fence {} after {high}",
        high - 1
    );
    assert!(
        taken_with(sink, &stale.id).is_empty(),
        "stale fences are refused: the stale message was taken"
    );
    for (n, fence) in [("same", high), ("higher", high + 1)] {
        assert_eq!(
            sink.send(&at(n, fence)).await,
            Answered::Delivered,
            "stale fences are refused: fence {fence} (not below the highest) was refused"
        );
    }
    let stale = at("after", high);
    assert!(
        matches!(
            sink.send(&stale).await,
            Answered::StaleFence { highest, .. } if highest == high + 1
        ),
        "fences never go back: fence {high} after {} was not refused",
        high + 1
    );
}

/// Rule 2: an unreachable receiver gives a transient answer; the same
/// sink delivers once it is back, the message sent again arriving.
pub async fn down_is_transient_and_recovers(sink: &impl SinkUnderTest, prefix: &str) {
    let during = Sent::new(&format!("{prefix}:during"));
    sink.set_down(true);
    let answered = sink.send(&during).await;
    sink.set_down(false);
    assert!(
        matches!(answered, Answered::Transient(_)),
        "down is transient: the answer while down was {answered:?}"
    );
    assert_eq!(
        sink.send(&during).await,
        Answered::Delivered,
        "down recovers: nothing delivered once the receiver was back"
    );
    let arrived = taken_with(sink, &during.id);
    let once = arrived.len() == 1;
    assert!(
        once || (!sink.deduplicates() && !arrived.is_empty()),
        "down recovers: the message sent again arrived {} time(s)",
        arrived.len()
    );
}

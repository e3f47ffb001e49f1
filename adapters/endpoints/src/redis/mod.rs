//! Redis sources, with the seeds' rule: single delivery where the source
//! gives it, a guard where it does not.
//!
//! - [`PubSubEndpoint`]: Pub/Sub broadcasts, so one replica subscribes at
//!   a time, elected by lease.
//! - [`StreamConsumer`]: a consumer group delivers each entry once, so no
//!   guard; acknowledgement, retry, dead letters and claims of a dead
//!   consumer's entries.

mod error;
mod pubsub;
mod stream;

pub use crate::queue::WhenFull;
pub use error::EndpointError;
pub use pubsub::{DEFAULT_CONFIRM_TIMEOUT, PubSubEndpoint, PubSubMessage, PubSubStats};
pub use stream::{
    ConsumeStats, DEFAULT_BATCH, DEFAULT_CLAIM_IDLE, DEFAULT_POLL_INTERVAL, GroupStart,
    StreamConsumer, StreamMessage,
};

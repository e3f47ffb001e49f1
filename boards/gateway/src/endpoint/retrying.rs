//! What the sources that retry and dead-letter by themselves (NATS,
//! RabbitMQ, PostgreSQL, the binlog) share: a message passes the inbox as
//! a result the source's retries act on.

use std::sync::Arc;

use guard_endpoints::delivery::ElectedLease;

use crate::admission::{Refusal, Verdict};

use super::{Content, Emit, Event, Inbox, Refused, text};

impl Inbox {
    /// Passes a message of `size` bytes from a source that retries and
    /// dead-letters by itself (NATS, RabbitMQ, PostgreSQL, the binlog),
    /// read under `lease` if elected: `Ok` when the handler may make its
    /// effect, at once (the lease is checked last, after any wait).
    pub(super) async fn check_message(
        &self,
        from: &str,
        size: usize,
        lease: Option<&ElectedLease>,
    ) -> Result<(), Refused> {
        if let Some(why) = self.too_large(size) {
            return Err(Refused::Invalid(why));
        }
        // A lease that ends while the message waits takes no token.
        let may_take = || lease.is_none_or(ElectedLease::is_valid);
        if let Some((admission, key)) = &self.limit {
            match admission
                .admit_while(self.key_of(key, from, None), size, may_take)
                .await
            {
                Verdict::Admitted => {}
                Verdict::Refused(Refusal::Withdrawn) => return Err(Refused::LeaseLost),
                Verdict::Refused(why) => return Err(Refused::Limited(why.to_string())),
            }
        }
        if lease.is_some_and(|lease| !lease.is_valid()) {
            return Err(Refused::LeaseLost);
        }
        Ok(())
    }
}

/// The handler of a source that retries and dead-letters by itself: a
/// message passes the inbox (a refusal fails it: retried unless it can
/// never pass, then dead-lettered by the source), then is reported.
pub(super) struct Report {
    inbox: Arc<Inbox>,
    emit: Emit,
    name: String,
}

impl Report {
    pub(super) fn new(inbox: &Arc<Inbox>, emit: &Emit, name: &str) -> Self {
        Report {
            inbox: inbox.clone(),
            emit: emit.clone(),
            name: name.to_owned(),
        }
    }

    /// `payload`, received from `from` under `lease` if elected; `kept`
    /// where the source keeps it, when it may hand it over again (the id
    /// its sink sees: [`Inbox::forward`]).
    pub(super) async fn payload(
        self,
        from: String,
        payload: Vec<u8>,
        lease: Option<ElectedLease>,
        kept: Option<&str>,
    ) -> Result<(), Refused> {
        self.inbox
            .check_message(&from, payload.len(), lease.as_ref())
            .await?;
        self.inbox
            .forward(kept, &from, &payload, lease.as_ref())
            .await?;
        let fence = lease.as_ref().map(ElectedLease::fence);
        (self.emit)(Event::Received {
            endpoint: self.name,
            from,
            fence,
            content: Content::Payload(text(&payload)),
        });
        Ok(())
    }

    /// `payload` from `from`, where the source keeps it (a JetStream
    /// sequence, a table's row): `from` is also its id for the sink.
    pub(super) async fn kept(self, from: String, payload: Vec<u8>) -> Result<(), Refused> {
        let kept = from.clone();
        self.payload(from, payload, None, Some(&kept)).await
    }
}

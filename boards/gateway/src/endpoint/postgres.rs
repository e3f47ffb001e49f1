//! `kind = "postgres-queue"`: a table of work, each row claimed by one
//! replica.

use guard_endpoints::postgres::PgQueue;

use super::retrying::Report;
use super::{Assembly, Task, failed, never_invalid};
use crate::config::PgQueueSource;
use crate::error::GatewayError;

/// What `check` prints of a table of work.
pub(super) fn describe(source: &PgQueueSource) -> String {
    format!("postgres-queue, rows claimed from {}", source.table)
}

/// The claimer of a table of work (its tables created unless they exist).
pub(super) async fn start(cx: Assembly<'_>, source: &PgQueueSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let identity = cx.identity;
    let context = |source| failed(&name, source);
    let mut queue = PgQueue::new(&source.url, &source.table)
        .and_then(|q| q.with_batch(source.batch))
        .and_then(|q| q.with_claim_lease(source.claim_lease))
        .and_then(|q| q.with_max_deliveries(source.max_deliveries))
        .and_then(|q| q.with_retry(source.retry))
        .and_then(|q| q.with_consumer_name(&format!("{name}-{identity}")))
        .map_err(|e| context(e.into()))?
        .with_poll_interval(source.poll_interval)
        .with_link(cx.link);
    if let Some(table) = &source.dead_letter_table {
        queue = queue
            .with_dead_letter_table(table)
            .map_err(|e| context(e.into()))?;
    }
    queue.create_tables().await.map_err(|e| context(e.into()))?;
    let table = source.table.clone();
    Ok(Box::pin(async move {
        let stats = queue
            .run(control, never_invalid(), |message| {
                let from = format!("{table}#{}", message.id);
                Report::new(&inbox, &emit, &name).payload(from, message.payload, None)
            })
            .await;
        log::info!("endpoint {name}: {stats:?}");
    }))
}

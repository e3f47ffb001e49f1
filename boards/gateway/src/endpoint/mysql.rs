//! `kind = "mysql-binlog"`: one elected reader of the binlog,
//! checkpointed under its fence.

use guard_endpoints::mysql::{BinlogReader, ColumnValue, Start, json_array};

use super::{Assembly, Content, Event, Refused, Task, elected_scope, failed, never_invalid};
use crate::config::{BinlogSource, BinlogStart};
use crate::error::GatewayError;

/// What `check` prints of a binlog source.
pub(super) fn describe(_source: &BinlogSource) -> String {
    "mysql-binlog, elected reader".to_owned()
}

/// The elected reader of a binlog.
pub(super) fn start(cx: Assembly<'_>, source: &BinlogSource) -> Result<Task, GatewayError> {
    let (name, inbox, emit, control) = (cx.name, cx.inbox, cx.emit, cx.control);
    let (built, timing) = (cx.built, cx.timing);
    let context = |source| failed(&name, source);
    let scope = |kind: &str| elected_scope(built, kind, &name);
    let scope = scope("binlog")?;
    let mut reader = BinlogReader::new(&source.url, &name, &built.guards, &scope)
        .and_then(|r| r.with_lock_service(&built.lock_service))
        .and_then(|r| r.with_guard_settings(timing))
        .and_then(|r| r.with_checkpoint_every(source.checkpoint_every))
        .and_then(|r| r.with_retry(source.retry))
        .map_err(|e| context(e.into()))?
        .with_start(match source.start {
            BinlogStart::Current => Start::Current,
            BinlogStart::Beginning => Start::Beginning,
        })
        .with_link(cx.link);
    if let Some(id) = source.server_id {
        reader = reader.with_server_id(id).map_err(|e| context(e.into()))?;
    }
    if let Some(table) = &source.checkpoint_table {
        reader = reader
            .with_checkpoint_table(table)
            .map_err(|e| context(e.into()))?;
    }
    if let Some(table) = &source.dead_letter_table {
        reader = reader
            .with_dead_letter_table(table)
            .map_err(|e| context(e.into()))?;
    }
    Ok(Box::pin(async move {
        let stats = reader
            .run(control, never_invalid(), |change| {
                let (inbox, emit, name) = (inbox.clone(), emit.clone(), name.clone());
                async move {
                    let from = format!(
                        "{}.{}@{}#{}",
                        change.database, change.table, change.position, change.row
                    );
                    let image = |row: &Option<Vec<ColumnValue>>| {
                        row.as_deref().map_or_else(|| "-".to_owned(), json_array)
                    };
                    let (before, after) = (image(&change.before), image(&change.after));
                    inbox
                        .check_message(&from, before.len() + after.len(), change.lease.as_ref())
                        .await?;
                    emit(Event::Received {
                        endpoint: name,
                        from,
                        fence: Some(change.fence),
                        content: Content::Fields(vec![
                            ("kind".to_owned(), change.kind.name().to_owned()),
                            ("before".to_owned(), before),
                            ("after".to_owned(), after),
                        ]),
                    });
                    Ok::<(), Refused>(())
                }
            })
            .await;
        log::info!("endpoint {name}: {stats:?}");
    }))
}

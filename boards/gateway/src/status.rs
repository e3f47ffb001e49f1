//! `GET /status`: what this replica holds, as JSON, beside `/metrics`,
//! `/healthz` and `/readyz` on the metrics address.
//!
//! - `ready`, and what it waits for when not (as `/readyz`);
//! - `leases`: every lease key this replica competes for (its leader-only
//!   consumers and elected endpoints), as named and as the lock service
//!   holds it (`stored_as`: in Redis, under the locker's prefix), the unit
//!   it is for, whether it leads, the fence, and how long until its renew
//!   deadline;
//! - `endpoints`: each source's connection (`connected`, the last
//!   failure), and for an elected one its lease key (and `lease_stored_as`)
//!   and whether it leads;
//! - `sinks`: each queue on disk (messages waiting, bytes, bound);
//! - `dead_letters`: the store on disk (bytes, bound), if configured.
//!
//! Reading it changes nothing: it reads the leases as a consumer checks
//! them, the links, and the queues' counters; no backend is called.

use guard_std::run::HeldLease;
use serde_json::{Value, json};

use crate::readiness::Readiness;

/// The status view of `ready`'s replica, as pretty-printed JSON.
pub fn render(ready: &Readiness) -> String {
    let mut text = serde_json::to_string_pretty(&view(ready)).unwrap_or_default();
    text.push('\n');
    text
}

/// The status view of `ready`'s replica.
pub fn view(ready: &Readiness) -> Value {
    // Each lease with the unit it is for, looked up once.
    let held: Vec<(HeldLease, Option<String>)> = guard_std::run::held()
        .into_iter()
        .map(|lease| {
            let owner = ready.owner(&lease.key);
            (lease, owner)
        })
        .collect();
    let leases: Vec<Value> = held
        .iter()
        .map(|(lease, owner)| {
            json!({
                "key": lease.key,
                "stored_as": ready.stored_key(&lease.key),
                "for": owner,
                "leading": lease.valid,
                "fence": lease.fence,
                "renew_deadline_in_ms": lease.renew_deadline_in.map(|d| d.as_millis() as u64),
            })
        })
        .collect();
    let endpoints: Vec<Value> = ready
        .links()
        .iter()
        .map(|(link, at_start)| {
            let unit = crate::reload::Unit::Endpoint(link.name().to_owned()).to_string();
            let lease = held
                .iter()
                .find(|(_, owner)| owner.as_deref() == Some(unit.as_str()))
                .map(|(lease, _)| lease);
            json!({
                "name": link.name(),
                "connected": Readiness::waiting_on(link, *at_start).is_none(),
                "failure": link.failure(),
                "lease": lease.map(|l| l.key.clone()),
                "lease_stored_as": lease.map(|l| ready.stored_key(&l.key)),
                "leading": lease.map(|l| l.valid),
                "fence": lease.and_then(|l| l.fence),
            })
        })
        .collect();
    let (sinks, dead_letters) = ready.storage(|storage| {
        let sinks: Vec<Value> = storage
            .queues
            .iter()
            .map(|(name, queued)| {
                let stats = queued.queue().stats();
                json!({
                    "name": name,
                    "queued": stats.pending,
                    "bytes": stats.bytes,
                    "max_bytes": stats.max_bytes,
                    "refused": queued.refused(),
                })
            })
            .collect();
        let dead_letters = storage
            .dead_letters
            .as_ref()
            .map(|store| match store.bytes() {
                Ok((bytes, max_bytes)) => json!({
                    "dir": store.dir().display().to_string(),
                    "bytes": bytes,
                    "max_bytes": max_bytes,
                }),
                Err(e) => json!({
                    "dir": store.dir().display().to_string(),
                    "error": e.to_string(),
                }),
            });
        (sinks, dead_letters)
    });
    let waiting = ready.check().err();
    json!({
        "ready": waiting.is_none(),
        "waiting": waiting,
        "leases": leases,
        "endpoints": endpoints,
        "sinks": sinks,
        "dead_letters": dead_letters,
    })
}

//! Metric names and recording helpers, through the `metrics` facade (any
//! exporter: Prometheus, statsd, ...).

use guard_core::breaker::{State, Transition};
use guard_core::guard::{DemoteReason, OnceEvent};

/// Requests admitted, by limiter `name`.
pub const RL_ALLOWED: &str = "guard_rl_allowed_total";
/// Requests refused, by limiter `name`.
pub const RL_DENIED: &str = "guard_rl_denied_total";
/// Keys an in-process limiter holds, by limiter `name`.
pub const RL_KEYS: &str = "guard_rl_keys";
/// The most keys an in-process limiter holds, by limiter `name`.
pub const RL_KEYS_CAPACITY: &str = "guard_rl_keys_capacity";
/// The most bytes an in-process limiter's table takes, keys' text
/// included, by limiter `name`: its byte budget.
pub const RL_MAX_BYTES: &str = "guard_rl_max_bytes";
/// Elements a rate-limiting sink dropped, by sink `name`.
pub const SINK_DROPPED: &str = "guard_sink_dropped_total";
/// A sink's queue on disk without room, by sink `name` and `outcome`:
/// `held_back`, each wait for room of a held-back sender (up to the
/// queue's `full_wait_ms` each; the source keeps the message meanwhile),
/// or `refused`, each message refused (dead-lettered).
pub const QUEUE_FULL: &str = "guard_queue_full_total";
/// Messages waiting in a sink's queue on disk, by sink `name`.
pub const QUEUE_PENDING: &str = "guard_queue_pending";
/// Bytes a sink's queue holds on disk, by sink `name`.
pub const QUEUE_BYTES: &str = "guard_queue_bytes";
/// A queue's bound in bytes, by `name`: with [`QUEUE_BYTES`], how near
/// full it is.
pub const QUEUE_MAX_BYTES: &str = "guard_queue_max_bytes";
/// Once-guard decisions, by `scope` and `outcome` (won, lost,
/// skipped_on_error, allowed_on_error, unguarded).
pub const ONCE_OUTCOMES: &str = "guard_once_total";
/// Planned slots this replica skipped though no other replica's claim
/// took them, by `job` and `reason` (backend_error, running_elsewhere,
/// run_lock).
pub const SLOTS_SKIPPED: &str = "guard_slots_skipped_total";
/// Active-guard transitions, by lease `key`, `transition` (promoted,
/// demoted) and demotion `reason`.
pub const ACTIVE_TRANSITIONS: &str = "guard_active_transitions_total";
/// 1 while this replica leads lease `key`, else 0.
pub const ACTIVE_LEADER: &str = "guard_active_leader";
/// Work an elected consumer refused because it arrived after its lease's
/// renew deadline (buffered across a pause), by lease `key`.
pub const ACTIVE_REFUSED_LATE: &str = "guard_active_refused_late_total";
/// Leaderships of lease `key` that ended on a lost lease (refused or
/// failed renewal, renew deadline passed) while their `on_promoted`
/// callback was still running, by lease `key`: the callback was told
/// through its `LeaseCheck`, and whatever it does until it returns is no
/// longer covered by the lease.
pub const ACTIVE_CALLBACK_OVERRUNS: &str = "guard_active_callback_overruns_total";
/// Messages an endpoint read and did not handle, by lease `key` and
/// `reason` (`queue_full`: its handler queue was full; `demoted`: queued
/// or read when leadership ended; `past_deadline`; `lease_lost`: the
/// lease ended during its handling; `gave_up`: retries spent with no
/// dead-letter destination); each also went to the endpoint's unhandled
/// sink, if it has one.
pub const ENDPOINT_DROPPED: &str = "guard_endpoint_dropped_total";
/// Subscriptions the server (or the network) closed under an endpoint
/// while it led, by lease `key`; what the server held for it is lost.
pub const ENDPOINT_DISCONNECTS: &str = "guard_endpoint_disconnects_total";
/// Dead letters held, by `topic`.
pub const DLQ_SIZE: &str = "guard_dlq_size";
/// What the dead letters of a queue bounded in bytes weigh, by `topic`.
pub const DLQ_BYTES: &str = "guard_dlq_bytes";
/// Calls made by retried operations, by `name`.
pub const RETRY_ATTEMPTS: &str = "guard_retry_attempts_total";
/// Calls through a circuit breaker, by breaker `name` and `outcome`
/// (`successful`, `failed`, `not_permitted`, `ignored`); each slow one
/// also in `slow`.
pub const BREAKER_CALLS: &str = "guard_breaker_calls_total";
/// 1 for a circuit breaker's current `state` (`closed`, `open`,
/// `half_open`, `disabled`, `forced_open`), 0 for the others, by breaker
/// `name`.
pub const BREAKER_STATE: &str = "guard_breaker_state";
/// A circuit breaker's moves, by breaker `name`, `from` and `to`.
pub const BREAKER_TRANSITIONS: &str = "guard_breaker_transitions_total";

/// Seconds a lock backend took to answer, by `op` and `outcome`:
/// `acquire` (`acquired`, `held_elsewhere`, `error`), `renew` (`held`,
/// `lost`, `error`) and `release` (`released`, `not_held`, `error`).
/// Every backend behind a [`SharedLocker`](crate::SharedLocker).
pub const LOCK_SECONDS: &str = "guard_lock_seconds";
/// Seconds a limiter whose keys live on a shared backend (Redis) took to
/// decide, by limiter `name` and `outcome` (`allowed`, `denied`,
/// `error`). In-process limiters decide in nanoseconds and are not timed.
pub const RL_DECISION_SECONDS: &str = "guard_rl_decision_seconds";
/// Seconds from a message's arrival at its handler to its end, retries
/// and their waits included, by `source` (a stream, queue, table, channel
/// or topic filter) and `outcome` (`handled`, `gave_up`).
pub const HANDLE_SECONDS: &str = "guard_handle_seconds";
/// Seconds a sink took to answer one send, by `sink` and `outcome`
/// (`ok`, or guard-endpoints' `SinkError::kind`: `transient`,
/// `permanent`, `stale_fence`, `held_back`).
pub const SINK_SEND_SECONDS: &str = "guard_sink_send_seconds";

/// Records one lock backend call in [`LOCK_SECONDS`].
pub fn record_lock_seconds(op: &'static str, outcome: &'static str, seconds: f64) {
    metrics::histogram!(LOCK_SECONDS, "op" => op, "outcome" => outcome).record(seconds);
}

/// Records a skipped slot of `job` in [`SLOTS_SKIPPED`].
pub fn record_slot_skipped(job: &str, reason: &'static str) {
    metrics::counter!(SLOTS_SKIPPED, "job" => job.to_owned(), "reason" => reason).increment(1);
}

/// Records a once-guard decision; use as (or inside) a `OnceObserver`.
pub fn record_once(event: &OnceEvent<'_>) {
    metrics::counter!(
        ONCE_OUTCOMES,
        "scope" => event.scope.to_owned(),
        "outcome" => event.outcome.name()
    )
    .increment(1);
}

/// Makes once-guard scope `scope` visible before its first decision:
/// `guard_once_total{scope, outcome}` at zero for the outcomes a working
/// guard has (won, lost).
pub fn record_once_scope(scope: &str) {
    for outcome in ["won", "lost"] {
        metrics::counter!(ONCE_OUTCOMES, "scope" => scope.to_owned(), "outcome" => outcome)
            .increment(0);
    }
}

/// Records a promotion of lease `key`.
pub fn record_promoted(key: &str) {
    metrics::counter!(ACTIVE_TRANSITIONS, "key" => key.to_owned(), "transition" => "promoted", "reason" => "")
        .increment(1);
    metrics::gauge!(ACTIVE_LEADER, "key" => key.to_owned()).set(1.0);
}

/// Records that this replica competes for lease `key` and does not lead
/// it yet: `guard_active_leader{key}` 0, and the transition family
/// present at zero, so a standby is visible before anything happens.
pub fn record_standby(key: &str) {
    metrics::gauge!(ACTIVE_LEADER, "key" => key.to_owned()).set(0.0);
    metrics::counter!(ACTIVE_REFUSED_LATE, "key" => key.to_owned()).increment(0);
    metrics::counter!(ACTIVE_CALLBACK_OVERRUNS, "key" => key.to_owned()).increment(0);
    metrics::counter!(ACTIVE_TRANSITIONS, "key" => key.to_owned(), "transition" => "promoted", "reason" => "")
        .increment(0);
}

/// Records work refused after the renew deadline of lease `key`.
pub fn record_refused_late(key: &str) {
    metrics::counter!(ACTIVE_REFUSED_LATE, "key" => key.to_owned()).increment(1);
}

/// Records a leadership of lease `key` lost while its `on_promoted`
/// callback was still running.
pub fn record_callback_overrun(key: &str) {
    metrics::counter!(ACTIVE_CALLBACK_OVERRUNS, "key" => key.to_owned()).increment(1);
}

/// Records a demotion of lease `key`.
pub fn record_demoted(key: &str, reason: DemoteReason) {
    let reason = match reason {
        DemoteReason::LeaseLost => "lease_lost",
        DemoteReason::RenewFailed => "renew_failed",
        DemoteReason::RenewDeadline => "renew_deadline",
        DemoteReason::PromoteFailed => "promote_failed",
        DemoteReason::Requested => "requested",
        DemoteReason::Stopping => "stopping",
    };
    metrics::counter!(ACTIVE_TRANSITIONS, "key" => key.to_owned(), "transition" => "demoted", "reason" => reason)
        .increment(1);
    metrics::gauge!(ACTIVE_LEADER, "key" => key.to_owned()).set(0.0);
}

/// Records the size of a dead-letter queue.
pub fn record_dlq_size(topic: &str, size: usize) {
    metrics::gauge!(DLQ_SIZE, "topic" => topic.to_owned()).set(size as f64);
}

/// Records what a dead-letter queue bounded in bytes holds, in bytes.
pub fn record_dlq_bytes(topic: &str, bytes: usize) {
    metrics::gauge!(DLQ_BYTES, "topic" => topic.to_owned()).set(bytes as f64);
}

/// Records the calls a retried operation made.
pub fn record_retry_attempts(name: &str, attempts: u32) {
    metrics::counter!(RETRY_ATTEMPTS, "name" => name.to_owned()).increment(u64::from(attempts));
}

/// Records one call through circuit breaker `name`: `outcome` is
/// `successful`, `failed`, `not_permitted` or `ignored`.
pub fn record_breaker_call(name: &str, outcome: &'static str, slow: bool) {
    metrics::counter!(BREAKER_CALLS, "name" => name.to_owned(), "outcome" => outcome).increment(1);
    if slow {
        metrics::counter!(BREAKER_CALLS, "name" => name.to_owned(), "outcome" => "slow")
            .increment(1);
    }
}

/// Records a move of circuit breaker `name`, and its state gauge.
pub fn record_breaker_transition(name: &str, transition: Transition) {
    metrics::counter!(
        BREAKER_TRANSITIONS,
        "name" => name.to_owned(),
        "from" => state_label(transition.from),
        "to" => state_label(transition.to)
    )
    .increment(1);
    record_breaker_state(name, transition.to);
}

/// Sets circuit breaker `name`'s state gauge to `state`.
pub fn record_breaker_state(name: &str, state: State) {
    for each in [
        State::Closed,
        State::Open,
        State::HalfOpen,
        State::Disabled,
        State::ForcedOpen,
    ] {
        let on = if each == state { 1.0 } else { 0.0 };
        metrics::gauge!(BREAKER_STATE, "name" => name.to_owned(), "state" => state_label(each))
            .set(on);
    }
}

/// A state as a metric label.
fn state_label(state: State) -> &'static str {
    match state {
        State::Closed => "closed",
        State::Open => "open",
        State::HalfOpen => "half_open",
        State::Disabled => "disabled",
        State::ForcedOpen => "forced_open",
        _ => "other",
    }
}

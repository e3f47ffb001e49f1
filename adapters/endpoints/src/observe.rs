//! A message's handling, observed ([`guard_std::observe`]): a span
//! `handle` at debug (`source`, `fence` if elected, `outcome`) and
//! `guard_handle_seconds{source, outcome}`, from its arrival at the
//! handler to its end, retries and their waits included.

use std::future::Future;

use guard_std::metrics::HANDLE_SECONDS;
use guard_std::observe::timed;
use tracing::field::Empty;

/// Runs `handling`, the handling of one message from `source` (a
/// configured stream, queue, table, channel pattern or topic filter:
/// a bounded label), read under `fence` if elected; `outcome` names how
/// it ended.
pub(crate) async fn handled<T>(
    source: &str,
    fence: Option<u64>,
    handling: impl Future<Output = T>,
    outcome: impl FnOnce(&T) -> &'static str,
) -> T {
    let span = tracing::debug_span!("handle", source, fence, outcome = Empty);
    let (output, seconds) = timed(&span, handling).await;
    let outcome = outcome(&output);
    span.record("outcome", outcome);
    metrics::histogram!(HANDLE_SECONDS, "source" => source.to_owned(), "outcome" => outcome)
        .record(seconds);
    output
}

/// The outcome of a handling that ends in a result: `handled` or
/// `gave_up`.
pub(crate) fn handled_or_gave_up<T, E>(result: &Result<T, E>) -> &'static str {
    if result.is_ok() { "handled" } else { "gave_up" }
}

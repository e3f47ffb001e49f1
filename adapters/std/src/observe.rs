//! Spans and latency histograms around the calls that leave the process
//! or take a message's time: a lock backend's acquire, renew and release
//! (on [`SharedLocker`](crate::SharedLocker), so every backend and every
//! guard built on it), a limiter's decision
//! ([`NamedRateLimiter`](crate::ratelimit::NamedRateLimiter)), and in
//! guard-endpoints a message's handling and a sink's send.
//!
//! Each call is one `tracing` span named for what it does, carrying what
//! it was about (`key`, the limiter's `name`, the `source` or `sink`) and,
//! once it is answered, its `outcome` (and the `fence` a lease was granted
//! or renewed under). The spans are at `info` for locks (a few a second)
//! and at `debug` for per-message work, so a filter at `info` keeps the
//! message path free of span bookkeeping. Without a tracing subscriber a
//! span costs one relaxed load; with the `log` feature of `tracing` (on
//! in this workspace) the events inside them still reach a `log` logger.
//!
//! The same calls are timed into histograms through the `metrics` facade
//! (names in [`crate::metrics`], all in seconds, bucket bounds in
//! [`SECONDS_BUCKETS`]); labels are bounded (an operation and an outcome,
//! a limiter's, source's or sink's configured name), never a lease key,
//! since once-guard keys are one per slot or per delivery.
//!
//! ```
//! use guard_std::observe::timed;
//!
//! let span = tracing::debug_span!("work", outcome = tracing::field::Empty);
//! let (answer, seconds) = futures_lite::future::block_on(timed(&span, async { 42 }));
//! span.record("outcome", "done");
//! assert_eq!(answer, 42);
//! assert!(seconds >= 0.0);
//! ```

use std::future::Future;
use std::time::Instant;

use tracing::Instrument as _;
use tracing::Span;

/// Bucket bounds, in seconds, for every `guard_*_seconds` histogram: from
/// half a millisecond (a Redis round trip on loopback) to ten seconds (a
/// sink at its timeout).
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Runs `call` inside `span` and returns its output with the seconds it
/// took, for the caller to record the outcome on the span and in its
/// histogram.
pub async fn timed<T>(span: &Span, call: impl Future<Output = T>) -> (T, f64) {
    let started = Instant::now();
    let output = call.instrument(span.clone()).await;
    (output, started.elapsed().as_secs_f64())
}

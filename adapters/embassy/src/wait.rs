//! Waiting until a limiter admits, on embassy-time: guard-core's
//! `limit::wait` for any of its limiters on a device.

use guard_core::limit::Report;
use guard_core::limit::wait::{Line, WaitError};
use guard_core::retry::RandomSource;
use guard_core::time::Instant;

use embassy_sync::blocking_mutex::raw::RawMutex;

use crate::time::{now, to_core};

/// Waits in `line` until `decide` admits, sleeping on embassy-time for
/// each refusal's retry time (plus up to 1/16 of jitter from `random`; a
/// hardware RNG, or `WithoutRandom` for none), until `deadline`.
///
/// `decide` makes one decision at the instant it is given, for example
/// `|now| bucket.check_n(cost, now)` on an `AtomicTokenBucket` or
/// `|now| table.check_n(&key, cost, now)` on a `SharedKeyed`. Waiters in
/// one line are admitted in arrival order; dropping the future leaves the
/// line. Every guarantee is listed in guard-core's `limit::wait`.
///
/// ```no_run
/// # async fn example() {
/// use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
/// use guard_core::limit::wait::Line;
/// use guard_core::limit::{AtomicTokenBucket, Rate, TokenBucket};
/// use guard_core::retry::WithoutRandom;
///
/// static UPLINK: AtomicTokenBucket = AtomicTokenBucket::new(
///     match TokenBucket::new(5, Rate::per_second(5)) {
///         Ok(bucket) => bucket,
///         Err(_) => panic!("invalid bucket"),
///     },
/// );
/// static LINE: Line<CriticalSectionRawMutex, 8> = Line::new();
///
/// let sent = guard_embassy::until_admitted(&LINE, |now| UPLINK.check_n(1, now), None, &mut WithoutRandom).await;
/// # }
/// ```
pub async fn until_admitted<M, const N: usize, E>(
    line: &Line<M, N>,
    mut decide: impl FnMut(Instant) -> Result<Report, E>,
    deadline: Option<embassy_time::Instant>,
    random: &mut impl RandomSource,
) -> Result<Report, WaitError<E>>
where
    M: RawMutex,
{
    guard_core::limit::wait::until_admitted(
        line,
        || core::future::ready(decide(now())),
        &mut embassy_time::Delay,
        now,
        deadline.map(to_core),
        random,
    )
    .await
}

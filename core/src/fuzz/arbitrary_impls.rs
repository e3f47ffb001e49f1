//! `Arbitrary` for the types whose values have a rule: drawn through their
//! constructors, so a fuzzer never builds one the library would refuse.
//! (The others derive it beside their definitions.)

use core::time::Duration;

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::guard::ActiveConfig;
use crate::lock::Ttl;
use crate::slot::Every;

/// The longest TTL and slot period drawn: a day (longer ones behave alike
/// and only slow a harness down).
const DAY_MS: u64 = 86_400_000;

impl<'a> Arbitrary<'a> for Ttl {
    /// 1 ms to a day.
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let ms = u.int_in_range(1..=DAY_MS)?;
        Ok(Ttl::from_valid(Duration::from_millis(ms)))
    }
}

impl<'a> Arbitrary<'a> for Every {
    /// 1 ms to a day.
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let ms = u.int_in_range(1..=DAY_MS)?;
        Every::new(Duration::from_millis(ms)).map_err(|_| arbitrary::Error::IncorrectFormat)
    }
}

impl<'a> Arbitrary<'a> for ActiveConfig {
    /// A TTL of 1 ms to a day, an interval of 1 ms up to the TTL and a
    /// drift margin (or the default) up to the TTL: mostly timings that
    /// validate, some that do not (an interval above a third of the TTL,
    /// a margin that leaves no time to renew).
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let ttl_ms = u.int_in_range(1..=DAY_MS)?;
        let interval_ms = u.int_in_range(1..=ttl_ms)?;
        let mut config = ActiveConfig::new()
            .with_ttl(Ttl::from_valid(Duration::from_millis(ttl_ms)))
            .with_interval(Duration::from_millis(interval_ms));
        if bool::arbitrary(u)? {
            let drift_ms = u.int_in_range(0..=ttl_ms)?;
            config = config.with_drift(Duration::from_millis(drift_ms));
        }
        Ok(config)
    }
}

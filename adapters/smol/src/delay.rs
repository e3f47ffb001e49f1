//! An `embedded_hal_async` delay on `async-io` timers.

use std::time::Duration;

/// `embedded_hal_async::delay::DelayNs` on `async-io` timers, so
/// guard-core's async retry executor and `LockerExt::lock` run on servers.
#[derive(Clone, Copy, Debug, Default)]
pub struct TimerDelay;

impl embedded_hal_async::delay::DelayNs for TimerDelay {
    async fn delay_ns(&mut self, ns: u32) {
        async_io::Timer::after(Duration::from_nanos(u64::from(ns))).await;
    }

    async fn delay_us(&mut self, us: u32) {
        async_io::Timer::after(Duration::from_micros(u64::from(us))).await;
    }

    async fn delay_ms(&mut self, ms: u32) {
        async_io::Timer::after(Duration::from_millis(u64::from(ms))).await;
    }
}

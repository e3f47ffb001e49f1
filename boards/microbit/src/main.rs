//! guard on a Cortex-M0 (QEMU `microbit`, nRF51822): a core without
//! compare-and-swap, so the shared atomic bucket runs on a critical
//! section (guard-core's `critical-section` feature). The checks are
//! guard-firmware-checks' (`boards/checks`), shared with the RISC-V
//! board; their results go out through semihosting, and a failed check
//! panics and `panic-semihosting` exits QEMU with status 1, so `cargo run
//! --release` here is a test.

#![no_std]
#![no_main]

use cortex_m_rt::entry;
use cortex_m_semihosting::{debug, hio};
use panic_semihosting as _;

/// Discards what it is given: the checks still run without a host.
struct Nowhere;

impl core::fmt::Write for Nowhere {
    fn write_str(&mut self, _: &str) -> core::fmt::Result {
        Ok(())
    }
}

#[entry]
fn main() -> ! {
    match hio::hstdout() {
        Ok(mut host) => guard_firmware_checks::run_all(&mut host),
        Err(()) => guard_firmware_checks::run_all(&mut Nowhere),
    }
    debug::exit(debug::EXIT_SUCCESS);
    loop {
        cortex_m::asm::wfi();
    }
}

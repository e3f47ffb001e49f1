//! guard on a RISC-V core (QEMU `virt`, rv32imc code as on the ESP32-C3
//! class): no atomic instructions, so the shared atomic bucket runs on a
//! critical section (guard-core's `critical-section` feature, one hart).
//! The checks are guard-firmware-checks' (`boards/checks`), the same as
//! the Cortex-M0's; their results go out through semihosting, and a
//! failed check panics and exits QEMU with status 1, so `cargo run
//! --release` here is a test.

#![no_std]
#![no_main]

use core::fmt::Write as _;
use core::panic::PanicInfo;

use riscv_semihosting::{debug, hio};

/// Discards what it is given: the checks still run without a host.
struct Nowhere;

impl core::fmt::Write for Nowhere {
    fn write_str(&mut self, _: &str) -> core::fmt::Result {
        Ok(())
    }
}

#[riscv_rt::entry]
fn main() -> ! {
    match hio::hstdout() {
        Ok(mut host) => guard_firmware_checks::run_all(&mut host),
        Err(()) => guard_firmware_checks::run_all(&mut Nowhere),
    }
    debug::exit(debug::EXIT_SUCCESS);
    loop {
        riscv::asm::wfi();
    }
}

/// A failed check: its message to the host, then QEMU exits with 1.
#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    if let Ok(mut host) = hio::hstderr() {
        let _ = writeln!(host, "{info}");
    }
    debug::exit(debug::EXIT_FAILURE);
    loop {
        riscv::asm::wfi();
    }
}

//! `footprint`: what guard-core costs in flash and RAM, for the four parts
//! an MCU gateway needs first (guard-firmware-footprint's `decide`, shared
//! with the RISC-V board): a token bucket behind a `Limiter`, retry
//! backoff, the dead-letter queue and the `ActiveGuard` state machine.
//! No formatting (the panic handler formats nothing), no test harness, no
//! executor. The test script prints its size beside `empty`'s; a wrong
//! decision exits 1.

#![no_std]
#![no_main]

use cortex_m_rt::entry;
use cortex_m_semihosting::debug;

#[entry]
fn main() -> ! {
    if !guard_firmware_footprint::decide() {
        debug::exit(debug::EXIT_FAILURE);
    }
    debug::exit(debug::EXIT_SUCCESS);
    loop {
        cortex_m::asm::wfi();
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    debug::exit(debug::EXIT_FAILURE);
    loop {
        cortex_m::asm::wfi();
    }
}

//! `footprint`: what guard-core costs in flash and RAM on this core, for
//! the four parts an MCU gateway needs first (guard-firmware-footprint's
//! `decide`, the same as the Cortex-M4F's). No formatting, no executor.
//! The test script prints its size beside `empty`'s; a wrong decision
//! exits 1.

#![no_std]
#![no_main]

use riscv_semihosting::debug;

#[riscv_rt::entry]
fn main() -> ! {
    if !guard_firmware_footprint::decide() {
        debug::exit(debug::EXIT_FAILURE);
    }
    debug::exit(debug::EXIT_SUCCESS);
    loop {
        riscv::asm::wfi();
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    debug::exit(debug::EXIT_FAILURE);
    loop {
        riscv::asm::wfi();
    }
}

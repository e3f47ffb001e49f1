//! `empty`: the board's smallest image (riscv-rt's start-up, an exit
//! through semihosting, a panic handler that formats nothing), the
//! baseline `footprint` is measured against.

#![no_std]
#![no_main]

use riscv_semihosting::debug;

#[riscv_rt::entry]
fn main() -> ! {
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

//! `footprint-outbox`: what the dead-letter queue on flash costs, beside
//! `footprint` and `empty`: guard-embassy's `FlashDeadLetterQueue` (over
//! sequential-storage) storing, reading back and removing one failed
//! element on the PSRAM flash. The queue is a `static`, so its RAM counts
//! in the image's static RAM. No formatting, no executor; a wrong answer
//! exits 1.

#![no_std]
#![no_main]

use core::hint::black_box;

use cortex_m_rt::entry;
use cortex_m_semihosting::debug;
use embassy_futures::block_on;
use guard_core::dlq::FailedElement;
use guard_core::time::Instant;
use guard_embassy::flash::FlashDeadLetterQueue;
use guard_firmware_mps2::psram_flash::{PAGE, PsramFlash};
use static_cell::StaticCell;

/// Four pages; failed elements of up to 48 bytes, as `outbox` stores.
type Outbox = FlashDeadLetterQueue<PsramFlash, heapless::Vec<u8, 8>, heapless::String<16>, 48>;

static OUTBOX: StaticCell<Outbox> = StaticCell::new();

fn run() -> Option<bool> {
    // SAFETY: the first 4 KiB of PSRAM are this flash's alone.
    let flash = unsafe { PsramFlash::new(0, 4 * PAGE) };
    let outbox = OUTBOX.init(Outbox::new(flash, 0..4 * PAGE as u32).ok()?);
    block_on(outbox.clear()).ok()?;
    let element = heapless::Vec::from_slice(&black_box([1, 2, 3])).ok()?;
    let failed = FailedElement::new(element, None, black_box(3), Instant::from_millis(7));
    block_on(outbox.push(failed.clone())).ok()?;
    let back = block_on(outbox.poll()).ok()??;
    Some(back == failed && block_on(outbox.is_empty()).ok()?)
}

#[entry]
fn main() -> ! {
    if run() != Some(true) {
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

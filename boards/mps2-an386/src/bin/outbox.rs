//! `outbox`: guard-embassy's dead-letter queue on flash, across two power
//! cuts on target.
//!
//! The flash is 4 KiB of the board's PSRAM (four pages of 1 KiB), which a
//! system reset leaves as it was. The image boots three times in one QEMU
//! run:
//!
//! 1. On a cold start it erases the flash, stores ten failed elements,
//!    hands three on (polled: acknowledged), then the power goes in the
//!    middle of the next store (half a word written) and the board resets.
//! 2. It finds the seven acknowledged, oldest first, each as stored (and
//!    the cut one whole or not at all), then stores and hands on until a
//!    page must be erased, and the power goes in the middle of the erase.
//! 3. It finds what was acknowledged again, stores and hands on more, and
//!    exits 0; any difference panics, and QEMU exits 1.
//!
//! What was acknowledged is kept outside the flash, in a record of its own
//! in PSRAM that the queue never touches: the test's memory, not the
//! device's.

#![no_std]
#![no_main]

use core::ptr::{read_volatile, write_volatile};

use cortex_m_rt::entry;
use cortex_m_semihosting::{debug, hprintln};
use embassy_futures::block_on;
use guard_core::dlq::FailedElement;
use guard_core::time::Instant;
use guard_embassy::flash::FlashDeadLetterQueue;
use guard_firmware_mps2::psram_flash::{Cut, PAGE, PSRAM, PsramFlash};
use heapless::{String, Vec};
use panic_semihosting as _;

/// The queue's flash: the first four pages of PSRAM.
const FLASH_LEN: usize = 4 * PAGE;
/// The test's memory, past the flash.
const MEMORY: usize = PSRAM + 64 * 1024;
/// Marks memory written by this image (PSRAM is zero at power-on).
const MAGIC: u32 = 0x6775_6172; // "guar"

type Element = Vec<u8, 8>;
type Error = String<16>;
type Failed = FailedElement<Element, Error>;
type Outbox = FlashDeadLetterQueue<PsramFlash, Element, Error, 48>;

/// What the test remembers across resets: which ids were acknowledged.
#[derive(Clone, Copy)]
#[repr(u32)]
enum Word {
    Magic = 0,
    /// The boot (1, 2, 3) the next start is.
    Boot,
    /// The next id to store: every id below it was stored (acknowledged).
    Next,
    /// The oldest id not handed on: every id below it was polled.
    Oldest,
    /// 1 while a store runs, 2 while a poll runs, 0 otherwise.
    InFlight,
}

const STORING: u32 = 1;
const POLLING: u32 = 2;

fn load(word: Word) -> u32 {
    // SAFETY: PSRAM past the flash, used by this image alone.
    unsafe { read_volatile((MEMORY as *const u32).add(word as usize)) }
}

fn store(word: Word, value: u32) {
    // SAFETY: as in `load`.
    unsafe { write_volatile((MEMORY as *mut u32).add(word as usize), value) }
}

/// Failed element `id`: its bytes, an error naming it, `id` attempts.
fn failed(id: u32) -> Failed {
    let mut error = Error::new();
    let _ = core::fmt::write(&mut error, format_args!("refused {id}"));
    let mut element = Element::new();
    let _ = element.extend_from_slice(&id.to_le_bytes());
    let _ = element.extend_from_slice(&[id as u8 ^ 0x5A; 3]);
    FailedElement::new(
        element,
        Some(error),
        id,
        Instant::from_millis(u64::from(id)),
    )
}

fn stored_id(f: &Failed) -> u32 {
    let id = u32::from_le_bytes([
        f.element()[0],
        f.element()[1],
        f.element()[2],
        f.element()[3],
    ]);
    assert!(
        *f == failed(id),
        "element {id} read back is not what was stored"
    );
    id
}

/// Stores the next id; `false` if the queue is full.
fn store_next(outbox: &mut Outbox) -> bool {
    let id = load(Word::Next);
    store(Word::InFlight, STORING);
    let stored = block_on(outbox.push(failed(id))).is_ok();
    store(Word::InFlight, 0);
    if stored {
        store(Word::Next, id + 1);
    }
    stored
}

/// Hands the oldest on (polls it) and checks it is the oldest id.
fn poll_oldest(outbox: &mut Outbox) {
    store(Word::InFlight, POLLING);
    let oldest = block_on(outbox.poll())
        .expect("the flash reads")
        .expect("an element");
    store(Word::InFlight, 0);
    let id = stored_id(&oldest);
    assert_eq!(id, load(Word::Oldest), "the oldest comes first");
    store(Word::Oldest, id + 1);
}

/// Checks what the flash holds after a cut against what was acknowledged,
/// and takes in whatever the cut operation got done.
fn check_after_cut(outbox: &mut Outbox) -> usize {
    let (oldest, next, in_flight) = (load(Word::Oldest), load(Word::Next), load(Word::InFlight));
    let mut ids: Vec<u32, 64> = Vec::new();
    let mut f = |bytes: &[u8]| {
        use guard_embassy::flash::FlashRecord;
        let failed = Failed::decode(bytes).expect("every record read back decodes");
        ids.push(stored_id(&failed)).expect("at most 64");
    };
    block_on(outbox.queue().for_each(&mut f)).expect("the flash reads");
    let first = ids.first().copied().unwrap_or(next);
    let last = ids.last().map_or(first, |id| id + 1);
    // Contiguous, from the oldest acknowledged (or the one after, if the
    // cut poll got done) to the newest (or one more, if the cut store
    // got done).
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "in order: {ids:?}"
    );
    let popped_ok = first == oldest || (in_flight == POLLING && first == oldest + 1);
    let pushed_ok = last == next || (in_flight == STORING && last == next + 1);
    assert!(
        popped_ok && pushed_ok,
        "acknowledged {oldest}..{next} ({in_flight} in flight), found {ids:?}"
    );
    store(Word::Oldest, first);
    store(Word::Next, last);
    store(Word::InFlight, 0);
    ids.len()
}

#[entry]
fn main() -> ! {
    // SAFETY: the first 4 KiB of PSRAM are this flash's alone.
    let flash = unsafe { PsramFlash::new(0, FLASH_LEN) };
    let mut outbox = Outbox::new(flash, 0..FLASH_LEN as u32).expect("a valid flash range");
    if load(Word::Magic) != MAGIC {
        block_on(outbox.clear()).expect("the flash erases");
        store(Word::Next, 0);
        store(Word::Oldest, 0);
        store(Word::InFlight, 0);
        store(Word::Boot, 1);
        store(Word::Magic, MAGIC);
    }
    match load(Word::Boot) {
        1 => {
            for _ in 0..10 {
                assert!(store_next(&mut outbox), "room for ten");
            }
            for _ in 0..3 {
                poll_oldest(&mut outbox);
            }
            hprintln!(
                "outbox: boot 1 stored 10 and handed on 3; the power goes while storing the next"
            );
            store(Word::Boot, 2);
            // The record's header is two words: the cut falls in its data.
            outbox_flash(&mut outbox).cut(Cut::AtWrite(3));
            store_next(&mut outbox);
            panic!("the power cut did not happen");
        }
        2 => {
            let held = check_after_cut(&mut outbox);
            hprintln!(
                "outbox: boot 2 found the {held} acknowledged, in order; the power goes in a page erase"
            );
            store(Word::Boot, 3);
            outbox_flash(&mut outbox).cut(Cut::AtErase);
            // Keep five stored while the pages fill, until one is erased.
            for _ in 0..10_000 {
                if !store_next(&mut outbox) || load(Word::Next) - load(Word::Oldest) > 5 {
                    poll_oldest(&mut outbox);
                }
            }
            panic!("no page was erased");
        }
        3 => {
            let held = check_after_cut(&mut outbox);
            for _ in 0..40 {
                if !store_next(&mut outbox) {
                    poll_oldest(&mut outbox);
                }
                poll_oldest(&mut outbox);
            }
            while load(Word::Oldest) < load(Word::Next) {
                poll_oldest(&mut outbox);
            }
            assert!(block_on(outbox.is_empty()).expect("the flash reads"));
            hprintln!(
                "outbox: boot 3 found the {held} acknowledged, in order; {} stored in all",
                load(Word::Next)
            );
            store(Word::Magic, 0);
            debug::exit(debug::EXIT_SUCCESS);
        }
        boot => panic!("boot {boot}?"),
    }
    loop {
        cortex_m::asm::wfi();
    }
}

fn outbox_flash(outbox: &mut Outbox) -> &mut PsramFlash {
    outbox.queue().flash()
}

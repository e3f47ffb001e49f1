//! An embassy-time driver for QEMU's MPS2 boards, which have no HAL.
//!
//! The time is read from a free-running counter: the board's first CMSDK
//! APB timer (0x4000_0000), counting down from `u32::MAX` at the 25 MHz
//! peripheral clock and extended to 64 bits in software. SysTick only
//! wakes: it interrupts once per tick (1 kHz) and hands the timer queue
//! the counter's time, so a timer fires within one tick after its
//! instant, never before.
//!
//! Why not count SysTick interrupts: an interrupt that comes late (the
//! emulator, or a long critical section, delays it past the next one) is
//! a tick lost for good, and the clock falls behind true time. Measured
//! under QEMU on a loaded host: 4 to 10 %, enough for a replica's slots to
//! run seconds late, past the slot lock's retention, and twice. The
//! counter keeps counting whatever the interrupts do.

use core::cell::RefCell;
use core::ptr;
use core::task::Waker;

use cortex_m::peripheral::SYST;
use cortex_m::peripheral::syst::SystClkSource;
use cortex_m_rt::exception;
use critical_section::{CriticalSection, Mutex};
use embassy_time_driver::Driver;
use embassy_time_queue_utils::Queue;

/// The MPS2-AN386 core and peripheral clock as QEMU models it.
const CORE_HZ: u32 = 25_000_000;
/// The first CMSDK APB timer's registers.
const TIMER0: usize = 0x4000_0000;
const TIMER_CTRL: usize = 0x0;
const TIMER_VALUE: usize = 0x4;
const TIMER_RELOAD: usize = 0x8;
const TIMER_ENABLE: u32 = 1;

fn timer_read(offset: usize) -> u32 {
    // SAFETY: TIMER0's register block on the MPS2 boards; this driver is
    // its only user; the offsets are its 4-aligned registers.
    unsafe { ptr::read_volatile((TIMER0 + offset) as *const u32) }
}

fn timer_write(offset: usize, value: u32) {
    // SAFETY: as in `timer_read`.
    unsafe { ptr::write_volatile((TIMER0 + offset) as *mut u32, value) }
}

/// The counter, extended past its 32 bits.
struct Counter {
    /// Counts since `init` at the last read (up-counting).
    last: u32,
    /// Whole wraps of the 32-bit counter since `init`.
    wraps: u64,
}

impl Counter {
    /// Peripheral-clock counts since `init`. Called at least once per wrap
    /// (172 s): every SysTick interrupt reads it.
    fn read(&mut self) -> u64 {
        let now = u32::MAX - timer_read(TIMER_VALUE);
        if now < self.last {
            self.wraps += 1;
        }
        self.last = now;
        (self.wraps << 32) | u64::from(now)
    }
}

struct CounterDriver {
    counter: Mutex<RefCell<Counter>>,
    queue: Mutex<RefCell<Queue>>,
}

impl CounterDriver {
    fn now_in(&self, cs: CriticalSection<'_>) -> u64 {
        let counts = self.counter.borrow_ref_mut(cs).read();
        counts / u64::from(CORE_HZ / embassy_time_driver::TICK_HZ as u32)
    }
}

impl Driver for CounterDriver {
    fn now(&self) -> u64 {
        critical_section::with(|cs| self.now_in(cs))
    }

    fn schedule_wake(&self, at: u64, waker: &Waker) {
        // An instant already past is woken by the next tick, one tick late
        // at most: the queue is only ever drained from the interrupt.
        critical_section::with(|cs| {
            self.queue.borrow_ref_mut(cs).schedule_wake(at, waker);
        });
    }
}

embassy_time_driver::time_driver_impl!(static DRIVER: CounterDriver = CounterDriver {
    counter: Mutex::new(RefCell::new(Counter { last: 0, wraps: 0 })),
    queue: Mutex::new(RefCell::new(Queue::new())),
});

/// Starts the counter and the tick: call once, before anything reads the
/// time.
pub fn init(mut syst: SYST) {
    timer_write(TIMER_CTRL, 0);
    timer_write(TIMER_RELOAD, u32::MAX);
    timer_write(TIMER_VALUE, u32::MAX);
    timer_write(TIMER_CTRL, TIMER_ENABLE);

    let per_tick = CORE_HZ / embassy_time_driver::TICK_HZ as u32;
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(per_tick - 1);
    syst.clear_current();
    syst.enable_counter();
    syst.enable_interrupt();
}

#[exception]
fn SysTick() {
    critical_section::with(|cs| {
        let now = DRIVER.now_in(cs);
        DRIVER.queue.borrow_ref_mut(cs).next_expiration(now);
    });
}

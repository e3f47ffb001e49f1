//! The board's network as the networked images start it: the LAN9118 on
//! its interrupt line, embassy-net with the static address of the
//! command line, and a seed for what must differ between boards and
//! boots. An image defines the interrupt handler with
//! [`ethernet_interrupt!`](crate::ethernet_interrupt) and reports what ends
//! it with [`fail`].

use core::hash::{BuildHasher, Hasher};

use cortex_m::interrupt::InterruptNumber;
use cortex_m::peripheral::NVIC;
use cortex_m_semihosting::{nr, syscall1};
use embassy_executor::Spawner;
use embassy_net::{Ipv4Cidr, Stack, StackResources, StaticConfigV4};
use static_cell::StaticCell;

use crate::args::Args;
use crate::lan9118::{Lan9118, Lan9118Error, MPS2_BASE, MPS2_IRQ};

/// The controller's interrupt line, for the NVIC.
#[derive(Clone, Copy)]
struct EthernetIrq;

// SAFETY: 13 is the LAN9118's line on this board, a valid external
// interrupt number of the Cortex-M4's NVIC.
unsafe impl InterruptNumber for EthernetIrq {
    fn number(self) -> u16 {
        MPS2_IRQ
    }
}

static RESOURCES: StaticCell<StackResources<4>> = StaticCell::new();

/// Defines the image's `DefaultHandler`: no device crate names this
/// board's interrupts, so every external interrupt lands there, and only
/// the controller's is enabled. (A handler must be defined in the image
/// itself for the linker to take it over the default.)
#[macro_export]
macro_rules! ethernet_interrupt {
    () => {
        #[cortex_m_rt::exception]
        unsafe fn DefaultHandler(irqn: i16) {
            if irqn == $crate::lan9118::MPS2_IRQ as i16 {
                $crate::lan9118::Lan9118::on_interrupt();
            } else {
                panic!("unexpected interrupt {irqn}");
            }
        }
    };
}

/// What a networked image does first: takes the core peripherals, starts
/// the time driver on SysTick and reads its settings from the command
/// line into `line`; a bad command line ends `image` ([`fail`]).
pub fn boot(image: &str, line: &'static mut [u8; crate::args::MAX_CMDLINE]) -> Args<'static> {
    let Some(peripherals) = cortex_m::Peripherals::take() else {
        panic!("core peripherals taken twice");
    };
    crate::time_driver::init(peripherals.SYST);
    let line = crate::args::cmdline(line).unwrap_or_else(|e| fail(image, "command line", &e));
    Args::parse(line).unwrap_or_else(|e| fail(image, "command line", &e))
}

/// Prints `image: what: error` through semihosting and exits 1.
pub fn fail(image: &str, what: &str, error: &dyn core::fmt::Display) -> ! {
    cortex_m_semihosting::hprintln!("{image}: {what}: {error}");
    cortex_m_semihosting::debug::exit(cortex_m_semihosting::debug::EXIT_FAILURE);
    // Semihosting exit does not return under QEMU; on a probe it might.
    loop {
        cortex_m::asm::wfi();
    }
}

/// Seeds token ids, TCP sequence numbers and a TLS client's randomness:
/// the board has no random source, so the MAC (unique on the link), the
/// name and the host's time at boot (seconds and centiseconds, through
/// semihosting) are mixed. Not secret: a board with a TRNG seeds from it.
pub fn seed(mac: [u8; 6], name: &str) -> u64 {
    let (time, clock) = host_time();
    let mut hasher = foldhash::fast::FixedState::with_seed(0x6775_6172_6400_0000).build_hasher();
    hasher.write(&mac);
    hasher.write(name.as_bytes());
    hasher.write_usize(time);
    hasher.write_usize(clock);
    hasher.finish()
}

/// The host's time through semihosting: seconds, and centiseconds since
/// the emulator started.
fn host_time() -> (usize, usize) {
    // SAFETY: SYS_TIME and SYS_CLOCK take no argument block.
    unsafe { (syscall1(nr::TIME, 0), syscall1(nr::CLOCK, 0)) }
}

/// Seeds a TLS client's randomness, from the same inputs as [`seed`] but
/// through SHA-256 under a label of its own, so that nothing the wire or
/// Redis shows (TCP sequence numbers, lock tokens, made from [`seed`])
/// gives it away. Not secret either: the inputs are few and guessable,
/// which is why a board with a TRNG seeds TLS from it.
pub fn tls_seed(mac: [u8; 6], name: &str) -> [u8; 32] {
    use sha2::Digest as _;
    let (time, clock) = host_time();
    let mut hash = sha2::Sha256::new();
    hash.update(b"guard tls seed\0");
    hash.update(mac);
    hash.update(name.as_bytes());
    hash.update(time.to_le_bytes());
    hash.update(clock.to_le_bytes());
    hash.finalize().into()
}

#[embassy_executor::task]
async fn net(mut runner: embassy_net::Runner<'static, Lan9118>) -> ! {
    runner.run().await
}

/// The network, up with `args`' address, the seed ([`seed`]) and the
/// controller's MAC.
///
/// # Safety
///
/// Called once, by the image that owns the board's one LAN9118, with its
/// `DefaultHandler` in place.
pub async unsafe fn start(
    spawner: Spawner,
    args: &Args<'_>,
) -> Result<(Stack<'static>, u64, [u8; 6]), Lan9118Error> {
    // SAFETY: the board's one LAN9118, driven only from here (the
    // caller's promise).
    let device = unsafe { Lan9118::new(MPS2_BASE) }?;
    let mac = device.mac();
    // SAFETY: the handler is in place (the caller's promise); unmasking
    // cannot break a critical section, none is open here.
    unsafe { NVIC::unmask(EthernetIrq) };
    let config = embassy_net::Config::ipv4_static(StaticConfigV4 {
        address: Ipv4Cidr::new(args.ip, args.prefix),
        gateway: None,
        dns_servers: heapless::Vec::new(),
    });
    let seed = seed(mac, args.name);
    let (stack, runner) =
        embassy_net::new(device, config, RESOURCES.init(StackResources::new()), seed);
    spawner.spawn(net(runner).unwrap_or_else(|_| panic!("network task spawned twice")));
    stack.wait_config_up().await;
    Ok((stack, seed, mac))
}

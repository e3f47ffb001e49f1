//! An `embassy-net-driver` for the SMSC LAN9118 Ethernet controller, as
//! the MPS2 boards carry it (QEMU's `mps2-an386` maps it at 0x4020_0000 on
//! interrupt 13).
//!
//! The controller keeps frames in on-chip FIFOs reached through 32-bit
//! registers, so the driver copies each frame once, between a FIFO and one
//! frame buffer of its own each way; it needs no DMA descriptors and no
//! allocator. Receiving is interrupt-driven: [`Lan9118::on_interrupt`]
//! (called from the board's handler for the controller's line) masks the
//! controller's interrupt and wakes the network task, which reads every
//! waiting frame and unmasks it again before it sleeps, so a frame that
//! arrives in between still raises the line (no lost wake-up).
//!
//! Register layout and bit meanings: the LAN9118 datasheet (SMSC,
//! rev. 1.5), sections 5.3 (system CSRs) and 5.4 (MAC CSRs); only
//! registers QEMU's model implements are touched (any other access aborts
//! the emulator).

use core::ptr;
use core::sync::atomic::{AtomicUsize, Ordering};
use core::task::Context;

use embassy_net_driver::{Capabilities, HardwareAddress, LinkState};
use embassy_sync::waitqueue::AtomicWaker;

/// The controller's registers on the MPS2 boards.
pub const MPS2_BASE: usize = 0x4020_0000;
/// The controller's interrupt line on `mps2-an386` (and AN385).
pub const MPS2_IRQ: u16 = 13;

/// The largest frame the driver moves: 1514 bytes of Ethernet frame (no
/// FCS), rounded up to whole FIFO words.
const FRAME: usize = 1516;

// System control and status registers (byte offsets).
const RX_DATA_FIFO: usize = 0x00;
const TX_DATA_FIFO: usize = 0x20;
const RX_STATUS_FIFO: usize = 0x40;
const TX_STATUS_FIFO: usize = 0x48;
const ID_REV: usize = 0x50;
const IRQ_CFG: usize = 0x54;
const INT_STS: usize = 0x58;
const INT_EN: usize = 0x5c;
const BYTE_TEST: usize = 0x64;
const RX_CFG: usize = 0x6c;
const TX_CFG: usize = 0x70;
const HW_CFG: usize = 0x74;
const RX_FIFO_INF: usize = 0x7c;
const TX_FIFO_INF: usize = 0x80;
const MAC_CSR_CMD: usize = 0xa4;
const MAC_CSR_DATA: usize = 0xa8;

/// BYTE_TEST reads this on a LAN9118 whatever the bus's byte order.
const BYTE_TEST_VALUE: u32 = 0x8765_4321;
/// ID_REV's chip id (upper half) for the LAN9118 family.
const CHIP_ID: u32 = 0x0118;

// IRQ_CFG: the line enabled, active high, push-pull.
const IRQ_EN: u32 = 1 << 8;
const IRQ_POL: u32 = 1 << 4;
const IRQ_TYPE: u32 = 1 << 0;
// INT_STS / INT_EN: the RX status FIFO holds more entries than its level.
const RSFL_INT: u32 = 1 << 3;
// HW_CFG: soft reset (self-clearing).
const HW_CFG_SRST: u32 = 1 << 0;
// TX_CFG: transmitter on.
const TX_CFG_TX_ON: u32 = 1 << 1;
// RX_CFG: empty the RX data and status FIFOs (self-clearing).
const RX_DUMP: u32 = 1 << 15;
/// The longest frame the FIFO holds, with its FCS, in words (2 KiB).
const MAX_FIFO_FRAME_WORDS: usize = 2048 / 4;
// TX command A: first and last segment of a frame (one segment each).
const TX_CMD_A_FIRST: u32 = 1 << 13;
const TX_CMD_A_LAST: u32 = 1 << 12;
// RX status: frame length (incl. FCS) and the error summary bit.
const RX_STS_LENGTH_SHIFT: u32 = 16;
const RX_STS_LENGTH_MASK: u32 = 0x3fff;
const RX_STS_ERROR: u32 = 1 << 15;
// MAC CSR access: busy (self-clearing), read.
const MAC_CSR_BUSY: u32 = 1 << 31;
const MAC_CSR_READ: u32 = 1 << 30;
// MAC registers (indices).
const MAC_CR: u32 = 1;
const MAC_ADDRH: u32 = 2;
const MAC_ADDRL: u32 = 3;
const MAC_MII_ACC: u32 = 6;
const MAC_MII_DATA: u32 = 7;
// MAC_CR: receiver and transmitter enabled (no promiscuous mode:
// broadcast and frames to our address only).
const MAC_CR_TXEN: u32 = 1 << 3;
const MAC_CR_RXEN: u32 = 1 << 2;
// The internal PHY: address 1, basic status register 1, link up bit.
const PHY_ADDR: u32 = 1;
const PHY_BSR: u32 = 1;
const PHY_BSR_LINK: u32 = 1 << 2;

/// How many polls a self-clearing busy bit gets before the controller is
/// taken to be absent or hung.
const BUSY_POLLS: u32 = 100_000;

/// Why the controller cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lan9118Error {
    /// BYTE_TEST did not read 0x87654321: no controller at this address,
    /// or a bus in the wrong byte order.
    NotFound {
        /// What BYTE_TEST read.
        byte_test: u32,
    },
    /// ID_REV names another chip.
    WrongChip {
        /// What ID_REV read.
        id_rev: u32,
    },
    /// A self-clearing busy bit stayed set.
    Hung,
}

impl core::fmt::Display for Lan9118Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Lan9118Error::NotFound { byte_test } => write!(
                f,
                "no LAN9118 answers (BYTE_TEST read {byte_test:#010x}, not 0x87654321)"
            ),
            Lan9118Error::WrongChip { id_rev } => {
                write!(f, "ID_REV {id_rev:#010x} is not a LAN9118-family chip")
            }
            Lan9118Error::Hung => f.write_str("the controller's busy bit never cleared"),
        }
    }
}

/// Wakes the network task from the controller's interrupt.
static RX_WAKER: AtomicWaker = AtomicWaker::new();
/// The started controller's registers (0: none), for the interrupt.
static STARTED_BASE: AtomicUsize = AtomicUsize::new(0);

/// The controller's registers at a fixed address.
struct Regs {
    base: usize,
}

impl Regs {
    fn read(&self, offset: usize) -> u32 {
        // SAFETY: `base` is the controller's register block (the caller of
        // `Lan9118::new` vouches for it, and its BYTE_TEST read checked it); every offset is one of the
        // constants above, 4-aligned, inside the block's 0x100 bytes.
        unsafe { ptr::read_volatile((self.base + offset) as *const u32) }
    }

    fn write(&self, offset: usize, value: u32) {
        // SAFETY: as in `read`.
        unsafe { ptr::write_volatile((self.base + offset) as *mut u32, value) }
    }

    fn wait_clear(&self, offset: usize, bit: u32) -> Result<(), Lan9118Error> {
        for _ in 0..BUSY_POLLS {
            if self.read(offset) & bit == 0 {
                return Ok(());
            }
        }
        Err(Lan9118Error::Hung)
    }

    fn mac_read(&self, register: u32) -> Result<u32, Lan9118Error> {
        self.wait_clear(MAC_CSR_CMD, MAC_CSR_BUSY)?;
        self.write(MAC_CSR_CMD, MAC_CSR_BUSY | MAC_CSR_READ | register);
        self.wait_clear(MAC_CSR_CMD, MAC_CSR_BUSY)?;
        Ok(self.read(MAC_CSR_DATA))
    }

    fn mac_write(&self, register: u32, value: u32) -> Result<(), Lan9118Error> {
        self.wait_clear(MAC_CSR_CMD, MAC_CSR_BUSY)?;
        self.write(MAC_CSR_DATA, value);
        self.write(MAC_CSR_CMD, MAC_CSR_BUSY | register);
        self.wait_clear(MAC_CSR_CMD, MAC_CSR_BUSY)
    }

    fn phy_read(&self, register: u32) -> Result<u32, Lan9118Error> {
        // MII_ACC: PHY address in 15:11, register in 10:6, bit 1 clear
        // for a read, bit 0 busy.
        const MII_BUSY: u32 = 1;
        let wait_mii = || -> Result<(), Lan9118Error> {
            for _ in 0..BUSY_POLLS {
                if self.mac_read(MAC_MII_ACC)? & MII_BUSY == 0 {
                    return Ok(());
                }
            }
            Err(Lan9118Error::Hung)
        };
        wait_mii()?;
        self.mac_write(MAC_MII_ACC, (PHY_ADDR << 11) | (register << 6) | MII_BUSY)?;
        wait_mii()?;
        Ok(self.mac_read(MAC_MII_DATA)? & 0xffff)
    }

    /// Frames waiting in the RX status FIFO.
    fn rx_waiting(&self) -> u32 {
        (self.read(RX_FIFO_INF) >> 16) & 0xff
    }

    /// Whether the TX data FIFO has room for a whole frame and its two
    /// command words. Drops the transmit statuses first: the frames they
    /// report are sent, and the statuses would only fill their FIFO.
    fn tx_room(&self) -> bool {
        let statuses = (self.read(TX_FIFO_INF) >> 16) & 0xff;
        for _ in 0..statuses {
            self.read(TX_STATUS_FIFO);
        }
        let free = self.read(TX_FIFO_INF) & 0xffff;
        free as usize >= FRAME + 8
    }
}

/// The driver: the controller and one frame buffer each way.
pub struct Lan9118 {
    regs: Regs,
    mac: [u8; 6],
    rx: [u8; FRAME],
    tx: [u8; FRAME],
}

impl Lan9118 {
    /// Resets the controller at `base` and starts it: its MAC address is
    /// the one it loaded (QEMU: the `-nic ...,mac=` option), the receiver
    /// takes broadcast and frames to that address, the interrupt line is
    /// active high on received frames. Unmask the line in the NVIC after
    /// this, and call [`Lan9118::on_interrupt`] from its handler.
    ///
    /// # Safety
    ///
    /// `base` must be the address of a LAN9118's register block that
    /// nothing else uses (one driver per controller).
    pub unsafe fn new(base: usize) -> Result<Self, Lan9118Error> {
        let regs = Regs { base };
        let byte_test = regs.read(BYTE_TEST);
        if byte_test != BYTE_TEST_VALUE {
            return Err(Lan9118Error::NotFound { byte_test });
        }
        let id_rev = regs.read(ID_REV);
        if id_rev >> 16 != CHIP_ID {
            return Err(Lan9118Error::WrongChip { id_rev });
        }
        regs.write(HW_CFG, HW_CFG_SRST);
        regs.wait_clear(HW_CFG, HW_CFG_SRST)?;

        let low = regs.mac_read(MAC_ADDRL)?.to_le_bytes();
        let high = regs.mac_read(MAC_ADDRH)?.to_le_bytes();
        let mac = [low[0], low[1], low[2], low[3], high[0], high[1]];

        // Frames start at a word boundary with no padding (RX_CFG 0).
        regs.write(RX_CFG, 0);
        regs.write(TX_CFG, TX_CFG_TX_ON);
        regs.mac_write(MAC_CR, MAC_CR_TXEN | MAC_CR_RXEN)?;
        regs.write(INT_STS, u32::MAX);
        regs.write(IRQ_CFG, IRQ_EN | IRQ_POL | IRQ_TYPE);
        regs.write(INT_EN, RSFL_INT);
        STARTED_BASE.store(base, Ordering::Release);
        Ok(Lan9118 {
            regs,
            mac,
            rx: [0; FRAME],
            tx: [0; FRAME],
        })
    }

    /// The controller's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Call from the controller's interrupt: masks it (the line is level
    /// triggered and stays up while frames wait) and wakes the network
    /// task, which unmasks it once it has read them.
    pub fn on_interrupt() {
        let base = STARTED_BASE.load(Ordering::Acquire);
        if base != 0 {
            Regs { base }.write(INT_EN, 0);
        }
        RX_WAKER.wake();
    }

    /// Reads the next frame into `rx`; its length, or `None` if it was
    /// dropped (an error frame, or one larger than the buffer).
    fn read_frame(regs: &Regs, rx: &mut [u8; FRAME]) -> Option<usize> {
        let status = regs.read(RX_STATUS_FIFO);
        let length = ((status >> RX_STS_LENGTH_SHIFT) & RX_STS_LENGTH_MASK) as usize;
        // The FIFO holds the frame and its 4-byte FCS, in whole words.
        let words = length.div_ceil(4);
        let Some(frame) = length.checked_sub(4).filter(|f| *f <= FRAME) else {
            Self::skip(regs, words);
            return None;
        };
        if status & RX_STS_ERROR != 0 {
            Self::skip(regs, words);
            return None;
        }
        for word in 0..words {
            let bytes = regs.read(RX_DATA_FIFO).to_le_bytes();
            for (i, byte) in bytes.into_iter().enumerate() {
                if let Some(slot) = rx.get_mut(word * 4 + i).filter(|_| word * 4 + i < frame) {
                    *slot = byte;
                }
            }
        }
        Some(frame)
    }

    /// Drops a frame of `words` FIFO words by reading them. (Not RX_DP_CTRL's
    /// fast-forward: QEMU's model moves the read position without freeing
    /// the words, so every later frame would be read from the wrong place,
    /// and the chip asks to poll the bit after it.) A length no frame can
    /// have means the FIFO lost its framing: RX_DUMP empties it.
    fn skip(regs: &Regs, words: usize) {
        if words > MAX_FIFO_FRAME_WORDS {
            regs.write(RX_CFG, RX_DUMP);
            return;
        }
        for _ in 0..words {
            regs.read(RX_DATA_FIFO);
        }
    }
}

/// A received frame in the driver's buffer.
pub struct RxToken<'a> {
    frame: &'a mut [u8],
}

impl embassy_net_driver::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, f: F) -> R {
        f(self.frame)
    }
}

/// Room for one frame, pushed to the TX FIFO on `consume`.
pub struct TxToken<'a> {
    regs: &'a Regs,
    buf: &'a mut [u8; FRAME],
}

impl embassy_net_driver::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        // embassy-net never asks for more than the MTU we gave it.
        let len = len.min(FRAME);
        let frame = &mut self.buf[..len];
        let result = f(frame);
        // One segment per frame: command A (first, last, length), command
        // B (tag = length, frame length), then the frame in LE words.
        let len32 = len as u32;
        self.regs
            .write(TX_DATA_FIFO, TX_CMD_A_FIRST | TX_CMD_A_LAST | len32);
        self.regs.write(TX_DATA_FIFO, (len32 << 16) | len32);
        for chunk in frame.chunks(4) {
            let mut word = [0u8; 4];
            word[..chunk.len()].copy_from_slice(chunk);
            self.regs.write(TX_DATA_FIFO, u32::from_le_bytes(word));
        }
        result
    }
}

impl embassy_net_driver::Driver for Lan9118 {
    type RxToken<'a> = RxToken<'a>;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, cx: &mut Context) -> Option<(RxToken<'_>, TxToken<'_>)> {
        loop {
            if self.regs.rx_waiting() == 0 {
                // Register first, then unmask: a frame that arrives after
                // the check raises the line again and wakes this task.
                RX_WAKER.register(cx.waker());
                self.regs.write(INT_STS, RSFL_INT);
                self.regs.write(INT_EN, RSFL_INT);
                if self.regs.rx_waiting() == 0 {
                    return None;
                }
            }
            // The TxToken handed out with the frame must have room for a
            // whole frame too (the stack may answer at once, e.g. an ARP
            // reply): leave the frame in the FIFO until it has.
            if !self.regs.tx_room() {
                cx.waker().wake_by_ref();
                return None;
            }
            if let Some(len) = Self::read_frame(&self.regs, &mut self.rx) {
                let rx = RxToken {
                    frame: &mut self.rx[..len],
                };
                let tx = TxToken {
                    regs: &self.regs,
                    buf: &mut self.tx,
                };
                return Some((rx, tx));
            }
        }
    }

    fn transmit(&mut self, cx: &mut Context) -> Option<TxToken<'_>> {
        if !self.regs.tx_room() {
            // The FIFO drains at line rate, so a full one has room again
            // within a frame's time; no interrupt is enabled for that (the
            // model's TX interrupts are not used), so ask to be polled
            // again rather than sleep until an unrelated wake.
            cx.waker().wake_by_ref();
            return None;
        }
        Some(TxToken {
            regs: &self.regs,
            buf: &mut self.tx,
        })
    }

    /// The PHY's link bit, read on every poll of the stack. No interrupt
    /// reports a change: a link that comes up is seen on the stack's next
    /// wake (a frame, a socket, a timer).
    fn link_state(&mut self, _cx: &mut Context) -> LinkState {
        match self.regs.phy_read(PHY_BSR) {
            Ok(status) if status & PHY_BSR_LINK != 0 => LinkState::Up,
            _ => LinkState::Down,
        }
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.max_transmission_unit = 1514;
        caps.max_burst_size = Some(1);
        caps
    }

    fn hardware_address(&self) -> HardwareAddress {
        HardwareAddress::Ethernet(self.mac)
    }
}

//! What the firmware images of this board share: the embassy-time driver
//! on SysTick, the LAN9118 Ethernet driver, the networked replica's
//! command line, and NOR flash on PSRAM that survives a reset.

#![no_std]

pub mod args;
pub mod lan9118;
pub mod psram_flash;
pub mod time_driver;

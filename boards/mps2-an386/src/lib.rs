//! What the firmware images of this board share: the embassy-time driver
//! on SysTick, the LAN9118 Ethernet driver and the network started on it,
//! the networked images' command line, files read from the host, and NOR
//! flash on PSRAM that survives a reset.

#![no_std]

pub mod args;
pub mod host_file;
pub mod lan9118;
pub mod network;
pub mod psram_flash;
pub mod time_driver;

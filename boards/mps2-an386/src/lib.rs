//! What the firmware images of this board share: the embassy-time driver
//! on SysTick, the LAN9118 Ethernet driver and the networked replica's
//! command line.

#![no_std]

pub mod args;
pub mod lan9118;
pub mod time_driver;

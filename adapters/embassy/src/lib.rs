//! guard-embassy: guard on microcontrollers, on embassy.
//!
//! - [`ActiveRunner`]: guard-core's `ActiveGuard` on embassy-time timers,
//!   one active consumer per key with automatic takeover, stopped or
//!   demoted through an [`ActiveControl`] (which can be a `static`);
//! - [`run_slots`]: a job once per planned slot across devices and
//!   servers, through guard-core's `OnceGuard`;
//! - [`retry`]: guard-core's retry executor waiting on embassy-time;
//! - [`until_admitted`]: waiting until a limiter admits, in a line served
//!   in arrival order, with a deadline and jitter;
//! - [`resp`]: a RESP2 codec without allocation, and [`RespLocker`], a
//!   fenced Redis `Locker` + `LeaseRenewer` over any `embedded_io_async`
//!   connection, with guard-redis's keys and scripts, so a gateway MCU and
//!   server replicas exclude each other on one Redis (a password or an ACL
//!   user sent as `AUTH` first on every connection);
//! - [`RamLocker`]: a fixed-size locker in RAM for tasks on one device;
//! - [`time`]: conversions between embassy-time and guard-core time;
//! - `flash` (feature `flash`): a queue and a dead-letter queue on NOR
//!   flash that survive a reset and a power cut;
//! - `tls` (feature `tls`): TLS 1.3 from embedded-tls for the locker, a
//!   connection that starts a new session after any failure, the server's
//!   certificate checked against a CA.
//!
//! The crate is `no_std` and allocation-free. The final binary provides an
//! embassy-time driver (a HAL's, or `embassy-time`'s `std` feature on a
//! host).
// docs.rs (nightly, `--cfg docsrs`) marks each feature-gated item with
// the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![no_std]

#[cfg(test)]
extern crate std;

mod active;
#[cfg(feature = "flash")]
#[cfg_attr(docsrs, doc(cfg(feature = "flash")))]
pub mod flash;
mod ram_locker;
pub mod resp;
mod resp_locker;
mod retry;
mod slots;
pub mod time;
#[cfg(feature = "tls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
pub mod tls;
mod wait;

pub use active::{ActiveControl, ActiveRunner, DEFAULT_RELEASE_TIMEOUT};
pub use ram_locker::{RamLocker, RamLockerError};
pub use resp_locker::{
    Credentials, InvalidCredentials, InvalidPrefix, MAX_PASSWORD, MAX_PREFIX, MAX_USER, RespError,
    RespLocker, ServerMessage, exchange, server_message,
};
pub use retry::retry;
pub use slots::{SlotRun, run_slots};
pub use wait::until_admitted;

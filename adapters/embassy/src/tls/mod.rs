//! TLS 1.3 for [`RespLocker`](crate::RespLocker) and other clients of one
//! server, from embedded-tls (no allocator): a connection that starts a
//! new session after any failure, and the server's certificate checked
//! against a CA.
//!
//! embedded-tls's `TlsConnection` borrows its two record buffers for as
//! long as it lives and must be made again after any error, so a client
//! that keeps one in a struct could never reconnect. Here the session
//! lives in [`TlsSession::serve`], a future that owns the buffers and
//! makes a new connection in each turn of its loop; clients reach it
//! through a [`TlsLink`] (`embedded_io_async` `Read` + `Write`), one
//! operation at a time over a [`TlsChannel`]. Join the two futures on one
//! executor.
//!
//! Guarantees:
//! - every connection is a new TCP connection and a full handshake: after
//!   a failed operation or [`TlsLink::close`], the next operation starts a
//!   new session (so `RespLocker::with_reset(TlsLink::close)` puts the
//!   locker back in step); a close ends the connection even while the
//!   session waits on a silent server, in a handshake or a read;
//! - the server's certificate chain is checked against the CA for the
//!   server name before anything is sent ([`CaVerified`]); a refused
//!   certificate fails the operation that asked for the connection;
//! - an operation a client abandoned (its future dropped) is not started
//!   if it was still waiting, and its answer never reaches a later
//!   operation if it was running (operations are numbered); an abandoned
//!   read may still take bytes off the connection, which is then out of
//!   step: close it after abandoning an operation, as `RespLocker`'s
//!   reset does.
//!
//! One [`TlsLink`] per channel: two would wait for the same answers.
//!
//! Limits: the validity period is not checked (no calendar clock:
//! `NoClock`); the randomness is the RNG given, which must be a CSPRNG
//! seeded from a real entropy source, drawn for TLS alone (a seed that
//! also makes TCP sequence numbers or lock tokens, which the wire and
//! Redis show, gives the session keys away); the cipher suite is
//! TLS_AES_128_GCM_SHA256, the one every TLS 1.3 server offers; the
//! server's certificates are ECDSA P-256 (embedded-tls's verifier without
//! its RSA and P-384 features); each handshake message must fit one
//! record, so with records of 1 KiB the server's certificate chain must
//! fit about 1 KiB (a certificate the CA signed directly does; one with
//! an intermediate may need 4 KiB records).
//!
//! ```no_run
//! use embassy_sync::blocking_mutex::raw::NoopRawMutex;
//! use embedded_tls::MaxFragmentLength;
//! use guard_core::lock::{Locker, Ttl};
//! use guard_embassy::RespLocker;
//! use guard_embassy::tls::{TlsChannel, TlsLink, TlsSession, record_len, with_session};
//!
//! async fn lock_once<S: embedded_io_async::Read + embedded_io_async::Write>(
//!     tcp: S,            // connects on its next use after `close`
//!     close: fn(&mut S),
//!     ca: &[u8],         // the CA's certificate, DER
//!     rng: impl embedded_tls::CryptoRngCore,
//! ) -> bool {
//!     let (mut read, mut write) = ([0u8; record_len(1024)], [0u8; record_len(1024)]);
//!     let Ok(mut session) = TlsSession::new(tcp, close, (&mut read, &mut write), "redis", ca, rng)
//!     else {
//!         return false; // not a DER certificate
//!     };
//!     let channel: TlsChannel<NoopRawMutex> = TlsChannel::new();
//!     let locker = RespLocker::<NoopRawMutex, _>::new(TlsLink::new(&channel), 7)
//!         .with_reset(TlsLink::close);
//!     let ttl = Ttl::from_secs(10).unwrap();
//!     let fragment = Some(MaxFragmentLength::Bits10);
//!     with_session(&mut session, &channel, fragment, async {
//!         matches!(locker.try_lock("job", ttl).await, Ok(Some(_)))
//!     })
//!     .await
//! }
//! ```

mod ca;
mod channel;
mod session;

pub use ca::{CaVerified, InvalidCa, MAX_CERTIFICATE};
pub use channel::{CHUNK, TlsChannel, TlsLink};
pub use session::{TlsSession, with_session};

use embedded_tls::TlsError;

/// The size of a TLS 1.3 record of at most `data` bytes of data: its
/// 5-byte header, the content type and the AEAD tag beside the data.
/// Buffers of `record_len(1024)` each way take any record of a server
/// that honours a maximum fragment length of 1 KiB (Redis does).
pub const fn record_len(data: usize) -> usize {
    5 + data + 1 + 16
}

/// Whether `e` is a refusal that asking again cannot change: the
/// server's certificate does not check out against the CA (or is not
/// P-256), the server aborted the handshake, or its records do not fit the
/// buffers. Anything else (a connection that failed or closed) may pass on
/// the next connection.
pub fn is_refusal(e: &TlsError) -> bool {
    matches!(
        e,
        TlsError::InvalidCertificate
            | TlsError::InvalidCertificateEntry
            | TlsError::InvalidSignature
            | TlsError::InvalidSignatureScheme
            | TlsError::HandshakeAborted(..)
            | TlsError::InsufficientSpace
    )
}

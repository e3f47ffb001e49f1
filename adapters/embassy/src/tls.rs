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

use core::cell::RefCell;

use embassy_futures::select::{Either, select};
use embassy_sync::blocking_mutex::Mutex;
use embassy_sync::blocking_mutex::raw::RawMutex;
use embassy_sync::signal::Signal;
use embedded_io_async::{ErrorType, Read, Write};
use embedded_tls::pki::CertVerifier;
use embedded_tls::{
    Aes128GcmSha256, Certificate, CryptoProvider, CryptoRngCore, NoClock, TlsConfig, TlsConnection,
    TlsContext, TlsError, TlsVerifier,
};

/// The largest certificate of the server's chain the verifier takes.
pub const MAX_CERTIFICATE: usize = 2048;

/// Bytes of data one operation moves between a [`TlsLink`] and its
/// session.
pub const CHUNK: usize = 256;

/// The size of a TLS 1.3 record of at most `data` bytes of data: its
/// 5-byte header, the content type and the AEAD tag beside the data.
/// Buffers of `record_len(1024)` each way take any record of a server
/// that honours a maximum fragment length of 1 KiB (Redis does).
pub const fn record_len(data: usize) -> usize {
    5 + data + 1 + 16
}

/// Checks the server's certificate chain against one CA, for the server
/// name of the `TlsConfig`; `R` is the randomness.
pub struct CaVerified<'a, R> {
    rng: &'a mut R,
    verifier: CertVerifier<'a, Aes128GcmSha256, NoClock, MAX_CERTIFICATE>,
}

impl<'a, R: CryptoRngCore> CaVerified<'a, R> {
    /// A provider trusting the CA certificate `ca` (DER) alone.
    pub fn new(ca: &'a [u8], rng: &'a mut R) -> Self {
        CaVerified {
            rng,
            verifier: CertVerifier::new(Certificate::X509(ca)),
        }
    }
}

impl<R: CryptoRngCore> CryptoProvider for CaVerified<'_, R> {
    type CipherSuite = Aes128GcmSha256;
    type Signature = &'static [u8];

    fn rng(&mut self) -> impl CryptoRngCore {
        &mut *self.rng
    }

    fn verifier(&mut self) -> Result<&mut impl TlsVerifier<Aes128GcmSha256>, TlsError> {
        Ok(&mut self.verifier)
    }
}

/// A CA certificate that cannot be one: what is wrong with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidCa {
    /// No bytes.
    Empty,
    /// It does not start as a DER `SEQUENCE` (a PEM file starts
    /// `-----BEGIN`: convert it to DER).
    NotDer,
    /// Its length says `declared` bytes but `len` are given.
    Length {
        /// The bytes the DER header declares, header included.
        declared: usize,
        /// The bytes given.
        len: usize,
    },
}

impl core::fmt::Display for InvalidCa {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InvalidCa::Empty => f.write_str("the CA certificate is empty"),
            InvalidCa::NotDer => f.write_str(
                "the CA certificate is not DER (a PEM file starts with -----BEGIN: convert it with `openssl x509 -outform der`)",
            ),
            InvalidCa::Length { declared, len } => write!(
                f,
                "the CA certificate declares {declared} bytes but {len} are given (cut short, or more than one)"
            ),
        }
    }
}

impl core::error::Error for InvalidCa {}

/// Checks that `der` is exactly one DER `SEQUENCE` (an X.509 certificate
/// is one); its content is checked at each handshake.
fn check_der(der: &[u8]) -> Result<(), InvalidCa> {
    let (&tag, rest) = der.split_first().ok_or(InvalidCa::Empty)?;
    if tag != 0x30 {
        return Err(InvalidCa::NotDer);
    }
    let (&first, rest) = rest.split_first().ok_or(InvalidCa::NotDer)?;
    // Short form: the length itself; long form: 0x80 | the number of
    // length bytes that follow (at most 4 here: no certificate is larger).
    let (content, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let count = usize::from(first & 0x7f);
        let Some(bytes) = rest.get(..count).filter(|_| (1..=4).contains(&count)) else {
            return Err(InvalidCa::NotDer);
        };
        let content = bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b));
        (content, 2 + count)
    };
    let declared = content.saturating_add(header);
    if declared != der.len() {
        return Err(InvalidCa::Length {
            declared,
            len: der.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{InvalidCa, check_der};

    #[test]
    fn a_ca_must_be_one_der_sequence() {
        assert_eq!(check_der(&[]), Err(InvalidCa::Empty));
        assert_eq!(
            check_der(b"-----BEGIN CERTIFICATE-----"),
            Err(InvalidCa::NotDer)
        );
        assert_eq!(check_der(&[0x30]), Err(InvalidCa::NotDer));
        assert_eq!(check_der(&[0x30, 0x80]), Err(InvalidCa::NotDer));
        assert_eq!(
            check_der(&[0x30, 0x85, 1, 1, 1, 1, 1]),
            Err(InvalidCa::NotDer)
        );
        assert_eq!(check_der(&[0x30, 0x82, 0x01]), Err(InvalidCa::NotDer));
        assert_eq!(check_der(&[0x30, 0x02, 0x05, 0x00]), Ok(()));
        assert_eq!(
            check_der(&[0x30, 0x02, 0x05]),
            Err(InvalidCa::Length {
                declared: 4,
                len: 3
            })
        );
        assert_eq!(
            check_der(&[0x30, 0x01, 0x05, 0x30]),
            Err(InvalidCa::Length {
                declared: 3,
                len: 4
            })
        );
        let mut long = [0u8; 300];
        long[..4].copy_from_slice(&[0x30, 0x82, 0x01, 0x28]);
        assert_eq!(check_der(&long), Ok(()));
    }
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// Send bytes `..n` of `to_send`.
    Write(usize),
    Flush,
    /// Receive up to `n` bytes into `received`.
    Read(usize),
}

struct Shared {
    /// What the client's last write gave, to send. Apart from `received`:
    /// an abandoned read the session still finishes writes only there, so
    /// it never spoils what a later write put here.
    to_send: [u8; CHUNK],
    /// What the session's last read received, for the read that asked.
    received: [u8; CHUNK],
    /// The number of the last operation asked for.
    asked: u32,
    /// Handshakes completed, for reports.
    handshakes: u32,
}

/// Where a [`TlsLink`] and its [`TlsSession`] meet: one operation at a
/// time. `M` is the mutex kind (`NoopRawMutex` when both run on one
/// executor); `const`, so it can be a `static`.
pub struct TlsChannel<M: RawMutex> {
    op: Signal<M, (u32, Op)>,
    done: Signal<M, (u32, Result<usize, TlsError>)>,
    /// Signalled by [`TlsLink::close`]: the connection ends, whatever the
    /// session is waiting for.
    reset: Signal<M, ()>,
    shared: Mutex<M, RefCell<Shared>>,
}

impl<M: RawMutex> TlsChannel<M> {
    /// A channel with no operation.
    pub const fn new() -> Self {
        TlsChannel {
            op: Signal::new(),
            done: Signal::new(),
            reset: Signal::new(),
            shared: Mutex::new(RefCell::new(Shared {
                to_send: [0; CHUNK],
                received: [0; CHUNK],
                asked: 0,
                handshakes: 0,
            })),
        }
    }

    /// Handshakes completed so far: one per connection the session made.
    pub fn handshakes(&self) -> u32 {
        self.shared.lock(|s| s.borrow().handshakes)
    }

    /// Whether operation `number` is the last one asked (not abandoned).
    fn is_current(&self, number: u32) -> bool {
        self.with(|s| s.asked == number)
    }

    fn with<T>(&self, f: impl FnOnce(&mut Shared) -> T) -> T {
        self.shared.lock(|s| f(&mut s.borrow_mut()))
    }
}

impl<M: RawMutex> Default for TlsChannel<M> {
    fn default() -> Self {
        Self::new()
    }
}

/// A client's end of a TLS connection (see the module documentation):
/// `Read` and `Write` over the session on the same [`TlsChannel`].
pub struct TlsLink<'c, M: RawMutex> {
    channel: &'c TlsChannel<M>,
}

impl<'c, M: RawMutex> TlsLink<'c, M> {
    /// The client end of `channel`.
    pub fn new(channel: &'c TlsChannel<M>) -> Self {
        TlsLink { channel }
    }

    /// Ends the connection: the next operation starts a new session (a
    /// reset hook for [`RespLocker::with_reset`](crate::RespLocker::with_reset)).
    pub fn close(&mut self) {
        self.channel.reset.signal(());
    }

    /// Asks for `op` and waits for its answer, skipping answers to
    /// operations abandoned before it.
    async fn ask(&mut self, op: Op) -> Result<usize, TlsError> {
        let number = self.channel.with(|s| {
            s.asked = s.asked.wrapping_add(1);
            s.asked
        });
        self.channel.op.signal((number, op));
        loop {
            let (answered, result) = self.channel.done.wait().await;
            if answered == number {
                return result;
            }
        }
    }
}

impl<M: RawMutex> ErrorType for TlsLink<'_, M> {
    type Error = TlsError;
}

impl<M: RawMutex> Read for TlsLink<'_, M> {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, TlsError> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = self.ask(Op::Read(buf.len().min(CHUNK))).await?;
        // Ours: the session answered this read last and does nothing
        // more until the next operation is asked.
        self.channel
            .with(|s| buf[..n].copy_from_slice(&s.received[..n]));
        Ok(n)
    }
}

impl<M: RawMutex> Write for TlsLink<'_, M> {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, TlsError> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = buf.len().min(CHUNK);
        self.channel
            .with(|s| s.to_send[..n].copy_from_slice(&buf[..n]));
        self.ask(Op::Write(n)).await
    }

    async fn flush(&mut self) -> Result<(), TlsError> {
        self.ask(Op::Flush).await.map(drop)
    }
}

/// The session end: connections to one server, made as operations ask.
pub struct TlsSession<'a, S, R> {
    socket: S,
    close: fn(&mut S),
    read: &'a mut [u8],
    write: &'a mut [u8],
    server_name: &'a str,
    ca: &'a [u8],
    rng: R,
}

impl<'a, S: Read + Write, R: CryptoRngCore> TlsSession<'a, S, R> {
    /// Sessions over `socket`, a transport that connects on its next use
    /// after `close`; records in `read` and `write` (of
    /// [`record_len`] for the largest record the server may send, and
    /// what the handshake needs); the server's certificate checked
    /// against `ca` (DER) for `server_name`. A `ca` that is not one DER
    /// structure (empty, PEM, cut short, with bytes after it) is refused
    /// here rather than at the first handshake.
    pub fn new(
        socket: S,
        close: fn(&mut S),
        (read, write): (&'a mut [u8], &'a mut [u8]),
        server_name: &'a str,
        ca: &'a [u8],
        rng: R,
    ) -> Result<Self, InvalidCa> {
        check_der(ca)?;
        Ok(TlsSession {
            socket,
            close,
            read,
            write,
            server_name,
            ca,
            rng,
        })
    }

    /// Serves `channel`'s operations for ever, with records of at most
    /// `fragment` bytes asked of the server, if given.
    pub async fn serve<M: RawMutex>(
        &mut self,
        channel: &TlsChannel<M>,
        fragment: Option<embedded_tls::MaxFragmentLength>,
    ) -> ! {
        let mut config = TlsConfig::new().with_server_name(self.server_name);
        if let Some(fragment) = fragment {
            config = config.with_max_fragment_length(fragment);
        }
        loop {
            let (number, op) = channel.op.wait().await;
            if !channel.is_current(number) {
                continue;
            }
            // A close before this operation was asked ended the last
            // connection, which is gone already.
            channel.reset.reset();
            // A fresh TCP connection for every session.
            (self.close)(&mut self.socket);
            let mut tls: TlsConnection<'_, &mut S, Aes128GcmSha256> =
                TlsConnection::new(&mut self.socket, &mut *self.read, &mut *self.write);
            let provider = CaVerified::new(self.ca, &mut self.rng);
            // A close ends a handshake with a silent server too (the
            // operation that asked for it was abandoned).
            match select(
                channel.reset.wait(),
                tls.open(TlsContext::new(&config, provider)),
            )
            .await
            {
                Either::First(()) => continue,
                Either::Second(Err(e)) => {
                    channel.done.signal((number, Err(e)));
                    continue;
                }
                Either::Second(Ok(())) => {}
            }
            channel.with(|s| s.handshakes = s.handshakes.wrapping_add(1));
            let mut current = Some((number, op));
            loop {
                let (number, op) = match current.take() {
                    Some(asked) => asked,
                    // A close first: an operation asked after it belongs
                    // to the next connection.
                    None => match select(channel.reset.wait(), channel.op.wait()).await {
                        Either::First(()) => break,
                        Either::Second(asked) => asked,
                    },
                };
                // Abandoned while the handshake ran: never run (its bytes
                // may be a later write's by now).
                if !channel.is_current(number) {
                    continue;
                }
                // A close ends a read from a silent server too: the
                // connection is out of step and goes.
                match select(channel.reset.wait(), run(&mut tls, channel, op)).await {
                    Either::First(()) => break,
                    Either::Second(result) => {
                        let failed = result.is_err();
                        channel.done.signal((number, result));
                        if failed {
                            break;
                        }
                    }
                }
            }
            // `tls` ends here, giving the record buffers back to the next
            // connection.
        }
    }
}

/// One operation on an open connection.
async fn run<S: Read + Write, M: RawMutex>(
    tls: &mut TlsConnection<'_, S, Aes128GcmSha256>,
    channel: &TlsChannel<M>,
    op: Op,
) -> Result<usize, TlsError> {
    let mut chunk = [0u8; CHUNK];
    match op {
        Op::Write(n) => {
            channel.with(|s| chunk[..n].copy_from_slice(&s.to_send[..n]));
            tls.write(&chunk[..n]).await
        }
        Op::Flush => tls.flush().await.map(|()| 0),
        Op::Read(n) => {
            let got = tls.read(&mut chunk[..n]).await?;
            channel.with(|s| s.received[..got].copy_from_slice(&chunk[..got]));
            Ok(got)
        }
    }
}

/// Runs `client` with `session` serving `channel` beside it; what
/// `client` returns.
pub async fn with_session<S, R, M, T>(
    session: &mut TlsSession<'_, S, R>,
    channel: &TlsChannel<M>,
    fragment: Option<embedded_tls::MaxFragmentLength>,
    client: impl core::future::Future<Output = T>,
) -> T
where
    S: Read + Write,
    R: CryptoRngCore,
    M: RawMutex,
{
    match select(client, session.serve(channel, fragment)).await {
        Either::First(out) => out,
    }
}

//! The client's end of a session, and where it meets the session: one
//! numbered operation at a time.

use core::cell::RefCell;

use embassy_sync::blocking_mutex::Mutex;
use embassy_sync::blocking_mutex::raw::RawMutex;
use embassy_sync::signal::Signal;
use embedded_io_async::{ErrorType, Read, Write};
use embedded_tls::TlsError;

/// Bytes of data one operation moves between a [`TlsLink`] and its
/// session.
pub const CHUNK: usize = 256;

/// One operation a link asks of its session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// Send bytes `..n` of `to_send`.
    Write(usize),
    Flush,
    /// Receive up to `n` bytes into `received`.
    Read(usize),
}

/// What a link and its session share besides the signals.
pub(super) struct Shared {
    /// What the client's last write gave, to send. Apart from `received`:
    /// an abandoned read the session still finishes writes only there, so
    /// it never spoils what a later write put here.
    pub(super) to_send: [u8; CHUNK],
    /// What the session's last read received, for the read that asked.
    pub(super) received: [u8; CHUNK],
    /// The number of the last operation asked for.
    pub(super) asked: u32,
    /// Handshakes completed, for reports.
    pub(super) handshakes: u32,
}

/// Where a [`TlsLink`] and its [`TlsSession`](super::TlsSession) meet:
/// one operation at a time. `M` is the mutex kind (`NoopRawMutex` when
/// both run on one executor); `const`, so it can be a `static`.
pub struct TlsChannel<M: RawMutex> {
    pub(super) op: Signal<M, (u32, Op)>,
    pub(super) done: Signal<M, (u32, Result<usize, TlsError>)>,
    /// Signalled by [`TlsLink::close`]: the connection ends, whatever the
    /// session is waiting for.
    pub(super) reset: Signal<M, ()>,
    pub(super) shared: Mutex<M, RefCell<Shared>>,
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
        self.with(|s| s.handshakes)
    }

    /// Whether operation `number` is the last one asked (not abandoned).
    pub(super) fn is_current(&self, number: u32) -> bool {
        self.with(|s| s.asked == number)
    }

    pub(super) fn with<T>(&self, f: impl FnOnce(&mut Shared) -> T) -> T {
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

//! The session's end: a loop that owns the record buffers and makes a new
//! connection in each turn.

use embassy_futures::select::{Either, select};
use embassy_sync::blocking_mutex::raw::RawMutex;
use embedded_io_async::{Read, Write};
use embedded_tls::{
    Aes128GcmSha256, CryptoRngCore, TlsConfig, TlsConnection, TlsContext, TlsError,
};

use super::ca::{CaVerified, InvalidCa, check_der};
use super::channel::{CHUNK, Op, TlsChannel};

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
    /// [`record_len`](super::record_len) for the largest record the server
    /// may send, and what the handshake needs); the server's certificate
    /// checked against `ca` (DER) for `server_name`. A `ca` that is not one DER
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
            serve_open(&mut tls, channel, (number, op)).await;
            // `tls` ends here, giving the record buffers back to the next
            // connection.
        }
    }
}

/// Serves operations on one open connection, `first` first, until one
/// fails or a close ends it.
async fn serve_open<S: Read + Write, M: RawMutex>(
    tls: &mut TlsConnection<'_, S, Aes128GcmSha256>,
    channel: &TlsChannel<M>,
    first: (u32, Op),
) {
    let mut current = Some(first);
    loop {
        let (number, op) = match current.take() {
            Some(asked) => asked,
            // A close first: an operation asked after it belongs to the
            // next connection.
            None => match select(channel.reset.wait(), channel.op.wait()).await {
                Either::First(()) => return,
                Either::Second(asked) => asked,
            },
        };
        // Abandoned while the handshake ran: never run (its bytes may be a
        // later write's by now).
        if !channel.is_current(number) {
            continue;
        }
        // A close ends a read from a silent server too: the connection is
        // out of step and goes.
        let Either::Second(result) = select(channel.reset.wait(), run(tls, channel, op)).await
        else {
            return;
        };
        let failed = result.is_err();
        channel.done.signal((number, result));
        if failed {
            return;
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

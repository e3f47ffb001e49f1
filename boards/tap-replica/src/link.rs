//! A TCP connection that reconnects on next use after a failure, and
//! sends Redis `AUTH` once per connection when it has credentials.

use embassy_net::tcp::{Error, TcpSocket};
use embassy_net::{IpEndpoint, Stack};
use embassy_time::Duration;
use embedded_io_async::{ErrorKind, ErrorType, Read, Write};
use guard_embassy::resp::Frame;
use guard_embassy::{Credentials, MAX_PASSWORD, MAX_USER, RespError, exchange, server_message};

/// How long the peer may leave a connection attempt, sent data or a
/// keep-alive unacknowledged before the connection is aborted (smoltcp's
/// timeout: it does not bound a read from a peer that acknowledges but
/// never answers; a caller bounds that itself).
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// How often an idle connection probes the peer, so that one that went
/// away ends the connection within this plus [`IO_TIMEOUT`] instead of
/// leaving a read waiting for ever.
const KEEP_ALIVE: Duration = Duration::from_secs(1);

/// A connection to one endpoint over embassy-net; after a failure (or
/// [`Link::close`]) the next read or write connects again.
pub struct Link {
    socket: TcpSocket<'static>,
    remote: IpEndpoint,
    connected: bool,
    auth: Option<Credentials>,
    /// `AUTH` was accepted on this connection (a new one starts without).
    authenticated: bool,
}

/// A failure of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkError {
    /// Connecting failed.
    Connect,
    /// The connection failed or was closed.
    Tcp(Error),
    /// The peer closed the connection.
    Closed,
}

impl core::fmt::Display for LinkError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LinkError::Connect => f.write_str("cannot connect"),
            LinkError::Tcp(e) => write!(f, "TCP: {e:?}"),
            LinkError::Closed => f.write_str("closed by the peer"),
        }
    }
}

impl core::error::Error for LinkError {}

impl embedded_io_async::Error for LinkError {
    fn kind(&self) -> ErrorKind {
        match self {
            LinkError::Connect => ErrorKind::NotConnected,
            LinkError::Tcp(_) => ErrorKind::ConnectionReset,
            LinkError::Closed => ErrorKind::ConnectionAborted,
        }
    }
}

/// A link's TCP buffers, `N` bytes each way: a `static` on an MCU.
pub struct LinkBuffers<const N: usize> {
    rx: [u8; N],
    tx: [u8; N],
}

impl<const N: usize> LinkBuffers<N> {
    /// Zeroed buffers (`const`: usable in a `static`).
    pub const fn new() -> Self {
        LinkBuffers {
            rx: [0; N],
            tx: [0; N],
        }
    }
}

impl<const N: usize> Default for LinkBuffers<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl Link {
    /// A link to `remote` over `buffers` (one each way).
    pub fn new<const N: usize>(
        stack: Stack<'static>,
        remote: IpEndpoint,
        buffers: &'static mut LinkBuffers<N>,
    ) -> Self {
        let mut socket = TcpSocket::new(stack, &mut buffers.rx, &mut buffers.tx);
        socket.set_timeout(Some(IO_TIMEOUT));
        socket.set_keep_alive(Some(KEEP_ALIVE));
        Link {
            socket,
            remote,
            connected: false,
            auth: None,
            authenticated: false,
        }
    }

    /// Sends `auth` as `AUTH` on each new connection, before its first
    /// request ([`authenticate`](Self::authenticate)).
    pub fn with_auth(mut self, auth: Option<Credentials>) -> Self {
        self.auth = auth;
        self
    }

    /// Drops the connection; the next use connects again.
    pub fn close(&mut self) {
        self.socket.abort();
        self.connected = false;
        self.authenticated = false;
    }

    /// Sends the credentials unless this connection has had them accepted
    /// (nothing without credentials). Refused ones fail with
    /// [`RespError::AuthRefused`] and the server's reason, and close the
    /// connection.
    pub async fn authenticate(&mut self) -> Result<(), RespError<LinkError>> {
        if self.auth.is_none() {
            return Ok(());
        }
        self.ensure().await.map_err(RespError::Io)?;
        if self.authenticated {
            return Ok(());
        }
        let mut buf = [0u8; 32 + MAX_USER + MAX_PASSWORD];
        let len = match &self.auth {
            Some(auth) => auth.command(&mut buf).map_err(RespError::BufferFull)?,
            None => return Ok(()),
        };
        let accepted = match exchange(self, &mut buf, len).await {
            Ok((Frame::Simple(b"OK"), true)) => Ok(()),
            Ok((Frame::Error(message), true)) => {
                Err(RespError::AuthRefused(server_message(message)))
            }
            Ok(_) => Err(RespError::UnexpectedReply),
            Err(e) => Err(e),
        };
        match accepted {
            Ok(()) => self.authenticated = true,
            Err(_) => self.close(),
        }
        accepted
    }

    async fn ensure(&mut self) -> Result<(), LinkError> {
        if !self.connected {
            // Closed: new, or aborted by `close` (which smoltcp does at once).
            self.socket
                .connect(self.remote)
                .await
                .map_err(|_| LinkError::Connect)?;
            self.connected = true;
            self.authenticated = false;
        }
        Ok(())
    }

    fn failed<T>(&mut self, e: LinkError) -> Result<T, LinkError> {
        self.close();
        Err(e)
    }
}

impl ErrorType for Link {
    type Error = LinkError;
}

impl Read for Link {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, LinkError> {
        self.ensure().await?;
        match self.socket.read(buf).await {
            Ok(0) if !buf.is_empty() => self.failed(LinkError::Closed),
            Ok(n) => Ok(n),
            Err(e) => self.failed(LinkError::Tcp(e)),
        }
    }
}

impl Write for Link {
    async fn write(&mut self, buf: &[u8]) -> Result<usize, LinkError> {
        self.ensure().await?;
        match self.socket.write(buf).await {
            Ok(n) => Ok(n),
            Err(e) => self.failed(LinkError::Tcp(e)),
        }
    }

    async fn flush(&mut self) -> Result<(), LinkError> {
        match self.socket.flush().await {
            Ok(()) => Ok(()),
            Err(e) => self.failed(LinkError::Tcp(e)),
        }
    }
}

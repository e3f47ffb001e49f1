//! A TCP connection that reconnects on next use after a failure.

use embassy_net::tcp::{Error, TcpSocket};
use embassy_net::{IpEndpoint, Stack};
use embassy_time::Duration;
use embedded_io_async::{ErrorKind, ErrorType, Read, Write};

/// How long one connection attempt or one read may take.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to one endpoint over embassy-net; after a failure (or
/// [`Link::close`]) the next read or write connects again.
pub struct Link {
    socket: TcpSocket<'static>,
    remote: IpEndpoint,
    connected: bool,
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
        Link {
            socket,
            remote,
            connected: false,
        }
    }

    /// Drops the connection; the next use connects again.
    pub fn close(&mut self) {
        self.socket.abort();
        self.connected = false;
    }

    async fn ensure(&mut self) -> Result<(), LinkError> {
        if !self.connected {
            // Closed: new, or aborted by `close` (which smoltcp does at once).
            self.socket
                .connect(self.remote)
                .await
                .map_err(|_| LinkError::Connect)?;
            self.connected = true;
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

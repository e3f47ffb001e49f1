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

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Connect => f.write_str("cannot connect"),
            LinkError::Tcp(e) => write!(f, "TCP: {e:?}"),
            LinkError::Closed => f.write_str("closed by the peer"),
        }
    }
}

impl std::error::Error for LinkError {}

impl embedded_io_async::Error for LinkError {
    fn kind(&self) -> ErrorKind {
        match self {
            LinkError::Connect => ErrorKind::NotConnected,
            LinkError::Tcp(_) => ErrorKind::ConnectionReset,
            LinkError::Closed => ErrorKind::ConnectionAborted,
        }
    }
}

impl Link {
    /// A link to `remote` with buffers of `size` bytes each way.
    pub fn new(stack: Stack<'static>, remote: IpEndpoint, size: usize) -> Self {
        let rx = Box::leak(vec![0u8; size].into_boxed_slice());
        let tx = Box::leak(vec![0u8; size].into_boxed_slice());
        let mut socket = TcpSocket::new(stack, rx, tx);
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

//! Connecting upstream and relaying bytes both ways.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connect to `addr` within `timeout`, with Nagle off (the proxy adds no latency of its own).
pub(crate) async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Send `prefix` (bytes already read from the sandbox) upstream, then copy both ways until both
/// sides have closed.
pub(crate) async fn relay<C>(
    client: &mut C,
    mut upstream: TcpStream,
    prefix: &[u8],
    buffer: usize,
) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    upstream.write_all(prefix).await?;
    tokio::io::copy_bidirectional_with_sizes(client, &mut upstream, buffer, buffer).await?;
    Ok(())
}

//! Connecting upstream and relaying bytes both ways.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::stream::Counted;

/// Connect to `addr` within `timeout`, with Nagle off (the proxy adds no latency of its own).
pub(crate) async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Send `prefix` (bytes already read from the sandbox) upstream, then copy both ways until both
/// sides have closed. The copy buffers are only allocated once either side has something to say, so
/// an idle tunnel costs its sockets and a task, not 2 × `buffer` bytes.
pub(crate) async fn relay(
    client: &mut Counted<TcpStream>,
    mut upstream: TcpStream,
    prefix: Vec<u8>,
    buffer: usize,
) -> io::Result<()> {
    upstream.write_all(&prefix).await?;
    drop(prefix);
    tokio::select! {
        r = client.get_ref().readable() => r?,
        r = upstream.readable() => r?,
    }
    tokio::io::copy_bidirectional_with_sizes(client, &mut upstream, buffer, buffer).await?;
    Ok(())
}

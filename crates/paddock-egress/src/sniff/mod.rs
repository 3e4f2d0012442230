//! Reading the name a connection is for from its first bytes: TLS SNI or the HTTP/1 `Host`.
//!
//! The bytes read are returned with the result so the relay can send them on first: nothing is lost
//! and nothing is parsed twice. Reading is bounded in size and time, and malformed input is an error,
//! never a panic.

mod http;
mod tls;

use std::time::Duration;

use paddock_types::DomainName;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Bounds on sniffing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SniffLimits {
    /// Most bytes read before giving up (a ClientHello or a request head must fit).
    pub max_bytes: usize,
    /// How long to wait for the client's first byte; a client that stays silent (a protocol where the
    /// server speaks first) is treated as carrying no name.
    pub first_byte: Duration,
    /// How long the whole ClientHello or request head may take.
    pub total: Duration,
}

impl Default for SniffLimits {
    fn default() -> Self {
        Self {
            max_bytes: 16 * 1024,
            first_byte: Duration::from_millis(500),
            total: Duration::from_secs(10),
        }
    }
}

/// What the first bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// A TLS ClientHello, with its server name when it sent one.
    Tls(Option<DomainName>),
    /// An HTTP/1 request, with the name in its `Host` when it is a name.
    Http(Option<DomainName>),
    /// Some other protocol, or a client waiting for the server to speak first.
    Opaque,
}

impl Sniffed {
    /// The name the connection is for, if any.
    pub fn name(&self) -> Option<&DomainName> {
        match self {
            Self::Tls(n) | Self::Http(n) => n.as_ref(),
            Self::Opaque => None,
        }
    }
}

/// Why sniffing failed (the connection is refused).
#[derive(Debug, thiserror::Error)]
pub enum SniffError {
    /// The bytes are TLS or HTTP but malformed.
    #[error("malformed {protocol}: {reason}")]
    Malformed {
        /// `TLS` or `HTTP`.
        protocol: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// The ClientHello or request head is larger than the limit.
    #[error("first message longer than {max} bytes")]
    TooLong {
        /// The limit.
        max: usize,
    },
    /// The client closed before a whole message.
    #[error("connection closed after {read} bytes, inside the first message")]
    Truncated {
        /// Bytes read.
        read: usize,
    },
    /// The client took too long.
    #[error("timed out reading the first message")]
    Timeout,
    /// Reading failed.
    #[error("failed to read the first bytes")]
    Read(#[source] std::io::Error),
}

impl SniffError {
    /// A short reason for the audit.
    pub fn reason(&self) -> String {
        self.to_string()
    }
}

/// The outcome of looking at a prefix of the stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Progress<T> {
    NeedMore,
    Done(T),
    Malformed(&'static str),
}

/// Classify a prefix of a connection: pure, for any bytes.
pub fn classify(buf: &[u8]) -> Result<Option<Sniffed>, SniffError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let (protocol, progress) = if tls::looks_like_tls(first) {
        ("TLS", tls::client_hello_sni(buf).map(Sniffed::Tls))
    } else {
        match http::looks_like_http(buf) {
            Progress::Done(true) => ("HTTP", http::request_host(buf).map(Sniffed::Http)),
            Progress::NeedMore => return Ok(None),
            Progress::Done(false) | Progress::Malformed(_) => return Ok(Some(Sniffed::Opaque)),
        }
    };
    match progress {
        Progress::NeedMore => Ok(None),
        Progress::Done(s) => Ok(Some(s)),
        Progress::Malformed(reason) => Err(SniffError::Malformed { protocol, reason }),
    }
}

impl<T> Progress<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Progress<U> {
        match self {
            Self::NeedMore => Progress::NeedMore,
            Self::Done(t) => Progress::Done(f(t)),
            Self::Malformed(r) => Progress::Malformed(r),
        }
    }
}

/// Read from `stream` until its first message says what it is, starting with `initial` (bytes
/// already read). Returns the verdict and every byte read, `initial` included, which the caller must
/// forward before relaying the rest.
pub async fn sniff<S: AsyncRead + Unpin>(
    stream: &mut S,
    initial: Vec<u8>,
    limits: SniffLimits,
) -> Result<(Sniffed, Vec<u8>), SniffError> {
    let mut buf = initial;
    if buf.is_empty() {
        buf.reserve(1024);
        let first =
            tokio::time::timeout(limits.first_byte, read_some(stream, &mut buf, limits.max_bytes)).await;
        match first {
            Err(_) => return Ok((Sniffed::Opaque, buf)),
            Ok(r) => r?,
        }
    }
    let rest = async {
        loop {
            if let Some(s) = classify(&buf)? {
                return Ok(s);
            }
            if buf.len() >= limits.max_bytes {
                return Err(SniffError::TooLong {
                    max: limits.max_bytes,
                });
            }
            read_some(stream, &mut buf, limits.max_bytes).await?;
        }
    };
    match tokio::time::timeout(limits.total, rest).await {
        Ok(Ok(s)) => Ok((s, buf)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(SniffError::Timeout),
    }
}

async fn read_some<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    max: usize,
) -> Result<(), SniffError> {
    let start = buf.len();
    // Grow in small steps: the buffer is kept as the connection's prefix.
    buf.resize((start + 4096).min(max).max(start + 1), 0);
    let n = stream.read(&mut buf[start..]).await.map_err(SniffError::Read);
    let n = match n {
        Ok(n) => n,
        Err(e) => {
            buf.truncate(start);
            return Err(e);
        }
    };
    buf.truncate(start + n);
    if n == 0 {
        return Err(SniffError::Truncated { read: start });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;

    fn client_hello(name: &str) -> Vec<u8> {
        let roots = rustls::RootCertStore::empty();
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        let server = rustls::pki_types::ServerName::try_from(name.to_owned()).expect("server name");
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server).expect("client");
        let mut out = Vec::new();
        conn.write_tls(&mut out).expect("hello");
        out
    }

    fn name(s: &str) -> DomainName {
        s.parse().expect("name")
    }

    #[test]
    fn finds_sni_in_a_real_client_hello_and_waits_for_all_of_it() {
        let hello = client_hello("api.example.com");
        assert_eq!(
            classify(&hello).expect("ok"),
            Some(Sniffed::Tls(Some(name("api.example.com"))))
        );
        for cut in [1, 4, 5, 40, hello.len() - 1] {
            assert_eq!(
                classify(&hello[..cut]).expect("prefix is fine"),
                None,
                "cut at {cut}"
            );
        }
        // An IP address as the server name: rustls sends no SNI.
        assert_eq!(
            classify(&client_hello("192.0.2.1")).expect("ok"),
            Some(Sniffed::Tls(None))
        );
    }

    #[test]
    fn reassembles_a_client_hello_split_across_records() {
        let hello = client_hello("split.example.com");
        let body = &hello[5..];
        let (a, b) = body.split_at(100);
        let mut split = Vec::new();
        for part in [a, b] {
            split.extend_from_slice(&[0x16, 3, 1]);
            split.extend_from_slice(&u16::try_from(part.len()).expect("len").to_be_bytes());
            split.extend_from_slice(part);
        }
        assert_eq!(
            classify(&split).expect("ok"),
            Some(Sniffed::Tls(Some(name("split.example.com"))))
        );
    }

    #[test]
    fn reads_the_http_host() {
        let req = b"GET /x HTTP/1.1\r\nHost: Example.COM:8080\r\nAccept: */*\r\n\r\n";
        assert_eq!(
            classify(req).expect("ok"),
            Some(Sniffed::Http(Some(name("example.com"))))
        );
        assert_eq!(classify(&req[..20]).expect("ok"), None);
        let ip = b"GET / HTTP/1.1\r\nHost: 192.0.2.1\r\n\r\n";
        assert_eq!(classify(ip).expect("ok"), Some(Sniffed::Http(None)));
        let v6 = b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n";
        assert_eq!(classify(v6).expect("ok"), Some(Sniffed::Http(None)));
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: bad_host!\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: [nope]\r\n\r\n",
            b"GET / HTTQ/1.1\r\n\r\n",
        ] {
            assert!(
                classify(bad).is_err(),
                "{:?} accepted",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            classify(b"SSH-2.0-OpenSSH_9.2\r\n").expect("ok"),
            Some(Sniffed::Opaque)
        );
        assert_eq!(classify(b"GE").expect("ok"), None);
        assert_eq!(classify(b"\x00\x01binary").expect("ok"), Some(Sniffed::Opaque));
    }

    #[tokio::test]
    async fn sniff_returns_every_byte_read_and_bounds_reading() {
        let hello = client_hello("bounded.example.com");
        let (mut a, mut b) = tokio::io::duplex(64);
        let h = hello.clone();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for chunk in h.chunks(7) {
                b.write_all(chunk).await.expect("write");
            }
            b
        });
        let (s, bytes) = sniff(&mut a, Vec::new(), SniffLimits::default())
            .await
            .expect("sniff");
        assert_eq!(s, Sniffed::Tls(Some(name("bounded.example.com"))));
        assert_eq!(bytes, hello);
        drop(writer.await.expect("writer"));

        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        {
            use tokio::io::AsyncWriteExt;
            b.write_all(&hello[..hello.len() - 1]).await.expect("write");
        }
        let limits = SniffLimits {
            max_bytes: 64,
            ..SniffLimits::default()
        };
        assert!(matches!(
            sniff(&mut a, Vec::new(), limits).await,
            Err(SniffError::TooLong { max: 64 })
        ));
        drop(b);

        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        {
            use tokio::io::AsyncWriteExt;
            b.write_all(b"GET / HTTP/1.1\r\nHo").await.expect("write");
        }
        drop(b);
        assert!(matches!(
            sniff(&mut a, Vec::new(), SniffLimits::default()).await,
            Err(SniffError::Truncated { read: 18 })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_opaque_and_a_stalled_one_times_out() {
        let (mut a, _b) = tokio::io::duplex(64);
        assert_eq!(
            sniff(&mut a, Vec::new(), SniffLimits::default())
                .await
                .expect("silent")
                .0,
            Sniffed::Opaque
        );
        let (mut a, mut b) = tokio::io::duplex(64);
        {
            use tokio::io::AsyncWriteExt;
            b.write_all(b"\x16\x03\x01").await.expect("write");
        }
        assert!(matches!(
            sniff(&mut a, Vec::new(), SniffLimits::default()).await,
            Err(SniffError::Timeout)
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            let _ = classify(&bytes);
        }

        #[test]
        fn mutated_client_hellos_never_panic(pos in any::<prop::sample::Index>(), byte in any::<u8>(),
                                             cut in any::<prop::sample::Index>()) {
            let mut hello = client_hello("fuzz.example.com");
            let at = pos.index(hello.len());
            hello[at] = byte;
            let end = cut.index(hello.len() + 1);
            let _ = classify(&hello[..end]);
        }

        #[test]
        fn arbitrary_http_heads_never_panic(head in "[A-Z]{1,7} [ -~]{0,40} HTTP/1\\.[01]\r\n([ -~]{0,30}\r\n){0,4}\r\n") {
            let _ = classify(head.as_bytes());
        }
    }
}

//! Benchmark of the egress proxy on loopback (figures in `bench/README.md`):
//!
//! - latency of an HTTPS request, direct and through the proxy (explicit CONNECT and the transparent
//!   door; relayed, and intercepted for credential injection), for a new connection each time and
//!   for a request on a kept-alive connection;
//! - relay throughput of one tunnel;
//! - memory per idle tunnel (1,000 of them).
//!
//! `cargo run --release -p paddock-egress --example egress_bench [-- ITERATIONS]`

#![allow(clippy::unwrap_used, reason = "benchmark harness")]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use paddock_egress::policy::{OperatorAllow, OperatorPolicy};
use paddock_egress::{Egress, EgressConfig, SandboxEgress, Secret, SecretBinding};
use paddock_types::SandboxId;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use zeroize::Zeroizing;

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

async fn read_head<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> bool {
    buf.clear();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

/// HTTPS server answering every request with a small fixed body.
async fn https_server(issuer: &CertifiedIssuer<'static, KeyPair>) -> SocketAddr {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["api.bench".into(), "inject.bench".into()])
        .unwrap()
        .signed_by(&key, issuer)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            s.set_nodelay(true).unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                let mut buf = Vec::new();
                while read_head(&mut tls, &mut buf).await {
                    let body = b"{\"ok\":true}";
                    let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                    let mut out = resp.into_bytes();
                    out.extend_from_slice(body);
                    if tls.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A server that writes `bytes` of zeros to every connection (throughput source), or echoes nothing
/// and holds the connection (idle sink) when `bytes` is 0.
async fn source_server(bytes: u64) -> SocketAddr {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                if bytes == 0 {
                    let mut b = [0u8; 1];
                    let _ = s.read(&mut b).await;
                    return;
                }
                let chunk = vec![0u8; 256 * 1024];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    if s.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n as u64;
                }
            });
        }
    });
    addr
}

fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

async fn connect_tunnel(proxy: SocketAddr, authority: &str) -> TcpStream {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    // Byte by byte: what follows the proxy's answer belongs to the tunnel.
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).await.unwrap(), 1, "proxy closed");
        buf.push(byte[0]);
    }
    assert!(
        buf.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf)
    );
    s
}

/// One request on `tls`; panics unless the answer is a 200 with the expected body.
async fn one_request<S: AsyncRead + AsyncWrite + Unpin>(tls: &mut S, host: &str, buf: &mut Vec<u8>) {
    let req =
        format!("GET /v1/x HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer paddock-secret:TOKEN\r\n\r\n");
    tls.write_all(req.as_bytes()).await.unwrap();
    assert!(read_head(tls, buf).await);
    // The body (11 bytes) may have arrived with the head.
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut have = buf.len() - end;
    let mut b = [0u8; 64];
    while have < 11 {
        have += tls.read(&mut b).await.unwrap();
    }
    assert!(
        buf.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(buf)
    );
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Direct,
    Proxy,
    ProxyInject,
    Transparent,
    TransparentInject,
}

struct Setup {
    egress: Arc<Egress>,
    sandbox: SandboxId,
    out: SandboxEgress,
    server: SocketAddr,
    upstream: Arc<rustls::ClientConfig>,
    sandbox_trust: Arc<rustls::ClientConfig>,
}

impl Setup {
    async fn open(&self, path: Path) -> tokio_rustls::client::TlsStream<TcpStream> {
        let port = self.server.port();
        let (tcp, host, config) = match path {
            Path::Direct => {
                let s = TcpStream::connect(self.server).await.unwrap();
                s.set_nodelay(true).unwrap();
                (s, "api.bench", &self.upstream)
            }
            Path::Proxy => (
                connect_tunnel(self.out.proxy_addr, &format!("api.bench:{port}")).await,
                "api.bench",
                &self.upstream,
            ),
            Path::ProxyInject => (
                connect_tunnel(self.out.proxy_addr, &format!("inject.bench:{port}")).await,
                "inject.bench",
                &self.sandbox_trust,
            ),
            Path::Transparent | Path::TransparentInject => {
                // Stand-in for the netfilter redirect: a loopback connection handed to the proxy with
                // its original destination.
                let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
                let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
                client.set_nodelay(true).unwrap();
                let (proxy_end, _) = listener.accept().await.unwrap();
                let (egress, id, server) = (self.egress.clone(), self.sandbox.clone(), self.server);
                tokio::spawn(async move { egress.serve_intercepted(&id, proxy_end, server).await });
                if path == Path::Transparent {
                    (client, "api.bench", &self.upstream)
                } else {
                    (client, "inject.bench", &self.sandbox_trust)
                }
            }
        };
        tokio_rustls::TlsConnector::from(config.clone())
            .connect(ServerName::try_from(host.to_owned()).unwrap(), tcp)
            .await
            .unwrap()
    }

    fn host(path: Path) -> &'static str {
        match path {
            Path::ProxyInject | Path::TransparentInject => "inject.bench",
            _ => "api.bench",
        }
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4
}

async fn dns_pin(dns: SocketAddr, name: &str) {
    let sock = UdpSocket::bind((LOOPBACK, 0)).await.unwrap();
    let mut m = Message::new();
    m.set_id(1)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    sock.send_to(&m.to_vec().unwrap(), dns).await.unwrap();
    let mut buf = [0u8; 512];
    sock.recv(&mut buf).await.unwrap();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let iterations: usize = std::env::args().nth(1).map_or(2000, |s| s.parse().unwrap());
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let server = https_server(&issuer).await;
    let source = source_server(4 << 30).await;
    let idle = source_server(0).await;

    let mut operator = OperatorPolicy::default();
    operator.allow.push(OperatorAllow {
        cidr: "127.0.0.1".parse().unwrap(),
        ports: vec![],
        reason: "benchmark servers".into(),
    });
    for name in ["api.bench", "inject.bench", "bulk.bench"] {
        operator.hosts.insert(name.parse().unwrap(), vec![LOOPBACK]);
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let config = EgressConfig {
        operator,
        system_resolver: false,
        public_roots: false,
        upstream_ca_pems: vec![issuer.pem()],
        ..EgressConfig::default()
    };
    let egress = Arc::new(Egress::new(config, Arc::new(tx)).unwrap());
    let sandbox: SandboxId = "bench".parse().unwrap();
    let policy = serde_json::from_str(r#"{"allow":[{"domain":"*.bench"},{"cidr":"127.0.0.1"}]}"#).unwrap();
    let out = egress
        .add_sandbox(sandbox.clone(), policy, LOOPBACK)
        .await
        .unwrap();
    let secret = Secret::new(
        "TOKEN".parse().unwrap(),
        Zeroizing::new("sk-bench-0123456789".into()),
        SecretBinding::new(vec!["inject.bench".parse().unwrap()], None, false).unwrap(),
    )
    .unwrap();
    egress.set_secrets(&sandbox, vec![secret]).unwrap();
    dns_pin(out.dns_addr, "api.bench.").await;
    dns_pin(out.dns_addr, "inject.bench.").await;
    let setup = Setup {
        egress: egress.clone(),
        sandbox: sandbox.clone(),
        out: out.clone(),
        server,
        upstream: client_config(&issuer.pem()),
        sandbox_trust: client_config(&out.ca_pem),
    };

    println!("HTTPS request latency on loopback, {iterations} iterations each (p50 / p90, added = p50 - direct p50)");
    let paths = [
        Path::Direct,
        Path::Proxy,
        Path::ProxyInject,
        Path::Transparent,
        Path::TransparentInject,
    ];
    // Interleaved (one of each path in turn), so load from elsewhere on the machine hits all alike.
    let mut buf = Vec::new();
    let mut fresh: Vec<Vec<Duration>> = vec![Vec::with_capacity(iterations); paths.len()];
    let mut kept: Vec<Vec<Duration>> = vec![Vec::with_capacity(iterations); paths.len()];
    let mut open = Vec::new();
    for path in paths {
        // Warm up (the intercepted host's leaf certificate is issued and cached).
        for _ in 0..20 {
            let mut tls = setup.open(path).await;
            one_request(&mut tls, Setup::host(path), &mut buf).await;
        }
        open.push(setup.open(path).await);
    }
    for _ in 0..iterations {
        for (i, path) in paths.iter().enumerate() {
            let t = Instant::now();
            let mut tls = setup.open(*path).await;
            one_request(&mut tls, Setup::host(*path), &mut buf).await;
            fresh[i].push(t.elapsed());
            let t = Instant::now();
            one_request(&mut open[i], Setup::host(*path), &mut buf).await;
            kept[i].push(t.elapsed());
        }
    }
    let (d_fresh, d_kept) = (pct(&mut fresh[0], 0.5), pct(&mut kept[0], 0.5));
    for (i, path) in paths.iter().enumerate() {
        let (f50, f90) = (pct(&mut fresh[i], 0.5), pct(&mut fresh[i], 0.9));
        let (k50, k90) = (pct(&mut kept[i], 0.5), pct(&mut kept[i], 0.9));
        println!(
            "  {:<18} new connection {:>7.1} / {:>7.1} us (added {:>6.1})   kept-alive {:>6.1} / {:>6.1} us (added {:>6.1})",
            format!("{path:?}"),
            us(f50),
            us(f90),
            us(f50) - us(d_fresh),
            us(k50),
            us(k90),
            us(k50) - us(d_kept),
        );
    }
    drop(open);

    println!("Relay throughput, one connection, 4 GiB from a loopback source");
    for via_proxy in [false, true] {
        let mut s = if via_proxy {
            connect_tunnel(out.proxy_addr, &format!("bulk.bench:{}", source.port())).await
        } else {
            TcpStream::connect(source).await.unwrap()
        };
        let mut chunk = vec![0u8; 256 * 1024];
        let t = Instant::now();
        let mut total = 0u64;
        loop {
            let n = s.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(total, 4 << 30, "bytes lost");
        println!(
            "  {:<8} {:>6.2} GB/s ({} bytes in {:.2} s)",
            if via_proxy { "proxy" } else { "direct" },
            total as f64 / secs / 1e9,
            total,
            secs
        );
    }

    println!("Memory for 1,000 idle connections (process RSS growth)");
    // Proxied first: the direct run then reuses memory the allocator kept, so the proxy's share is
    // overestimated rather than under.
    let mut results = Vec::new();
    for via_proxy in [true, false] {
        let before = rss_kib();
        let mut conns = Vec::with_capacity(1000);
        for _ in 0..1000 {
            let s = if via_proxy {
                connect_tunnel(out.proxy_addr, &format!("bulk.bench:{}", idle.port())).await
            } else {
                TcpStream::connect(idle).await.unwrap()
            };
            conns.push(s);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let grown = rss_kib().saturating_sub(before);
        results.push(grown);
        println!(
            "  {:<8} +{} KiB ({:.1} KiB per connection)",
            if via_proxy { "proxy" } else { "direct" },
            grown,
            grown as f64 / 1000.0
        );
        drop(conns);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    println!(
        "  proxy's share: {:.1} KiB per idle tunnel (two sockets, two tasks, relay buffers)",
        results[0].saturating_sub(results[1]) as f64 / 1000.0
    );
    egress.remove_sandbox(&sandbox).unwrap();
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

//! The owner's handle: one `Egress` serves many sandboxes, each on its own listener addresses (which
//! is how a connection is tied to its sandbox). Policies and secrets change live: every new
//! connection and DNS question reads the current ones.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use paddock_types::{DomainName, NetworkPolicy, SandboxId};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditSink, Door};
use crate::error::EgressError;
use crate::inject::{SandboxCa, SandboxCaKey, Secret, SecretSet};
use crate::limits::{descriptor_budget, soft_nofile, Admission, EgressLimits, Entry, Limit, SandboxLimits};
use crate::pins::Pins;
use crate::policy::OperatorPolicy;
use crate::resolve::Resolver;
use crate::sniff::SniffLimits;
use crate::{dns, proxy};

/// Process-wide configuration of the egress proxy.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// The operator's deny list, exceptions and host map.
    pub operator: OperatorPolicy,
    /// Resolve names absent from the host map with the system resolver (off in tests: only the host
    /// map answers, and nothing leaves the machine).
    pub system_resolver: bool,
    /// Bounds on reading the first bytes of a transparent connection.
    pub sniff: SniffLimits,
    /// Relay buffer size, each way, per connection.
    pub relay_buffer: usize,
    /// How long connecting upstream may take.
    pub connect_timeout: Duration,
    /// Trust the public web PKI roots (webpki-roots) for intercepted upstream connections.
    pub public_roots: bool,
    /// More CA certificates (PEM) trusted for intercepted upstream connections.
    pub upstream_ca_pems: Vec<String>,
    /// What sandboxes can make the proxy hold.
    pub limits: EgressLimits,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            operator: OperatorPolicy::default(),
            system_resolver: true,
            sniff: SniffLimits::default(),
            relay_buffer: 32 * 1024,
            connect_timeout: Duration::from_secs(10),
            public_roots: true,
            upstream_ca_pems: Vec::new(),
            limits: EgressLimits::default(),
        }
    }
}

/// What a sandbox is given: where its proxy variables, its intercepted TCP and its DNS go, and the CA
/// certificate it must trust.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxEgress {
    /// `HTTP_PROXY`/`HTTPS_PROXY` (CONNECT and absolute-form HTTP).
    pub proxy_addr: SocketAddr,
    /// Where intercepted TCP is redirected (the original destination comes from `SO_ORIGINAL_DST`).
    pub transparent_addr: SocketAddr,
    /// The sandbox's DNS server (UDP and TCP on the same port).
    pub dns_addr: SocketAddr,
    /// The per-sandbox CA certificate (PEM) used to intercept TLS to hosts a secret is bound to.
    pub ca_pem: String,
}

/// Where a sandbox's listeners bind: one address (which says which sandbox a connection is from) and
/// a port for each door (0: any free port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxListen {
    /// The address, in the proxy's network namespace (the host side of the sandbox's link).
    pub ip: IpAddr,
    /// The explicit proxy's port.
    pub proxy_port: u16,
    /// The transparent listener's port.
    pub transparent_port: u16,
    /// The DNS port (UDP and TCP).
    pub dns_port: u16,
}

impl SandboxListen {
    /// The doors on the host side of a sandbox's link, on the given ports.
    pub fn on_link(link: &paddock_types::NetworkLink, ports: &paddock_types::EgressPorts) -> Self {
        Self {
            ip: link.host_ip.into(),
            proxy_port: ports.proxy,
            transparent_port: ports.transparent,
            dns_port: ports.dns,
        }
    }

    /// Every door on `ip`, on free ports.
    pub fn any_port(ip: IpAddr) -> Self {
        Self {
            ip,
            proxy_port: 0,
            transparent_port: 0,
            dns_port: 0,
        }
    }
}

/// Everything the proxy tasks share across sandboxes.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) operator: OperatorPolicy,
    pub(crate) resolver: Resolver,
    pub(crate) audit: Arc<dyn AuditSink>,
    pub(crate) sniff: SniffLimits,
    pub(crate) relay_buffer: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) upstream_tls: Arc<rustls::ClientConfig>,
    pub(crate) provider: Arc<rustls::crypto::CryptoProvider>,
    pub(crate) limits: EgressLimits,
    /// Descriptors sandbox connections may still take (all sandboxes together).
    pub(crate) descriptors: Arc<Semaphore>,
    /// How many descriptors that budget started with.
    descriptor_budget: usize,
    /// Who is asked about destinations a sandbox's approval policy holds for a person (unset:
    /// nobody; they are refused as any uncovered destination).
    pub(crate) asker: std::sync::OnceLock<Arc<dyn crate::NetworkAsker>>,
}

/// One sandbox's live state.
#[derive(Debug)]
pub(crate) struct Sandbox {
    pub(crate) id: SandboxId,
    policy: RwLock<Arc<NetworkPolicy>>,
    secrets: RwLock<Arc<SecretSet>>,
    pins: Mutex<Pins>,
    pub(crate) ca: SandboxCa,
    pub(crate) token: CancellationToken,
    pub(crate) limits: SandboxLimits,
}

impl Sandbox {
    /// Counts a refusal at `limit` (reported in [`RefusalRecord`](crate::RefusalRecord)s).
    pub(crate) fn refused(&self, shared: &Shared, limit: Limit) {
        self.limits.refused(
            &self.id,
            limit,
            shared.limits.refusal_window,
            shared.audit.as_ref(),
        );
    }
    /// Admits a connection the sandbox opened to one of its listeners, or (over a cap) resets it at
    /// once, so the sandbox fails fast and the listener goes on, and counts the refusal.
    pub(crate) fn admit_or_reset(
        &self,
        shared: &Shared,
        stream: TcpStream,
        entry: Entry,
    ) -> Result<(TcpStream, Admission), Limit> {
        match self.limits.admit(&shared.descriptors, entry) {
            Ok(admission) => Ok((stream, admission)),
            Err(limit) => {
                proxy::reset(stream);
                self.refused(shared, limit);
                Err(limit)
            }
        }
    }
    /// The addresses of `name` (the operator's hosts, or a lookup holding one of the sandbox's
    /// places), or `None` when the sandbox's lookups are at their cap: counted as a refusal there.
    pub(crate) async fn resolve(&self, shared: &Shared, name: &DomainName) -> Option<Vec<IpAddr>> {
        let resolved = shared
            .resolver
            .resolve(&shared.operator, name, &self.limits.resolutions)
            .await;
        if resolved.is_err() {
            self.refused(shared, Limit::Resolutions);
        }
        resolved.ok()
    }
    pub(crate) fn policy(&self) -> Arc<NetworkPolicy> {
        self.policy.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub(crate) fn secrets(&self) -> Arc<SecretSet> {
        self.secrets.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub(crate) fn pin(&self, name: &DomainName, ips: &[IpAddr], ttl: Duration) {
        self.pins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pin(name, ips, ttl, Instant::now());
    }
    pub(crate) fn is_pinned(&self, name: &DomainName, ip: IpAddr) -> bool {
        self.pins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_pinned(name, ip, Instant::now())
    }
}

/// The egress proxy of one host: many sandboxes, each with its listeners.
#[derive(Debug)]
pub struct Egress {
    shared: Arc<Shared>,
    sandboxes: Mutex<HashMap<SandboxId, Arc<Sandbox>>>,
}

impl Egress {
    /// An egress proxy with no sandboxes; records go to `audit`.
    pub fn new(config: EgressConfig, audit: Arc<dyn AuditSink>) -> Result<Self, EgressError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        if config.public_roots {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        for (index, pem) in config.upstream_ca_pems.iter().enumerate() {
            use rustls::pki_types::pem::PemObject;
            let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|_| EgressError::UpstreamCa { index })?;
            if certs.is_empty() {
                return Err(EgressError::UpstreamCa { index });
            }
            for c in certs {
                roots.add(c).map_err(|_| EgressError::UpstreamCa { index })?;
            }
        }
        let mut upstream = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|source| EgressError::Tls {
                what: "upstream client configuration",
                source,
            })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        let descriptor_budget = config
            .limits
            .descriptors
            .unwrap_or_else(|| descriptor_budget(soft_nofile()))
            .clamp(1, Semaphore::MAX_PERMITS);
        tracing::info!(descriptors = descriptor_budget, "egress descriptor budget");
        Ok(Self {
            shared: Arc::new(Shared {
                resolver: Resolver::new(config.system_resolver, config.limits.resolutions),
                descriptors: Arc::new(Semaphore::new(descriptor_budget)),
                descriptor_budget,
                limits: config.limits,
                operator: config.operator,
                audit,
                sniff: config.sniff,
                relay_buffer: config.relay_buffer.max(1024),
                connect_timeout: config.connect_timeout,
                upstream_tls: Arc::new(upstream),
                provider,
                asker: std::sync::OnceLock::new(),
            }),
            sandboxes: Mutex::new(HashMap::new()),
        })
    }

    /// Sets who is asked about destinations held for a person (once; later calls are ignored).
    pub fn set_asker(&self, asker: Arc<dyn crate::NetworkAsker>) {
        let _ = self.shared.asker.set(asker);
    }

    /// Start serving sandbox `id` under `policy`, with listeners on `bind` (free ports) and a fresh CA.
    pub async fn add_sandbox(
        &self,
        id: SandboxId,
        policy: NetworkPolicy,
        bind: IpAddr,
    ) -> Result<SandboxEgress, EgressError> {
        let ca = SandboxCaKey::generate(&id)?;
        self.add_sandbox_at(id, policy, SandboxListen::any_port(bind), &ca)
            .await
    }

    /// Start serving sandbox `id` under `policy`, with listeners where `listen` says and `ca` as the
    /// CA its intercepted connections are presented under.
    #[tracing::instrument(skip_all, fields(sandbox_id = %id))]
    pub async fn add_sandbox_at(
        &self,
        id: SandboxId,
        policy: NetworkPolicy,
        listen: SandboxListen,
        ca: &SandboxCaKey,
    ) -> Result<SandboxEgress, EgressError> {
        if self.lock().contains_key(&id) {
            return Err(EgressError::SandboxExists { id });
        }
        let bind_tcp = |what, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| EgressError::Bind { what, addr, source })
        };
        let at = |port| SocketAddr::new(listen.ip, port);
        let proxy_listener = bind_tcp("proxy", at(listen.proxy_port)).await?;
        let transparent_listener = bind_tcp("transparent", at(listen.transparent_port)).await?;
        let (udp, dns_tcp) = bind_dns(at(listen.dns_port)).await?;
        let local = |l: &TcpListener, what| {
            l.local_addr().map_err(|source| EgressError::Bind {
                what,
                addr: at(0),
                source,
            })
        };
        let ca = SandboxCa::new(&id, ca, self.shared.provider.clone())?;
        let sandbox = Arc::new(Sandbox {
            id: id.clone(),
            policy: RwLock::new(Arc::new(policy)),
            secrets: RwLock::new(Arc::new(SecretSet::default())),
            pins: Mutex::new(Pins::default()),
            ca,
            token: CancellationToken::new(),
            limits: SandboxLimits::new(&self.shared.limits),
        });
        let out = SandboxEgress {
            proxy_addr: local(&proxy_listener, "proxy")?,
            transparent_addr: local(&transparent_listener, "transparent")?,
            dns_addr: local(&dns_tcp, "dns (tcp)")?,
            ca_pem: sandbox.ca.pem(),
        };
        {
            let mut map = self.lock();
            if map.contains_key(&id) {
                return Err(EgressError::SandboxExists { id });
            }
            map.insert(id, sandbox.clone());
        }
        let shared = &self.shared;
        tokio::spawn(proxy::accept_loop(
            shared.clone(),
            sandbox.clone(),
            proxy_listener,
            Door::Proxy,
        ));
        tokio::spawn(proxy::accept_loop(
            shared.clone(),
            sandbox.clone(),
            transparent_listener,
            Door::Transparent,
        ));
        tokio::spawn(dns::serve_udp(shared.clone(), sandbox.clone(), udp));
        tokio::spawn(dns::serve_tcp(shared.clone(), sandbox.clone(), dns_tcp));
        tokio::spawn(report_refusals(shared.clone(), sandbox));
        tracing::info!(proxy = %out.proxy_addr, transparent = %out.transparent_addr, dns = %out.dns_addr, "sandbox egress started");
        Ok(out)
    }

    /// Replace the sandbox's policy; connections and questions from now on are decided by it.
    /// Established connections are not re-judged.
    pub fn set_policy(&self, id: &SandboxId, policy: NetworkPolicy) -> Result<(), EgressError> {
        let sandbox = self.get(id)?;
        *sandbox.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
        Ok(())
    }

    /// Replace the sandbox's secrets.
    pub fn set_secrets(&self, id: &SandboxId, secrets: Vec<Secret>) -> Result<(), EgressError> {
        let sandbox = self.get(id)?;
        *sandbox.secrets.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(SecretSet::new(secrets));
        Ok(())
    }

    /// Stop serving the sandbox: its listeners close and its open connections are cut (each still
    /// audited).
    pub fn remove_sandbox(&self, id: &SandboxId) -> Result<(), EgressError> {
        let sandbox = self
            .lock()
            .remove(id)
            .ok_or_else(|| EgressError::UnknownSandbox { id: id.clone() })?;
        sandbox.token.cancel();
        tracing::info!(sandbox_id = %id, "sandbox egress stopped");
        Ok(())
    }

    /// Serve one intercepted connection whose original destination the caller already knows. The
    /// transparent listener does this with `SO_ORIGINAL_DST`; a caller using another interception
    /// mechanism (TPROXY, where the local address is the destination) passes it here.
    pub async fn serve_intercepted(
        &self,
        id: &SandboxId,
        stream: TcpStream,
        original_dst: SocketAddr,
    ) -> Result<(), EgressError> {
        let sandbox = self.get(id)?;
        let (stream, admission) = sandbox
            .admit_or_reset(&self.shared, stream, Entry::Door(Door::Transparent))
            .map_err(|limit| EgressError::AtCap {
                id: id.clone(),
                limit,
            })?;
        proxy::run_connection(
            self.shared.clone(),
            sandbox,
            stream,
            Door::Transparent,
            Some(original_dst),
            admission,
        )
        .await;
        Ok(())
    }

    /// Descriptors sandbox connections hold now, and the budget (all sandboxes together).
    pub fn descriptors_in_use(&self) -> (usize, usize) {
        let budget = self.shared.descriptor_budget;
        (
            budget - self.shared.descriptors.available_permits().min(budget),
            budget,
        )
    }

    /// The shared state and a sandbox's, for unit tests of the tasks that serve it.
    #[cfg(test)]
    pub(crate) fn parts_for_tests(&self, id: &SandboxId) -> (Arc<Shared>, Arc<Sandbox>) {
        (self.shared.clone(), self.get(id).expect("a served sandbox"))
    }

    fn get(&self, id: &SandboxId) -> Result<Arc<Sandbox>, EgressError> {
        self.lock()
            .get(id)
            .cloned()
            .ok_or_else(|| EgressError::UnknownSandbox { id: id.clone() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Arc<Sandbox>>> {
        self.sandboxes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        for sandbox in self.lock().values() {
            sandbox.token.cancel();
        }
    }
}

/// Reports a sandbox's refusals at its caps once per window, and what is left when it goes.
async fn report_refusals(shared: Arc<Shared>, sandbox: Arc<Sandbox>) {
    let window = shared.limits.refusal_window.max(Duration::from_millis(100));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + window, window);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = sandbox.token.cancelled() => break,
            _ = tick.tick() => sandbox.limits.flush(&sandbox.id, shared.audit.as_ref()),
        }
    }
    sandbox.limits.flush(&sandbox.id, shared.audit.as_ref());
}

/// A UDP socket and a TCP listener on the same port (retrying when the TCP port is taken).
async fn bind_dns(any: SocketAddr) -> Result<(UdpSocket, TcpListener), EgressError> {
    let mut last = None;
    for _ in 0..16 {
        let udp = UdpSocket::bind(any).await.map_err(|source| EgressError::Bind {
            what: "dns (udp)",
            addr: any,
            source,
        })?;
        let addr = udp.local_addr().map_err(|source| EgressError::Bind {
            what: "dns (udp)",
            addr: any,
            source,
        })?;
        match TcpListener::bind(addr).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last = Some((addr, e)),
        }
    }
    let (addr, source) = last.expect("the loop ran");
    Err(EgressError::Bind {
        what: "dns (tcp)",
        addr,
        source,
    })
}

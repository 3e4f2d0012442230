//! Networked sandboxes (`SandboxSpec::network`), driving the native backend directly. The test
//! stands in for the egress proxy: after creating a sandbox it binds listeners on the link's host
//! address, and every property is checked by trying to break it from inside the sandbox. Only
//! loopback and TEST-NET destinations (192.0.2.0/24, 198.51.100.0/24) are used, which the
//! sandbox's firewall captures on this host: nothing leaves the machine. Each test cuts its links
//! from a subnet of its own (slots are shared by every pool on the host, addresses are not), and
//! ends by checking that no interface, firewall table, namespace pin, sandbox or process is left.
//! Below: what the tests share and what a link lets through; its lifecycle and connection tracking
//! in the modules.

mod conntrack;
mod lifecycle;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use paddock_protocol::{CommandSpec, SpawnRequest, Stream};
use paddock_runtime::agent_client::{AgentClient, ProcessEvent};
use paddock_runtime::native::{NativeBackend, NativeConfig};
use paddock_runtime::{Adoption, SandboxBackend, SandboxHandle, StorageBackend};
use paddock_types::{
    EgressPorts, MountSpec, NetworkLink, NetworkSpec, RootfsSpec, SandboxSpec, SnapshotId, VolumeSource,
    CA_BUNDLE_PATH, EGRESS_CA_PATH,
};

use crate::support::{connect, host_spec, skip, wait_until, GcOnDrop, TestEnv};

const TEST_CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBpaddocktestca\n-----END CERTIFICATE-----\n";

fn backend(env: &TestEnv, subnet: &str) -> NativeBackend {
    NativeBackend::open(NativeConfig {
        network_subnet: subnet.parse().expect("subnet"),
        ..env.native_config()
    })
    .expect("open the native backend")
}

/// Whether the host can make links; a loud skip when not.
fn require_network(backend: &NativeBackend) -> bool {
    if !backend.capabilities().network {
        skip("this host lacks ip (iproute2), nft (nftables) or util-linux");
        return false;
    }
    true
}

fn spec(id: &str) -> SandboxSpec {
    SandboxSpec {
        network: Some(NetworkSpec {
            ports: EgressPorts::default(),
            ca_pem: TEST_CA.to_owned(),
            conntrack: Default::default(),
        }),
        ..host_spec(id)
    }
}

fn link_of(handle: &SandboxHandle) -> NetworkLink {
    handle.network.expect("a networked sandbox has a link")
}

fn snapshot_id(s: &str) -> SnapshotId {
    s.parse().expect("snapshot id")
}

/// What a shell script (run as `user`, the default when `None`) printed, and its exit code.
async fn sh_as(client: &AgentClient, user: Option<&str>, script: &str) -> (i32, String) {
    let request = SpawnRequest {
        command: CommandSpec::Shell {
            script: script.to_owned(),
        },
        env: BTreeMap::from([("PATH".to_owned(), "/usr/sbin:/usr/bin:/sbin:/bin".to_owned())]),
        cwd: None,
        user: user.map(str::to_owned),
        stdin: false,
        pty: None,
        timeout_ms: Some(60_000),
        tag: None,
        detached: false,
    };
    let (_pid, mut events) = client.spawn(request).await.expect("spawn");
    let mut out = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(90), events.recv())
            .await
            .expect("the script ends in time");
        match event {
            Some(ProcessEvent::Output { stream, data, .. }) => {
                if stream == Stream::Stderr {
                    eprint!("{}", String::from_utf8_lossy(&data));
                }
                out.extend(data);
            }
            Some(ProcessEvent::Exited(status)) => {
                return (status.shell_code(), String::from_utf8_lossy(&out).into_owned());
            }
            None => panic!("events ended without an exit"),
        }
    }
}

async fn ok_as(client: &AgentClient, user: Option<&str>, script: &str) -> String {
    let (code, out) = sh_as(client, user, script).await;
    assert_eq!(code, 0, "{script}: {out}");
    out
}

/// A Python client run in the sandbox: one line per probe, `<probe> -> <what came back>`.
const PROBES: &str = r#"
import socket, sys, time
def tcp(host, port):
    try:
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(b"hello\n")
        print(f"tcp {host}:{port} -> {s.recv(200).decode().strip()}")
    except OSError as e:
        print(f"tcp {host}:{port} -> error {e.__class__.__name__}")
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(10)
    s.connect((host, port))
    start = time.monotonic()
    try:
        s.send(b"question")
        data, source = s.recvfrom(200)
        print(f"udp {host}:{port} -> {data.decode().strip()} from {source[0]}:{source[1]}")
    except OSError as e:
        fast = "fast" if time.monotonic() - start < 3 else "slow"
        print(f"udp {host}:{port} -> error {e.__class__.__name__} {fast}")
def tcp6(host, port):
    start = time.monotonic()
    try:
        socket.create_connection((host, port), timeout=10)
        print(f"tcp6 {host}:{port} -> connected")
    except OSError as e:
        fast = "fast" if time.monotonic() - start < 3 else "slow"
        print(f"tcp6 {host}:{port} -> error {e.__class__.__name__} {fast}")
for probe in sys.argv[1:]:
    kind, rest = probe.split(":", 1)
    host, port = rest.rsplit(":", 1)
    {"tcp": tcp, "udp": udp, "tcp6": tcp6}[kind](host, int(port))
"#;

/// Runs probes (`tcp:host:port`, `udp:host:port`, `tcp6:host:port`) in the sandbox as `user`.
async fn probe(client: &AgentClient, user: Option<&str>, probes: &[String]) -> String {
    let script = format!(
        "cat > /tmp/probes.py <<'EOF'\n{PROBES}\nEOF\npython3 /tmp/probes.py {}",
        probes.join(" ")
    );
    ok_as(client, user, &script).await
}

/// The line a probe printed.
fn line_of<'a>(output: &'a str, probe: &str) -> &'a str {
    let prefix = format!("{} ", probe.replacen(':', " ", 1));
    output
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no line for {probe} in:\n{output}"))
}

/// Listeners standing in for the egress proxy on a link's host address. Each TCP connection is
/// answered with `<door> <original destination>` (from `SO_ORIGINAL_DST`), each datagram with
/// `dns`.
struct FakeProxy {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl FakeProxy {
    fn start(link: &NetworkLink, extra: Vec<(&'static str, TcpListener)>) -> Self {
        let ports = EgressPorts::default();
        let host = link.host_ip;
        let bind = |port| TcpListener::bind((host, port)).expect("bind a proxy listener");
        let mut tcp = vec![
            ("proxy", bind(ports.proxy)),
            ("transparent", bind(ports.transparent)),
            ("dns-tcp", bind(ports.dns)),
        ];
        tcp.extend(extra);
        let udp = UdpSocket::bind((host, ports.dns)).expect("bind the DNS listener");
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (door, listener) in tcp {
            let stop = stop.clone();
            listener.set_nonblocking(true).expect("nonblocking");
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            stream.set_nonblocking(false).expect("blocking");
                            let original = rustix::net::sockopt::ip_original_dst(&stream)
                                .map_or_else(|e| format!("none({e})"), |a| a.to_string());
                            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                            let _ = stream.read(&mut [0u8; 64]);
                            let _ = stream.write_all(format!("{door} {original}\n").as_bytes());
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            }));
        }
        let stop_udp = stop.clone();
        threads.push(std::thread::spawn(move || {
            udp.set_read_timeout(Some(Duration::from_millis(20)))
                .expect("timeout");
            let mut buf = [0u8; 512];
            while !stop_udp.load(Ordering::Relaxed) {
                if let Ok((_, from)) = udp.recv_from(&mut buf) {
                    let _ = udp.send_to(b"dns\n", from);
                }
            }
        }));
        Self { stop, threads }
    }
}

impl Drop for FakeProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn interface_index(slot: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/pdk{slot}/ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The firewall table of `slot`, if there is one.
fn table(slot: u32) -> Option<String> {
    let out = std::process::Command::new("nft")
        .args(["list", "table", "inet", &format!("paddock_{slot}")])
        .output()
        .expect("run nft");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Everything the host made for a link, seen from the host.
struct Made {
    link: NetworkLink,
    ifindex: u32,
    pin: PathBuf,
}

fn made(env: &TestEnv, handle: &SandboxHandle) -> Made {
    let link = link_of(handle);
    let ifindex = interface_index(link.slot).expect("the host interface exists");
    let rules = table(link.slot).expect("the slot's table exists");
    assert!(rules.contains(&link.host_ip.to_string()), "{rules}");
    let pin = env.state().join("run").join(handle.id.as_str()).join("netns");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        mounts.lines().any(|l| l.contains(&format!("{} ", pin.display()))),
        "the namespace is pinned at {}",
        pin.display()
    );
    Made { link, ifindex, pin }
}

/// Asserts nothing of a link is left: its interface (unless another pool's, with another index, took
/// the slot since), its table (unless one of another subnet's link), its pin (also under the name its
/// run directory takes while its last teardown steps run in the background, `run/.gone-<id>-<n>`).
/// Those steps may still be running when a destroy returns: this waits for them, with a deadline.
fn assert_link_gone(m: &Made) {
    // `<state>/run/.gone-<id>-`: this environment's run directory only (other tests' sandboxes may
    // have the same id, and every mount of the host is in the mount table).
    let run_dir = m.pin.parent().expect("the pin is in a run directory");
    let id = run_dir.file_name().expect("a sandbox id").to_string_lossy();
    let gone = run_dir
        .with_file_name(format!(".gone-{id}-"))
        .display()
        .to_string();
    let pinned = || {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        mounts
            .lines()
            .any(|l| l.contains(&m.pin.display().to_string()) || l.contains(&gone))
    };
    let interface_left = || interface_index(m.link.slot) == Some(m.ifindex);
    let table_left = || table(m.link.slot).is_some_and(|rules| rules.contains(&m.link.host_ip.to_string()));
    wait_until(Duration::from_secs(60), || {
        !interface_left() && !table_left() && !pinned()
    });
    assert!(!interface_left(), "interface pdk{} left", m.link.slot);
    assert!(!table_left(), "table paddock_{} left", m.link.slot);
    assert!(
        std::fs::symlink_metadata(&m.pin).is_err(),
        "pin {} left",
        m.pin.display()
    );
    assert!(!pinned(), "pin still mounted");
}

async fn interfaces(client: &AgentClient) -> String {
    ok_as(
        client,
        None,
        "python3 -c 'import socket; print(sorted(n for _, n in socket.if_nameindex()))'",
    )
    .await
}

#[tokio::test]
async fn traffic_reaches_only_the_proxy_listeners() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.1.0/24");
    if !require_network(&backend) {
        return;
    }
    let handle = backend.create_sandbox(&spec("sb-1")).expect("create");
    let m = made(&env, &handle);
    let host = m.link.host_ip;
    // The host's own service on every address: the sandbox must not reach it.
    let wildcard = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("bind");
    let wildcard_port = wildcard.local_addr().expect("addr").port();
    let proxy = FakeProxy::start(&m.link, vec![("host-service", wildcard)]);
    let client = connect(&handle).await;
    let probes: Vec<String> = [
        "tcp:192.0.2.1:443".to_owned(),
        format!("tcp:{host}:{wildcard_port}"),
        format!("tcp:{host}:3128"),
        format!("tcp:{host}:53"),
        "tcp:198.51.100.1:53".to_owned(),
        "udp:198.51.100.1:53".to_owned(),
        format!("udp:{host}:53"),
        "udp:192.0.2.1:9999".to_owned(),
        format!("udp:{host}:9999"),
        "tcp6:2001:db8::1:443".to_owned(),
        "tcp6:64:ff9b::c000:201:443".to_owned(),
    ]
    .into();
    let out = probe(&client, None, &probes).await;
    eprintln!("{out}");
    assert_eq!(
        line_of(&out, "tcp:192.0.2.1:443"),
        "tcp 192.0.2.1:443 -> transparent 192.0.2.1:443"
    );
    assert_eq!(
        line_of(&out, &format!("tcp:{host}:{wildcard_port}")),
        format!("tcp {host}:{wildcard_port} -> transparent {host}:{wildcard_port}"),
        "the host's own service was reached"
    );
    assert!(line_of(&out, &format!("tcp:{host}:3128")).contains("-> proxy "));
    assert!(line_of(&out, &format!("tcp:{host}:53")).contains("-> dns-tcp "));
    assert_eq!(
        line_of(&out, "tcp:198.51.100.1:53"),
        "tcp 198.51.100.1:53 -> transparent 198.51.100.1:53"
    );
    assert_eq!(
        line_of(&out, "udp:198.51.100.1:53"),
        "udp 198.51.100.1:53 -> dns from 198.51.100.1:53"
    );
    assert_eq!(
        line_of(&out, &format!("udp:{host}:53")),
        format!("udp {host}:53 -> dns from {host}:53")
    );
    for refused in ["udp:192.0.2.1:9999".to_owned(), format!("udp:{host}:9999")] {
        let line = line_of(&out, &refused);
        assert!(line.contains("-> error") && line.ends_with(" fast"), "{line}");
    }
    for v6 in ["tcp6:2001:db8::1:443", "tcp6:64:ff9b::c000:201:443"] {
        let line = line_of(&out, v6);
        assert!(line.contains("-> error") && line.ends_with(" fast"), "{line}");
    }
    drop(proxy);
    drop(client);
    backend.destroy_sandbox(handle).expect("destroy");
    assert_link_gone(&m);
    env.assert_clean();
}

#[tokio::test]
async fn the_sandbox_root_cannot_change_its_network() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.2.0/24");
    if !require_network(&backend) {
        return;
    }
    let handle = backend.create_sandbox(&spec("sb-1")).expect("create");
    let m = made(&env, &handle);
    let proxy = FakeProxy::start(&m.link, Vec::new());
    let client = connect(&handle).await;
    let attempts = [
        "ip addr add 10.9.9.9/24 dev eth0",
        "ip addr del {sandbox}/30 dev eth0",
        "ip route del default",
        "ip route add 192.0.2.0/24 dev eth0",
        "ip link set eth0 down",
        "ip link set lo down",
        "ip link add dummy0 type dummy",
        "nft list ruleset",
        "nft flush ruleset",
        "nft add table inet mine",
        "sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'",
        "sh -c 'echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter'",
        "sh -c 'echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6'",
        "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'",
        "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)'",
    ];
    let script: String = attempts
        .iter()
        .map(|a| {
            let a = a.replace("{sandbox}", &m.link.sandbox_ip.to_string());
            format!(
                "if {a} >/dev/null 2>&1; then echo \"ALLOWED: {}\"; else echo refused; fi\n",
                a.replace(['\'', '"'], "")
            )
        })
        .collect();
    let out = ok_as(&client, Some("root"), &script).await;
    assert!(
        !out.contains("ALLOWED"),
        "the sandbox's root changed its network:\n{out}"
    );
    assert_eq!(
        out.lines().filter(|l| *l == "refused").count(),
        attempts.len(),
        "{out}"
    );
    // Nothing changed, and the network still works.
    let state = ok_as(&client, None, "ip -o addr show; ip route show").await;
    assert!(
        state.contains(&format!("inet {}/30", m.link.sandbox_ip)),
        "{state}"
    );
    assert!(
        state.contains(&format!("default via {}", m.link.host_ip)),
        "{state}"
    );
    assert!(!state.contains("10.9.9.9"), "{state}");
    let out = probe(&client, Some("root"), &["tcp:192.0.2.7:80".to_owned()]).await;
    assert_eq!(
        line_of(&out, "tcp:192.0.2.7:80"),
        "tcp 192.0.2.7:80 -> transparent 192.0.2.7:80"
    );
    assert!(table(m.link.slot).is_some_and(|t| t.contains("redirect to :15001")));
    drop(proxy);
    drop(client);
    backend.destroy_sandbox(handle).expect("destroy");
    assert_link_gone(&m);
    env.assert_clean();
}

#[tokio::test]
async fn two_sandboxes_get_their_own_links_and_files() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.3.0/24");
    if !require_network(&backend) {
        return;
    }
    let a = backend.create_sandbox(&spec("sb-a")).expect("create a");
    let b = backend.create_sandbox(&spec("sb-b")).expect("create b");
    let (ma, mb) = (made(&env, &a), made(&env, &b));
    assert_ne!(ma.link.slot, mb.link.slot);
    assert_ne!(ma.link.host_ip, mb.link.host_ip);
    assert_ne!(ma.link.sandbox_ip, mb.link.sandbox_ip);
    let system_bundle = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    for (handle, m) in [(&a, &ma), (&b, &mb)] {
        let client = connect(handle).await;
        assert_eq!(interfaces(&client).await.trim(), "['eth0', 'lo']");
        let resolv = ok_as(&client, None, "cat /etc/resolv.conf").await;
        assert!(
            resolv.contains(&format!("nameserver {}\n", m.link.host_ip)),
            "{resolv}"
        );
        assert_eq!(
            ok_as(&client, None, &format!("cat {EGRESS_CA_PATH}")).await,
            TEST_CA
        );
        let bundle = ok_as(&client, None, &format!("cat {CA_BUNDLE_PATH}")).await;
        assert!(bundle.starts_with(&system_bundle) && bundle.ends_with(TEST_CA));
        let system = ok_as(&client, None, "cat /etc/ssl/certs/ca-certificates.crt").await;
        assert_eq!(
            system, bundle,
            "clients that ignore SSL_CERT_FILE trust the CA too"
        );
        // The sandbox's own addresses, and the other sandbox is out of reach (redirected).
        let own = ok_as(&client, None, "ip -o -4 addr show dev eth0").await;
        assert!(own.contains(&format!("inet {}/30", m.link.sandbox_ip)), "{own}");
    }
    let proxy_a = FakeProxy::start(&ma.link, Vec::new());
    let client = connect(&a).await;
    let other = format!("tcp:{}:22", mb.link.sandbox_ip);
    let out = probe(&client, None, std::slice::from_ref(&other)).await;
    assert_eq!(
        line_of(&out, &other),
        format!(
            "tcp {}:22 -> transparent {}:22",
            mb.link.sandbox_ip, mb.link.sandbox_ip
        )
    );
    drop(proxy_a);
    drop(client);
    backend.destroy_sandbox(a).expect("destroy a");
    assert_link_gone(&ma);
    assert_eq!(
        interface_index(mb.link.slot),
        Some(mb.ifindex),
        "the other link stays"
    );
    backend.destroy_sandbox(b).expect("destroy b");
    assert_link_gone(&mb);
    env.assert_clean();
}

#[tokio::test]
async fn a_sandbox_without_network_sees_only_loopback() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.8.0/24");
    let handle = backend.create_sandbox(&host_spec("sb-1")).expect("create");
    assert_eq!(handle.network, None);
    assert!(!env.state().join("run/sb-1/netns").exists());
    let client = connect(&handle).await;
    assert_eq!(interfaces(&client).await.trim(), "['lo']");
    let out = probe(&client, None, &["tcp:192.0.2.1:443".to_owned()]).await;
    assert!(line_of(&out, "tcp:192.0.2.1:443").contains("-> error"), "{out}");
    drop(client);
    backend.destroy_sandbox(handle).expect("destroy");
    env.assert_clean();
}

//! Networked sandboxes (`SandboxSpec::network`), driving the native backend directly. The test
//! stands in for the egress proxy: after creating a sandbox it binds listeners on the link's host
//! address, and every property is checked by trying to break it from inside the sandbox. Only
//! loopback and TEST-NET destinations (192.0.2.0/24, 198.51.100.0/24) are used, which the
//! sandbox's firewall captures on this host: nothing leaves the machine. Each test cuts its links
//! from a subnet of its own (slots are shared by every pool on the host, addresses are not), and
//! ends by checking that no interface, firewall table, namespace pin, sandbox or process is left.

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
use paddock_runtime::{Adoption, Backend, SandboxHandle};
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
/// the slot since), its table (unless one of another subnet's link), its pin.
fn assert_link_gone(m: &Made) {
    assert_ne!(
        interface_index(m.link.slot),
        Some(m.ifindex),
        "interface pdk{} left",
        m.link.slot
    );
    if let Some(rules) = table(m.link.slot) {
        assert!(
            !rules.contains(&m.link.host_ip.to_string()),
            "table paddock_{} left: {rules}",
            m.link.slot
        );
    }
    assert!(
        std::fs::symlink_metadata(&m.pin).is_err(),
        "pin {} left",
        m.pin.display()
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&m.pin.display().to_string()),
        "pin still mounted"
    );
}

/// The interfaces a sandbox sees.
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
    let handle = backend.create_sandbox(&spec("sb-1")).await.expect("create");
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
    backend.destroy_sandbox(handle).await.expect("destroy");
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
    let handle = backend.create_sandbox(&spec("sb-1")).await.expect("create");
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
    backend.destroy_sandbox(handle).await.expect("destroy");
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
    let a = backend.create_sandbox(&spec("sb-a")).await.expect("create a");
    let b = backend.create_sandbox(&spec("sb-b")).await.expect("create b");
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
    backend.destroy_sandbox(a).await.expect("destroy a");
    assert_link_gone(&ma);
    assert_eq!(
        interface_index(mb.link.slot),
        Some(mb.ifindex),
        "the other link stays"
    );
    backend.destroy_sandbox(b).await.expect("destroy b");
    assert_link_gone(&mb);
    env.assert_clean();
}

#[tokio::test]
async fn rollbacks_keep_the_link() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.4.0/24");
    if !require_network(&backend) {
        return;
    }
    let handle = backend.create_sandbox(&spec("sb-1")).await.expect("create");
    let m = made(&env, &handle);
    let proxy = FakeProxy::start(&m.link, Vec::new());
    let client = connect(&handle).await;
    // A snapshot whose network files were tampered with: a rollback writes them again.
    ok_as(
        &client,
        Some("root"),
        &format!("echo nameserver 9.9.9.9 > /etc/resolv.conf; echo x > {EGRESS_CA_PATH}"),
    )
    .await;
    drop(client);
    let snap = snapshot_id("sn-1");
    backend.snapshot_sandbox(&handle, &snap).await.expect("snapshot");
    let check = |handle: SandboxHandle, how: &'static str| async move {
        assert_eq!(handle.network, Some(m.link), "{how}: same link");
        let client = connect(&handle).await;
        let out = probe(&client, None, &["tcp:192.0.2.9:8443".to_owned()]).await;
        assert_eq!(
            line_of(&out, "tcp:192.0.2.9:8443"),
            "tcp 192.0.2.9:8443 -> transparent 192.0.2.9:8443",
            "{how}"
        );
        let resolv = ok_as(&client, None, "cat /etc/resolv.conf").await;
        assert!(
            resolv.contains(&format!("nameserver {}", m.link.host_ip)),
            "{how}: {resolv}"
        );
        assert_eq!(
            ok_as(&client, None, &format!("cat {EGRESS_CA_PATH}")).await,
            TEST_CA,
            "{how}"
        );
        assert_eq!(interfaces(&client).await.trim(), "['eth0', 'lo']", "{how}");
        handle
    };
    // Cold: a new init, in the same namespace.
    let handle = backend
        .rollback_sandbox(handle, &snap)
        .await
        .expect("cold rollback");
    let handle = check(handle, "cold").await;
    assert_eq!(interface_index(m.link.slot), Some(m.ifindex));
    // Prepared: a second init booted beside the first, in the same namespace.
    backend.prepare_rollback(&handle, &snap).await.expect("prepare");
    let handle = backend
        .rollback_sandbox(handle, &snap)
        .await
        .expect("prepared rollback");
    let handle = check(handle, "prepared").await;
    assert_eq!(interface_index(m.link.slot), Some(m.ifindex));
    drop(proxy);
    backend.destroy_sandbox(handle).await.expect("destroy");
    assert!(backend.delete_snapshot(&snap).await.expect("delete snapshot"));
    assert_link_gone(&m);
    env.assert_clean();
}

#[tokio::test]
async fn stop_gc_and_adoption_handle_the_link() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.5.0/24");
    if !require_network(&backend) {
        return;
    }
    // Stop: the link goes with the processes; resume makes a new one.
    let handle = backend.create_sandbox(&spec("sb-stop")).await.expect("create");
    let first = made(&env, &handle);
    backend.stop_sandbox(handle).await.expect("stop");
    assert_link_gone(&first);
    let resumed = SandboxSpec {
        volume: VolumeSource::Stopped,
        ..spec("sb-stop")
    };
    let handle = backend.create_sandbox(&resumed).await.expect("resume");
    let second = made(&env, &handle);
    let proxy = FakeProxy::start(&second.link, Vec::new());
    let client = connect(&handle).await;
    let resolv = ok_as(&client, None, "cat /etc/resolv.conf").await;
    assert!(
        resolv.contains(&format!("nameserver {}", second.link.host_ip)),
        "{resolv}"
    );
    let out = probe(&client, None, &["tcp:192.0.2.3:25".to_owned()]).await;
    assert_eq!(
        line_of(&out, "tcp:192.0.2.3:25"),
        "tcp 192.0.2.3:25 -> transparent 192.0.2.3:25"
    );
    drop((proxy, client));

    // Adoption: another backend (a restarted server) gets the link from the record.
    drop(handle);
    let other = self::backend(&env, "10.252.5.0/24");
    let adopted = match other
        .adopt_sandbox(&"sb-stop".parse().expect("id"))
        .await
        .expect("adopt")
    {
        Adoption::Alive(handle) => handle,
        got => panic!("expected a live sandbox, got {got:?}"),
    };
    assert_eq!(adopted.network, Some(second.link));
    other.destroy_sandbox(adopted).await.expect("destroy");
    assert_link_gone(&second);

    // gc: a sandbox whose owner is gone loses its link, and nothing of another pool is touched.
    let neighbour_env = TestEnv::new();
    let neighbour_backend = self::backend(&neighbour_env, "10.252.6.0/24");
    let neighbour = neighbour_backend
        .create_sandbox(&spec("sb-1"))
        .await
        .expect("create neighbour");
    let nm = made(&neighbour_env, &neighbour);
    let handle = backend.create_sandbox(&spec("sb-1")).await.expect("create");
    let third = made(&env, &handle);
    drop(handle);
    let reclaimed = backend.collect_garbage().await.expect("gc");
    assert_eq!(reclaimed, vec!["sb-1".to_owned()]);
    assert_link_gone(&third);
    assert_eq!(
        interface_index(nm.link.slot),
        Some(nm.ifindex),
        "another pool's link is untouched"
    );
    assert!(table(nm.link.slot).is_some());
    neighbour_backend
        .destroy_sandbox(neighbour)
        .await
        .expect("destroy neighbour");
    assert_link_gone(&nm);
    // The inits whose handles were dropped are this process's children (the shim clones them as
    // its siblings): reap them.
    assert!(wait_until(Duration::from_secs(30), || {
        while let Ok(Some(_)) = rustix::process::wait(rustix::process::WaitOptions::NOHANG) {}
        env.processes().is_empty()
    }));
    env.assert_clean();
    neighbour_env.assert_clean();
}

#[tokio::test]
async fn a_failed_create_leaves_no_link() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let subnet = "10.252.7.0/24";
    let backend = backend(&env, subnet);
    if !require_network(&backend) {
        return;
    }
    // Fails in the sandbox's setup, after the link was made: /usr is read-only there.
    let bad = SandboxSpec {
        mounts: vec![MountSpec {
            host: "/etc/hostname".into(),
            sandbox: "/usr/paddock-no-such-dir/x".parse().expect("path"),
            read_only: true,
        }],
        ..spec("sb-1")
    };
    let err = backend.create_sandbox(&bad).await.expect_err("the create fails");
    eprintln!("{err}: {:?}", std::error::Error::source(&err));
    assert!(
        err.to_string().contains("setup"),
        "fails in the setup, after the link was made: {err}"
    );
    let addresses = std::process::Command::new("ip")
        .args(["-o", "addr", "show", "to", subnet])
        .output()
        .expect("ip");
    assert_eq!(
        String::from_utf8_lossy(&addresses.stdout),
        "",
        "no interface left"
    );
    let rules = std::process::Command::new("nft")
        .args(["list", "ruleset"])
        .output()
        .expect("nft");
    assert!(
        !String::from_utf8_lossy(&rules.stdout).contains("10.252.7."),
        "no table left"
    );
    env.assert_clean();
}

#[tokio::test]
async fn a_rootfs_directory_gets_the_files_through_a_layer() {
    let busybox = std::path::Path::new("/bin/busybox");
    assert!(
        busybox.exists(),
        "this test needs busybox-static (/bin/busybox); scripts/test.sh installs it"
    );
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.10.0/24");
    if !require_network(&backend) {
        return;
    }
    let rootfs = tempfile::Builder::new()
        .prefix("paddock-rootfs-")
        .tempdir_in("/var/tmp")
        .expect("rootfs");
    let dir = rootfs.path();
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    for d in ["bin", "etc/ssl/certs"] {
        std::fs::create_dir_all(dir.join(d)).expect("mkdir");
    }
    std::fs::copy(busybox, dir.join("bin/busybox")).expect("copy busybox");
    for applet in ["sh", "cat", "nc", "ls"] {
        std::os::unix::fs::symlink("busybox", dir.join("bin").join(applet)).expect("symlink");
    }
    std::fs::write(dir.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("passwd");
    std::fs::write(dir.join("etc/ssl/certs/ca-certificates.crt"), "ROOTFS BUNDLE\n").expect("bundle");
    std::fs::write(dir.join("etc/ssl/certs/other.pem"), "OTHER\n").expect("other");
    std::fs::write(dir.join("etc/motd"), "hello from the rootfs\n").expect("motd");
    let networked = SandboxSpec {
        rootfs: RootfsSpec::Dir { path: dir.to_owned() },
        user: "root".parse().expect("user"),
        ..spec("sb-1")
    };
    let handle = backend.create_sandbox(&networked).await.expect("create");
    let m = made(&env, &handle);
    let proxy = FakeProxy::start(&m.link, Vec::new());
    let client = connect(&handle).await;
    let bundle = format!("ROOTFS BUNDLE\n{TEST_CA}");
    assert_eq!(
        ok_as(&client, None, &format!("cat {EGRESS_CA_PATH}")).await,
        TEST_CA
    );
    assert_eq!(
        ok_as(&client, None, &format!("cat {CA_BUNDLE_PATH}")).await,
        bundle
    );
    assert_eq!(
        ok_as(&client, None, "cat /etc/ssl/certs/ca-certificates.crt").await,
        bundle
    );
    // The directory's own files are all still there.
    assert_eq!(
        ok_as(&client, None, "cat /etc/ssl/certs/other.pem /etc/motd").await,
        "OTHER\nhello from the rootfs\n"
    );
    let resolv = ok_as(&client, None, "cat /etc/resolv.conf").await;
    assert!(
        resolv.contains(&format!("nameserver {}", m.link.host_ip)),
        "{resolv}"
    );
    // The layer is read-only, like the rest of the directory's etc.
    let (code, _) = sh_as(&client, None, &format!("echo x > {EGRESS_CA_PATH}")).await;
    assert_ne!(code, 0, "the CA was overwritten");
    let out = ok_as(&client, None, "echo hi | nc 192.0.2.1 443").await;
    assert_eq!(out, "transparent 192.0.2.1:443\n");
    drop((proxy, client));
    backend.destroy_sandbox(handle).await.expect("destroy");
    assert_link_gone(&m);
    env.assert_clean();
}

#[tokio::test]
async fn a_sandbox_without_network_sees_only_loopback() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.8.0/24");
    let handle = backend.create_sandbox(&host_spec("sb-1")).await.expect("create");
    assert_eq!(handle.network, None);
    assert!(!env.state().join("run/sb-1/netns").exists());
    let client = connect(&handle).await;
    assert_eq!(interfaces(&client).await.trim(), "['lo']");
    let out = probe(&client, None, &["tcp:192.0.2.1:443".to_owned()]).await;
    assert!(line_of(&out, "tcp:192.0.2.1:443").contains("-> error"), "{out}");
    drop(client);
    backend.destroy_sandbox(handle).await.expect("destroy");
    env.assert_clean();
}

/// Not a check: the time a create takes with and without a link (median of 20 each). Run with
/// `cargo nextest run -p paddock --test runtime_network --run-ignored only --no-capture`.
#[tokio::test]
#[ignore = "a measurement, not a check"]
async fn create_time_with_and_without_network() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.9.0/24");
    // Warm up (template, caches).
    for spec in [host_spec("sb-warm"), spec("sb-warm-net")] {
        let h = backend.create_sandbox(&spec).await.expect("create");
        backend.destroy_sandbox(h).await.expect("destroy");
    }
    let mut plain = Vec::new();
    let mut networked = Vec::new();
    let mut destroy_plain = Vec::new();
    let mut destroy_networked = Vec::new();
    for i in 0..20 {
        for (with, times, destroys) in [
            (false, &mut plain, &mut destroy_plain),
            (true, &mut networked, &mut destroy_networked),
        ] {
            let id = format!("sb-{i}-{with}");
            let s = if with { spec(&id) } else { host_spec(&id) };
            let t = Instant::now();
            let h = backend.create_sandbox(&s).await.expect("create");
            times.push(t.elapsed());
            let t = Instant::now();
            backend.destroy_sandbox(h).await.expect("destroy");
            destroys.push(t.elapsed());
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    eprintln!(
        "create: without network {:?}, with network {:?}; destroy: without {:?}, with {:?} (medians of 20)",
        median(&mut plain),
        median(&mut networked),
        median(&mut destroy_plain),
        median(&mut destroy_networked)
    );
    env.assert_clean();
}

/// Opens `n` TCP connections to `host:port` from the sandbox, one after the other, holding them all;
/// prints `ok N failed N slow N` (a failure is slow when it took over 3 s: a timeout, not a
/// rejection).
fn hold_script(host: Ipv4Addr, port: u16, n: u32) -> String {
    format!(
        "python3 - <<'EOF'\nimport socket, time\nheld, ok, failed, slow = [], 0, 0, 0\nstart = time.monotonic()\nfor _ in range({n}):\n    t = time.monotonic()\n    try:\n        held.append(socket.create_connection(('{host}', {port}), timeout=5))\n        ok += 1\n    except OSError:\n        failed += 1\n        slow += time.monotonic() - t > 3\nprint('ok', ok, 'failed', failed, 'slow', slow, 'seconds', round(time.monotonic() - start, 2))\nEOF\n"
    )
}

/// The `ok`, `failed` and `slow` counts [`hold_script`] printed.
fn counts(out: &str) -> (u32, u32, u32) {
    let n = |key: &str| -> u32 {
        out.split_whitespace()
            .skip_while(|w| *w != key)
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {out:?}"))
    };
    (n("ok"), n("failed"), n("slow"))
}

/// A listener on the proxy's port that accepts every connection and holds it until released.
struct Holder {
    held: Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Holder {
    fn start(host: Ipv4Addr, port: u16) -> Self {
        let listener = TcpListener::bind((host, port)).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let held = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (held.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => h.lock().expect("held").push(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            held,
            stop,
            thread: Some(thread),
        }
    }
    /// Closes every held connection.
    fn release(&self) {
        self.held.lock().expect("held").clear();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Issue 11, class 3: every connection a networked sandbox opens takes an entry of the host's one
/// connection tracking table (`nf_conntrack_max`). The link's firewall bounds the sandbox's share:
/// connections tracked at once (`ct count`), and new connections per second (`limit rate`); over
/// either, a connection is rejected at once and takes no entry.
#[tokio::test]
async fn a_sandbox_gets_a_bounded_share_of_connection_tracking() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.9.0/24");
    if !require_network(&backend) {
        return;
    }
    let with = |id: &str, max_connections, new_per_second| {
        let mut s = spec(id);
        if let Some(n) = s.network.as_mut() {
            n.conntrack = paddock_types::ConntrackLimits {
                max_connections,
                new_per_second,
            };
        }
        s
    };
    // At most 20 tracked at once.
    let handle = backend
        .create_sandbox(&with("sb-ct", 20, 10_000))
        .await
        .expect("create");
    let m = made(&env, &handle);
    let rules = table(m.link.slot).expect("table");
    assert!(rules.contains("ct count over 20"), "{rules}");
    let host = m.link.host_ip;
    let holder = Holder::start(host, EgressPorts::default().proxy);
    let client = connect(&handle).await;
    let out = ok_as(
        &client,
        None,
        &hold_script(host, EgressPorts::default().proxy, 40),
    )
    .await;
    eprintln!("count cap 20: {out}");
    let (ok, failed, slow) = counts(&out);
    assert!((10..=20).contains(&ok) && failed == 40 - ok && slow == 0, "{out}");
    // Connections closed at both ends no longer count.
    holder.release();
    let out = ok_as(
        &client,
        None,
        &hold_script(host, EgressPorts::default().proxy, 15),
    )
    .await;
    assert_eq!(counts(&out), (15, 0, 0), "{out}");
    drop(holder);
    drop(client);
    backend.destroy_sandbox(handle).await.expect("destroy");
    assert_link_gone(&m);

    // At most 1 new connection a second (bursts of 2): 20 in a row, most rejected.
    let handle = backend
        .create_sandbox(&with("sb-rate", 4096, 1))
        .await
        .expect("create");
    let m = made(&env, &handle);
    let host = m.link.host_ip;
    let holder = Holder::start(host, EgressPorts::default().proxy);
    let client = connect(&handle).await;
    let out = ok_as(
        &client,
        None,
        &hold_script(host, EgressPorts::default().proxy, 20),
    )
    .await;
    eprintln!("rate 1/s: {out}");
    let (ok, failed, slow) = counts(&out);
    assert!(ok <= 10 && failed == 20 - ok && slow == 0, "{out}");
    drop(holder);
    drop(client);
    backend.destroy_sandbox(handle).await.expect("destroy");
    assert_link_gone(&m);
    env.assert_clean();
}

//! Connection tracking: every connection a sandbox opens takes an entry of the host's one table; the
//! link's firewall bounds the sandbox's share (connections at once, new connections a second).

use super::*;

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
    /// Closes every held connection once `n` are held: connections the sandbox made may still wait
    /// in the listener's backlog (established, so tracked), and one accepted after the release would
    /// stay open.
    fn release(&self, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let mut held = self.held.lock().expect("held");
            if held.len() >= n {
                held.clear();
                return;
            }
            drop(held);
            assert!(
                std::time::Instant::now() < deadline,
                "the holder never accepted the {n} connections the sandbox made"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
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
    holder.release(ok as usize);
    let out = ok_as(
        &client,
        None,
        &hold_script(host, EgressPorts::default().proxy, 15),
    )
    .await;
    assert_eq!(counts(&out), (15, 0, 0), "{out}");
    drop(holder);
    drop(client);
    backend.destroy_sandbox(handle).expect("destroy");
    assert_link_gone(&m);

    // At most 1 new connection a second (bursts of 2): 20 in a row, most rejected.
    let handle = backend.create_sandbox(&with("sb-rate", 4096, 1)).expect("create");
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
    backend.destroy_sandbox(handle).expect("destroy");
    assert_link_gone(&m);
    env.assert_clean();
}

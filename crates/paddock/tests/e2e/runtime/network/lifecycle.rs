//! A sandbox's link through its lifecycle: rollbacks keep it; stop, gc and adoption after a restart
//! handle it; a failed create leaves none; a `--rootfs` directory gets the network files through a
//! layer; and (by hand) what a link adds to the time a create takes.

use super::*;

#[tokio::test]
async fn rollbacks_keep_the_link() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.4.0/24");
    if !require_network(&backend) {
        return;
    }
    let handle = backend.create_sandbox(&spec("sb-1")).expect("create");
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
    backend.snapshot_sandbox(&handle, &snap).expect("snapshot");
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
    let handle = backend.rollback_sandbox(handle, &snap).expect("cold rollback");
    let handle = check(handle, "cold").await;
    assert_eq!(interface_index(m.link.slot), Some(m.ifindex));
    // Prepared: a second init booted beside the first, in the same namespace.
    backend.prepare_rollback(&handle, &snap).expect("prepare");
    let handle = backend
        .rollback_sandbox(handle, &snap)
        .expect("prepared rollback");
    let handle = check(handle, "prepared").await;
    assert_eq!(interface_index(m.link.slot), Some(m.ifindex));
    drop(proxy);
    backend.destroy_sandbox(handle).expect("destroy");
    assert!(backend.delete_snapshot(&snap).expect("delete snapshot"));
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
    let handle = backend.create_sandbox(&spec("sb-stop")).expect("create");
    let first = made(&env, &handle);
    backend.stop_sandbox(handle).expect("stop");
    assert_link_gone(&first);
    let resumed = SandboxSpec {
        volume: VolumeSource::Stopped,
        ..spec("sb-stop")
    };
    let handle = backend.create_sandbox(&resumed).expect("resume");
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
        .expect("adopt")
    {
        Adoption::Alive(handle) => handle,
        got => panic!("expected a live sandbox, got {got:?}"),
    };
    assert_eq!(adopted.network, Some(second.link));
    other.destroy_sandbox(adopted).expect("destroy");
    assert_link_gone(&second);

    // gc: a sandbox whose owner is gone loses its link, and nothing of another pool is touched.
    let neighbour_env = TestEnv::new();
    let neighbour_backend = self::backend(&neighbour_env, "10.252.6.0/24");
    let neighbour = neighbour_backend
        .create_sandbox(&spec("sb-1"))
        .expect("create neighbour");
    let nm = made(&neighbour_env, &neighbour);
    let handle = backend.create_sandbox(&spec("sb-1")).expect("create");
    let third = made(&env, &handle);
    drop(handle);
    let reclaimed = backend.collect_garbage().expect("gc");
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
    let err = backend.create_sandbox(&bad).expect_err("the create fails");
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
    let handle = backend.create_sandbox(&networked).expect("create");
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
    backend.destroy_sandbox(handle).expect("destroy");
    assert_link_gone(&m);
    env.assert_clean();
}

/// Not a check: the time a create takes with and without a link (median of 20 each). Run with
/// `cargo nextest run -p paddock --test e2e --run-ignored only --no-capture runtime::network::lifecycle`.
#[tokio::test]
#[ignore = "a measurement, not a check"]
async fn create_time_with_and_without_network() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.9.0/24");
    // Warm up (template, caches).
    for spec in [host_spec("sb-warm"), spec("sb-warm-net")] {
        let h = backend.create_sandbox(&spec).expect("create");
        backend.destroy_sandbox(h).expect("destroy");
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
            let h = backend.create_sandbox(&s).expect("create");
            times.push(t.elapsed());
            let t = Instant::now();
            backend.destroy_sandbox(h).expect("destroy");
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

/// A destroy removes a networked sandbox's processes, cgroups and volume before it returns and its
/// link in the background, which [`SandboxBackend::settle_teardowns`] waits for; the same id can be
/// created again at once (its run directory was moved aside first).
#[tokio::test]
async fn a_destroyed_link_goes_in_the_background_and_settles() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.11.0/24");
    if !require_network(&backend) {
        return;
    }
    let handle = backend.create_sandbox(&spec("sb-1")).expect("create");
    let first = made(&env, &handle);
    backend.destroy_sandbox(handle).expect("destroy");
    // Done when the destroy returns: no process, no volume, the id free again.
    assert!(env.processes().is_empty(), "{:?}", env.processes());
    assert!(!env.state().join("pool/sandboxes/sb-1").exists());
    let again = backend
        .create_sandbox(&spec("sb-1"))
        .expect("the same id again at once");
    let second = made(&env, &again);
    backend.destroy_sandbox(again).expect("destroy");
    assert!(
        backend.settle_teardowns(Duration::from_secs(60)),
        "background teardowns settle"
    );
    // Settled: gone now, without waiting.
    for m in [&first, &second] {
        assert_ne!(interface_index(m.link.slot), Some(m.ifindex));
        assert!(table(m.link.slot).is_none_or(|r| !r.contains(&m.link.host_ip.to_string())));
    }
    let run = crate::support::run_dirs(&env);
    assert!(run.is_empty(), "{run:?}");
    assert_link_gone(&first);
    assert_link_gone(&second);
    env.assert_clean();
}

/// Set (to `<state dir>\n<cgroup parent>`) when this binary runs as the process that creates a
/// networked sandbox, destroys it and dies (a crash point) in the destroy's background steps.
const DESTROYER_ENV: &str = "PADDOCK_TEST_NETWORK_DESTROYER";

/// Not a test of its own: the body of the destroying process (a no-op unless [`DESTROYER_ENV`] is
/// set). It prints the link's slot and interface index, then dies at `teardown.deferred`.
#[tokio::test]
async fn helper_destroys_a_networked_sandbox_and_dies() {
    let Ok(job) = std::env::var(DESTROYER_ENV) else {
        return;
    };
    let (state, parent) = job.split_once('\n').expect("state and parent");
    let backend = NativeBackend::open(NativeConfig {
        network_subnet: "10.252.12.0/24".parse().expect("subnet"),
        ..crate::support::native_config(std::path::Path::new(state), parent)
    })
    .expect("open the native backend");
    let handle = backend.create_sandbox(&spec("sb-crash")).expect("create");
    let link = link_of(&handle);
    let ifindex = interface_index(link.slot).expect("the interface");
    println!("made {} {ifindex} {}", link.slot, link.host_ip);
    backend.destroy_sandbox(handle).expect("destroy");
    // The crash point kills this process in the background thread.
    backend.settle_teardowns(Duration::from_secs(60));
    panic!("the crash point was not reached");
}

/// A crash while a destroyed sandbox's link is being removed in the background leaves its run
/// directory (`.gone-...`, lock free) and link, which gc removes without calling it a sandbox.
#[tokio::test]
async fn a_crash_during_a_background_teardown_leaves_the_link_to_gc() {
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env, "10.252.12.0/24");
    if !require_network(&backend) {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            &crate::support::test_name(module_path!(), "helper_destroys_a_networked_sandbox_and_dies"),
            "--exact",
            "--nocapture",
        ])
        .env(
            DESTROYER_ENV,
            format!("{}\n{}", env.state().display(), env.cgroup_parent),
        )
        .env(paddock_runtime::fault::FAULT_ENV, "teardown.deferred")
        .output()
        .expect("run the destroying process");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        stderr.contains("fault point teardown.deferred reached"),
        "the destroying process did not die at the crash point: {stdout}\n{stderr}"
    );
    let made: Vec<&str> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("made "))
        .unwrap_or_else(|| panic!("no link reported: {stdout}\n{stderr}"))
        .split(' ')
        .collect();
    let [slot, ifindex, host_ip] = made[..] else {
        panic!("{made:?}")
    };
    let (slot, ifindex): (u32, u32) = (slot.parse().expect("slot"), ifindex.parse().expect("ifindex"));
    // What the crash left: the run directory moved aside, the link, nothing else.
    let run = crate::support::run_dirs(&env);
    assert!(
        run.len() == 1 && run.iter().all(|d| d.starts_with(".gone-sb-crash-")),
        "{run:?}"
    );
    assert_eq!(interface_index(slot), Some(ifindex), "the crash left the link");
    assert!(!env.state().join("pool/sandboxes/sb-crash").exists());
    let reclaimed = backend.collect_garbage().expect("gc");
    assert!(
        reclaimed.is_empty(),
        "a finished teardown is not a sandbox: {reclaimed:?}"
    );
    assert_ne!(interface_index(slot), Some(ifindex), "gc removed the link");
    assert!(
        table(slot).is_none_or(|rules| !rules.contains(host_ip)),
        "gc removed the table"
    );
    env.assert_clean();
}

//! Whole trees a sandbox wrote: walked with a bounded number of descriptors however deep or wide, and
//! exported with set-id bits cleared unless asked.

use super::*;

/// A snapshot with 25,000 nested directories and 25,000 sibling directories: its details (which map
/// every file's extents), its export and a diff against it succeed while the server holds a bounded
/// number of descriptors (it runs in this process: its descriptors are this process's).
#[test]
fn huge_trees_are_walked_with_bounded_descriptors() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("deep").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(
            &id,
            "cd /home/user && perl -e 'mkdir \"wide\"; mkdir \"wide/$_\" for 1..25000'",
        )
        .await;
        let wide = snapshot_of(&a, &id).await;
        // The nesting is made from the host, straight into the sandbox's volume: the sandbox can make
        // it too, but each of its calls is checked by Landlock up the whole path, so 25,000 levels
        // take it minutes.
        nest_in_volume(h.env().state(), &id, 25_000);
        let snap = snapshot_of(&a, &id).await;
        let baseline = open_fds();
        let watch = FdWatch::start();
        let details = a.get(&format!("/v1/snapshots/{snap}")).await.ok(200);
        assert!(
            details["referenced_bytes"].is_u64(),
            "no usage measured: {details}"
        );
        let diff = a
            .get_q(
                &format!("/v1/sandboxes/{id}/diff"),
                &[("snapshot", snap.as_str())],
            )
            .await
            .ok(200);
        assert_eq!(diff["entries"].as_array().map(Vec::len), Some(0), "{diff}");
        // The export refuses what no import could take back (deeper than 512 levels): the download
        // breaks off rather than end as an archive ...
        let export = a
            .request(reqwest::Method::GET, &format!("/v1/snapshots/{snap}/export"))
            .send()
            .await
            .expect("the export is answered");
        assert!(
            export.status() != 200 || export.bytes().await.is_err(),
            "an archive nobody can import"
        );
        // ... and exports the wide tree, however wide.
        let export = a.get(&format!("/v1/snapshots/{wide}/export")).await;
        assert_eq!(export.status, 200, "{export:?}");
        assert!(tar_members(&export.body).contains_key("home/user/wide/25000/"));
        let most = watch.stop();
        assert!(
            most < baseline + 64,
            "the server held up to {most} descriptors (baseline {baseline}) walking the trees"
        );
    });
}

/// An export clears setuid and setgid bits of what the sandbox's root made, keeps them when asked,
/// and says so in its audit row; owners stay the sandbox's ids.
#[test]
fn an_export_clears_set_id_bits_unless_asked() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("suid").await;
        let id = a.create_sandbox(json!({})).await;
        sh_root(
            &a,
            &id,
            "cp /bin/sh /root/rootshell && chmod 4755 /root/rootshell && mkdir /root/shared && \
             chmod 2775 /root/shared && chmod 1777 /tmp",
        )
        .await;
        let snap = snapshot_of(&a, &id).await;
        let plain = a.get(&format!("/v1/snapshots/{snap}/export")).await;
        assert_eq!(plain.status, 200, "{plain:?}");
        let members = tar_members(&plain.body);
        assert_eq!(
            (members["root/rootshell"].mode, members["root/rootshell"].uid),
            (0o755, 0),
            "setuid cleared, the owner is the sandbox's root"
        );
        assert_eq!(members["root/shared/"].mode, 0o775);
        assert_eq!(members["tmp/"].mode, 0o1777, "the sticky bit stays");
        assert!(members.values().all(|m| m.mode & 0o6000 == 0));
        let kept = a
            .get_q(&format!("/v1/snapshots/{snap}/export"), &[("keep_setid", "true")])
            .await;
        assert_eq!(kept.status, 200, "{kept:?}");
        let members = tar_members(&kept.body);
        assert_eq!(members["root/rootshell"].mode, 0o4755);
        assert_eq!(members["root/shared/"].mode, 0o2775);
        let rows = h
            .admin
            .audit_rows(&[("action", "snapshot.export"), ("sandbox", id.as_str())])
            .await;
        let details: Vec<(Value, Value)> = rows
            .iter()
            .map(|r| {
                (
                    r["detail"]["keep_setid"].clone(),
                    r["detail"]["setid_cleared"].clone(),
                )
            })
            .collect();
        assert!(
            details
                .iter()
                .any(|(keep, cleared)| *keep == json!(false) && cleared.as_u64() >= Some(2)),
            "{rows:#?}"
        );
        assert!(details.contains(&(json!(true), json!(0))), "{rows:#?}");
    });
}

/// Makes `levels` nested directories `d/d/...` (and a file at the bottom) in the sandbox's
/// `/home/user`, owned by its user, descriptor-relative (the path is far beyond `PATH_MAX`).
fn nest_in_volume(state: &Path, id: &str, levels: usize) {
    use rustix::fs::{Mode, OFlags};
    let home = state.join("pool/sandboxes").join(id).join("volume/home/user");
    let owner = (
        Some(rustix::fs::Uid::from_raw(ID_BASE + 1000)),
        Some(rustix::fs::Gid::from_raw(ID_BASE + 1000)),
    );
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
    let mut dir = rustix::fs::open(&home, flags, Mode::empty()).expect("home");
    for _ in 0..levels {
        rustix::fs::mkdirat(&dir, c"d", Mode::from_raw_mode(0o755)).expect("mkdir");
        dir = rustix::fs::openat(&dir, c"d", flags, Mode::empty()).expect("open");
        rustix::fs::fchown(&dir, owner.0, owner.1).expect("chown");
    }
    let leaf = rustix::fs::openat(
        &dir,
        c"leaf",
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        Mode::from_raw_mode(0o644),
    )
    .expect("leaf");
    rustix::io::write(&leaf, b"x").expect("write");
}

/// This process's open descriptors now.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// Samples this process's descriptor count on a thread until stopped; returns the most seen.
struct FdWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl FdWatch {
    fn start() -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut most = 0;
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                most = most.max(open_fds());
                std::thread::yield_now();
            }
            most
        });
        Self { stop, thread }
    }

    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("watch thread")
    }
}

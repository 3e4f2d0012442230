//! End to end: what a sandbox can do to the host through the btrfs interfaces of its storage (issue
//! 11, class 1). From inside (as `user` and as the sandbox's root) every btrfs subvolume request
//! fails as not supported: creating subvolumes and snapshots in its own volume (data outside its
//! disk quota, storage its teardown could not delete) and of a read-only mounted named volume (a
//! writable copy), and the search and info requests that name pool-internal ids. The generic
//! reflink requests still work. And whatever an older paddock let a sandbox leave (nested
//! subvolumes, read-only ones holding others, symlinks out), planted here from the host, teardown,
//! volume and stopped-sandbox deletion, `paddock gc` and a server restart delete completely, and the
//! server still starts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use paddock_sys::btrfs;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{
    cli_gc,
    harness::{Client, Harness},
    server::Server,
    volume_in, TestEnv,
};

/// Tries each btrfs request (and a few generic ones) and prints `name errno` (0 for success).
/// Arguments whose structures the kernel would read are zeroed buffers of the request's size, with
/// the fields the attack needs filled in.
const PROBE: &str = r#"
import fcntl, os, struct, sys
home = os.environ.get("HOME", "/tmp")
def probe(name, path, req, buf=None, size=4096):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, req, buf if buf is not None else bytearray(size))
        print(name, 0)
    except OSError as e:
        print(name, e.errno)
    finally:
        os.close(fd)
def vol_args(name, src=0):
    b = bytearray(4096); struct.pack_into("q", b, 0, src); b[8:8 + len(name)] = name; return b
def vol_args_v2(name, src, flags=0):
    b = bytearray(4096); struct.pack_into("qQQ", b, 0, src, 0, flags); b[56:56 + len(name)] = name; return b
src_home = os.open(home, os.O_RDONLY)
src_ro = os.open("/ro", os.O_RDONLY)
probe("subvol_create", home, 0x5000940e, vol_args(b"nested"))
probe("snap_create", home, 0x50009401, vol_args(b"snap1", src_home))
probe("snap_create_v2", home, 0x50009417, vol_args_v2(b"snap2", src_home))
probe("snap_create_v2_ro", home, 0x50009417, vol_args_v2(b"snap3", src_home, 2))
probe("snapshot_of_ro_volume", home, 0x50009417, vol_args_v2(b"copy", src_ro))
probe("snap_destroy", home, 0x5000940f, vol_args(b"nothing"))
probe("tree_search", home, 0xd0009411)
probe("ino_lookup", home, 0xd0009412)
probe("fs_info", home, 0x8400941f, size=1024)
probe("get_fslabel", home, 0x81009431, size=256)
probe("subvol_getflags", home, 0x80089419, size=8)
probe("subvol_setflags", home, 0x4008941a, size=8)
probe("default_subvol", home, 0x40089413, size=8)
probe("qgroup_limit", home, 0x8030942b, size=48)
probe("get_subvol_info", home, 0x81f8943c, size=504)
probe("get_subvol_rootref", home, 0xd000943d)
probe("ino_lookup_user", home, 0xd000943e)
probe("ro_volume_subvol_info", "/ro", 0x81f8943c, size=504)
probe("ro_volume_tree_search", "/ro", 0xd0009411)
with open(home + "/src", "wb") as f: f.write(b"x" * 65536)
a = os.open(home + "/src", os.O_RDONLY); b = os.open(home + "/clone", os.O_WRONLY | os.O_CREAT, 0o600)
try:
    fcntl.ioctl(b, 0x40049409, a); print("ficlone", 0)
except OSError as e:
    print("ficlone", e.errno)
print("fionread", 0 if fcntl.ioctl(a, 0x541b, b"\0\0\0\0") is not None else 1)
sys.stdout.flush()
"#;

/// The requests that must fail, and `ENOTTY`.
const REFUSED: &[&str] = &[
    "subvol_create",
    "snap_create",
    "snap_create_v2",
    "snap_create_v2_ro",
    "snapshot_of_ro_volume",
    "snap_destroy",
    "tree_search",
    "ino_lookup",
    "fs_info",
    "get_fslabel",
    "subvol_getflags",
    "subvol_setflags",
    "default_subvol",
    "qgroup_limit",
    "get_subvol_info",
    "get_subvol_rootref",
    "ino_lookup_user",
    "ro_volume_subvol_info",
    "ro_volume_tree_search",
];

async fn run_probe(client: &Client, id: &str, user: &str) -> Vec<(String, i64)> {
    let home = if user == "root" { "/root" } else { "/home/user" };
    let script = format!("python3 - <<'EOF'\n{PROBE}\nEOF");
    let result = client
        .exec_json(id, json!({"shell": script, "user": user, "env": {"HOME": home}}))
        .await;
    assert_eq!(result["exit"]["exit_code"], 0, "probe as {user}: {result:#}");
    let stdout = result["stdout"].as_str().unwrap_or_default();
    stdout
        .lines()
        .map(|line| {
            let (name, errno) = line.split_once(' ').unwrap_or_else(|| panic!("{line:?}"));
            (
                name.to_owned(),
                errno.parse().unwrap_or_else(|_| panic!("{line:?}")),
            )
        })
        .collect()
}

#[test]
fn btrfs_subvolume_requests_fail_inside_a_sandbox() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("btrfs-probe").await;
        let volume = a
            .post("/v1/volumes", json!({"name": "shared", "size": "64M"}))
            .await
            .ok(201);
        let vid = volume["id"].as_str().expect("id").to_owned();
        let writer = a
            .create_sandbox(json!({"volumes": [{"volume": "shared", "path": "/ro"}]}))
            .await;
        a.sh(&writer, "echo data > /ro/f").await;
        let id = a
            .create_sandbox(json!({
                "limits": {"disk": "100M"},
                "volumes": [{"volume": "shared", "path": "/ro", "read_only": true}],
            }))
            .await;
        for user in ["user", "root"] {
            let results = run_probe(&a, &id, user).await;
            let got: BTreeSet<&str> = results.iter().map(|(n, _)| n.as_str()).collect();
            for name in REFUSED {
                assert!(got.contains(name), "{name} not probed as {user}: {results:?}");
            }
            for (name, errno) in &results {
                let want = if REFUSED.contains(&name.as_str()) {
                    i64::from(libc::ENOTTY)
                } else {
                    0
                };
                assert_eq!(*errno, want, "{name} as {user}: {results:?}");
            }
        }
        // Nothing was created in either subvolume, seen from the host.
        let pool = h.env().state().join("pool");
        for path in [volume_in(&pool, &id), pool.join("volumes").join(&vid)] {
            let nested = btrfs::nested_subvolumes(&path).expect("list nested subvolumes");
            assert!(nested.is_empty(), "{}: {nested:?}", path.display());
        }
        let (home, ro) = (a.sh(&id, "ls -A /home/user").await, a.sh(&id, "ls -A /ro").await);
        assert!(!home.contains("nested") && !home.contains("snap"), "{home}");
        assert_eq!(ro.trim(), "f");
    });
}

/// Plants what an older paddock let a sandbox make under `dir` (a directory of subvolume
/// `subvolume`): subvolumes nested three and twenty deep, a read-only one holding another, a
/// read-only snapshot of `subvolume` itself, and symlinks to the host's `/` and to `outside`.
fn plant_nested(subvolume: &Path, dir: &Path, outside: &Path) {
    let n = |e: std::io::Error, what: &str| panic!("plant {what} under {}: {e}", dir.display());
    btrfs::create_subvolume(dir, "n1").unwrap_or_else(|e| n(e, "n1"));
    std::fs::create_dir(dir.join("n1/d")).expect("mkdir");
    btrfs::create_subvolume(&dir.join("n1/d"), "n2").unwrap_or_else(|e| n(e, "n2"));
    btrfs::create_subvolume(&dir.join("n1/d/n2"), "n3").unwrap_or_else(|e| n(e, "n3"));
    std::fs::write(dir.join("n1/d/n2/n3/data"), vec![7u8; 1 << 20]).expect("write");
    std::os::unix::fs::symlink("/", dir.join("n1/to-host-root")).expect("symlink");
    std::os::unix::fs::symlink(outside, dir.join("n1/d/to-outside")).expect("symlink");
    btrfs::set_subvolume_readonly(&dir.join("n1/d/n2"), true).expect("n2 read-only");
    btrfs::set_subvolume_readonly(&dir.join("n1"), true).expect("n1 read-only");
    btrfs::snapshot_subvolume(subvolume, dir, "snap", true).unwrap_or_else(|e| n(e, "snap"));
    let mut deep = dir.to_owned();
    for _ in 0..20 {
        btrfs::create_subvolume(&deep, "deep").unwrap_or_else(|e| n(e, "deep"));
        deep.push("deep");
    }
    let planted = btrfs::nested_subvolumes(subvolume).expect("list");
    assert!(planted.len() >= 24, "{planted:?}"); // n1, n2, n3, snap and the chain
}

/// Every subvolume of the pool but its template, by id.
fn pool_subvolumes(env: &TestEnv) -> Vec<u64> {
    let pool = env.state().join("pool");
    let template = btrfs::subvolume_id(&pool.join("templates/host")).expect("template id");
    let mut ids = btrfs::nested_subvolumes(&pool).expect("pool subvolumes");
    ids.retain(|&id| id != template);
    ids
}

fn init_pid(env: &TestEnv, id: &str) -> i32 {
    let record =
        std::fs::read_to_string(env.state().join("run").join(id).join("init.pid")).expect("init.pid");
    record
        .split_whitespace()
        .next()
        .expect("pid")
        .parse()
        .expect("pid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_subvolumes_do_not_stop_teardown_gc_or_a_restart() {
    let env = TestEnv::new();
    let host_dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let outside: PathBuf = host_dir.path().join("outside");
    std::fs::write(&outside, b"host file").expect("write");
    let pool = env.state().join("pool");
    let server = Server::start(&env, &[], "info");
    let api = server.api();
    let admin = server.admin_key.clone();
    let key = api.create_key(&admin, "nested").await;
    api.unlimited_quota(&admin, "nested").await;
    let create = async |body: Value| -> String {
        let info = api.create_sandbox(&key, &body).await;
        info["id"].as_str().expect("id").to_owned()
    };

    // A running sandbox's volume: deleting the sandbox deletes it all.
    let running = create(json!({})).await;
    let volume = volume_in(&pool, &running);
    plant_nested(&volume, &volume.join("home/user"), &outside);
    api.delete_sandbox(&key, &running).await;
    assert!(
        !pool.join("sandboxes").join(&running).exists(),
        "the volume of a deleted sandbox is left"
    );

    // A named volume.
    let vol = api.post(&key, "/v1/volumes", &json!({"name": "v"})).await;
    let vid = vol["id"].as_str().expect("id").to_owned();
    let vol_path = pool.join("volumes").join(&vid);
    plant_nested(&vol_path, &vol_path, &outside);
    let reply = api
        .request(&key, Method::DELETE, &format!("/v1/volumes/{vid}"), None, None)
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    assert!(!vol_path.exists(), "a deleted volume is left");

    // A stopped sandbox's kept volume.
    let stopped = create(json!({})).await;
    let reply = api
        .request(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{stopped}/stop"),
            None,
            None,
        )
        .await;
    assert!(reply.status.is_success(), "stop: {}", reply.text());
    let kept = pool.join("stopped").join(&stopped);
    plant_nested(&kept, &kept.join("home/user"), &outside);
    api.delete_sandbox(&key, &stopped).await;
    assert!(
        !kept.exists(),
        "the kept volume of a deleted stopped sandbox is left"
    );

    // Left for a restart: two live sandboxes with nested subvolumes, and storage no record owns.
    let live = [create(json!({})).await, create(json!({})).await];
    for id in &live {
        let volume = volume_in(&pool, id);
        plant_nested(&volume, &volume.join("tmp"), &outside);
    }
    // Unowned volumes of both layouts: an older paddock's (the subvolume `sandboxes/<id>` itself),
    // this one's (`sandboxes/<id>/volume`), and the empty directory a crashed create leaves.
    let orphan = pool.join("sandboxes/sb-00000000000000aa");
    btrfs::create_subvolume(&pool.join("sandboxes"), "sb-00000000000000aa").expect("orphan volume");
    plant_nested(&orphan, &orphan, &outside);
    let orphan_dir = pool.join("sandboxes/sb-00000000000000ab");
    std::fs::create_dir(&orphan_dir).expect("orphan volume's directory");
    btrfs::create_subvolume(&orphan_dir, "volume").expect("orphan volume");
    plant_nested(&orphan_dir.join("volume"), &orphan_dir.join("volume"), &outside);
    let orphan_empty = pool.join("sandboxes/sb-00000000000000ac");
    std::fs::create_dir(&orphan_empty).expect("orphan empty directory");
    let orphan_snapshot = pool.join("snapshots/sn-00000000000000aa");
    btrfs::create_subvolume(&pool.join("snapshots"), "sn-00000000000000aa").expect("orphan snapshot");
    plant_nested(&orphan_snapshot, &orphan_snapshot, &outside);
    btrfs::set_subvolume_readonly(&orphan_snapshot, true).expect("read-only");
    let trash = pool.join("trash");
    std::fs::create_dir_all(&trash).expect("trash");
    btrfs::create_subvolume(&trash, "sb-00000000000000bb.1").expect("trashed volume");
    plant_nested(
        &trash.join("sb-00000000000000bb.1"),
        &trash.join("sb-00000000000000bb.1"),
        &outside,
    );
    server.kill9();

    // The restart reclaims the unowned storage and adopts the sandboxes.
    let server = Server::restart(&env, &[], "info");
    let api = server.api();
    assert!(
        !orphan.exists() && !orphan_dir.exists() && !orphan_empty.exists() && !orphan_snapshot.exists(),
        "unowned storage is left"
    );
    let trash_left: Vec<_> = std::fs::read_dir(&trash).expect("trash").flatten().collect();
    assert!(trash_left.is_empty(), "{trash_left:?}");
    for id in &live {
        assert_eq!(api.sandbox(&key, id).await["state"], "running");
    }
    // One is deleted through the API; the other is left to `paddock gc` once the server is gone.
    api.delete_sandbox(&key, &live[0]).await;
    let survivor = init_pid(&env, &live[1]);
    server.stop();
    assert!(
        std::path::Path::new(&format!("/proc/{survivor}")).exists(),
        "the sandbox outlives the server"
    );
    let out = cli_gc(&env);
    assert!(out.contains(&live[1]), "{out}");

    assert_eq!(
        pool_subvolumes(&env),
        Vec::<u64>::new(),
        "subvolumes left in the pool"
    );
    assert_eq!(std::fs::read(&outside).expect("outside"), b"host file");
    let server = Server::restart(&env, &[], "info");
    server.stop();
    env.assert_clean();
}

//! End to end: the real `paddock serve` on its own state directory, cgroup parent and a free port,
//! driven by the real CLI client (`paddock sandbox ...`, `paddock audit ...`, `paddock keys ...`). Every
//! sandbox is removed before the server stops; the test environment then checks nothing was left.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::support::{assert_code, server::Server, stderr, stdout, wait_until, TestEnv};

/// The CLI client as a client of `server` (the key comes from the state directory).
fn client(server: &Server, env: &TestEnv) -> Command {
    let mut c = env.cmd();
    c.env("PADDOCK_URL", &server.url).stdin(Stdio::null());
    c
}

/// Runs `paddock <args>` against `server`.
trait RunClient {
    fn run(&self, env: &TestEnv, args: &[&str]) -> Output;
    fn client(&self, env: &TestEnv) -> Command;
}

impl RunClient for Server {
    fn run(&self, env: &TestEnv, args: &[&str]) -> Output {
        client(self, env).args(args).output().expect("paddock runs")
    }
    fn client(&self, env: &TestEnv) -> Command {
        client(self, env)
    }
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert_code(o, 0);
    stdout(o)
}

/// The one-line error of a failed client command, with its exit status.
#[track_caller]
fn fails(o: &Output, code: i32, needle: &str) {
    assert_code(o, code);
    let err = stderr(o);
    assert!(err.starts_with("paddock: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_str(&ok(o)).expect("JSON output")
}

#[test]
fn serve_and_drive_it_with_the_client() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let key_path = env.state().join("admin.key");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&key_path).expect("admin.key").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "admin.key is private");

    // config show resolves the same state directory.
    let shown = ok(&env.cmd().args(["config", "show"]).output().expect("runs"));
    assert!(
        shown.contains(&format!("state_dir = \"{}\"", env.state().display())),
        "{shown}"
    );

    // create / ls / get
    let id = ok(&server.run(
        &env,
        &["sandbox", "create", "--label", "suite=e2e", "--memory", "512M"],
    ))
    .trim()
    .to_owned();
    assert!(id.starts_with("sb-"), "{id}");
    let listed = ok(&server.run(&env, &["sandbox", "ls", "--label", "suite=e2e"]));
    assert!(
        listed.lines().next().is_some_and(|h| h.starts_with("ID")),
        "{listed}"
    );
    assert!(listed.contains(&id), "{listed}");
    let info = json(&server.run(&env, &["sandbox", "get", &id, "--json"]));
    assert_eq!(info["state"], "running");
    assert_eq!(info["labels"]["suite"], "e2e");
    assert_eq!(info["limits"]["memory"], 512u64 << 20);

    // exec: output and exit status
    let o = server.run(
        &env,
        &[
            "sandbox",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
    );
    assert_code(&o, 3);
    assert_eq!(stdout(&o), "out\n");
    assert_eq!(stderr(&o), "err\n");
    let o = server.run(&env, &["sandbox", "exec", &id, "--shell", "kill -TERM $$"]);
    assert_code(&o, 128 + 15);
    let o = server.run(
        &env,
        &["sandbox", "exec", &id, "--timeout", "1s", "--", "sleep", "30"],
    );
    assert_code(&o, 124);
    let result = json(&server.run(&env, &["sandbox", "exec", &id, "--json", "--", "echo", "j"]));
    assert_eq!(result["stdout"], "j\n");
    let mut c = server.client(&env);
    c.args(["sandbox", "exec", "-i", &id, "--", "tr", "a-z", "A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), b"hello stdin\n").expect("write");
    let o = child.wait_with_output().expect("wait");
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "HELLO STDIN\n");

    // background process and its logs
    let pid = ok(&server.run(
        &env,
        &[
            "sandbox",
            "exec",
            "-d",
            &id,
            "--shell",
            "echo one; echo two >&2; echo three",
        ],
    ))
    .trim()
    .to_owned();
    assert!(pid.parse::<u32>().is_ok(), "{pid}");
    let o = server.run(&env, &["sandbox", "logs", &id, &pid, "--follow"]);
    assert_eq!(ok(&o), "one\nthree\n");
    assert_eq!(stderr(&o), "two\n");
    let o = server.run(&env, &["sandbox", "logs", &id, &pid, "--stdout-from", "4"]);
    assert_eq!(ok(&o), "three\n");

    // cp: a file both ways, a directory both ways
    let work = tempfile::tempdir().expect("tempdir");
    let big: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(work.path().join("big.bin"), &big).expect("write");
    let local_big = work.path().join("big.bin");
    ok(&server.run(
        &env,
        &[
            "sandbox",
            "cp",
            local_big.to_str().expect("utf-8"),
            &format!("{id}:/home/user/"),
        ],
    ));
    let o = server.run(
        &env,
        &["sandbox", "exec", &id, "--", "wc", "-c", "/home/user/big.bin"],
    );
    assert_eq!(ok(&o).split_whitespace().next(), Some("3000000"));
    let back = work.path().join("back.bin");
    ok(&server.run(
        &env,
        &[
            "sandbox",
            "cp",
            &format!("{id}:/home/user/big.bin"),
            back.to_str().expect("utf-8"),
        ],
    ));
    assert!(
        std::fs::read(&back).expect("read") == big,
        "file round trip differs"
    );

    let tree = work.path().join("tree");
    std::fs::create_dir_all(tree.join("sub/deeper")).expect("mkdir");
    std::fs::write(tree.join("top.txt"), "top\n").expect("write");
    std::fs::write(tree.join("sub/deeper/leaf.txt"), "leaf\n").expect("write");
    std::fs::write(tree.join("sub/bytes.bin"), &big[..100_000]).expect("write");
    std::os::unix::fs::symlink("top.txt", tree.join("link")).expect("symlink");
    ok(&server.run(
        &env,
        &[
            "sandbox",
            "cp",
            tree.to_str().expect("utf-8"),
            &format!("{id}:/home/user/tree"),
        ],
    ));
    let o = server.run(
        &env,
        &[
            "sandbox",
            "exec",
            &id,
            "--",
            "cat",
            "/home/user/tree/sub/deeper/leaf.txt",
        ],
    );
    assert_eq!(ok(&o), "leaf\n");
    let out = work.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    ok(&server.run(
        &env,
        &[
            "sandbox",
            "cp",
            &format!("{id}:/home/user/tree"),
            out.to_str().expect("utf-8"),
        ],
    ));
    assert_same_tree(&tree, &out.join("tree"));
    let o = server.run(
        &env,
        &[
            "sandbox",
            "cp",
            &format!("{id}:/no/such/file"),
            out.to_str().expect("utf-8"),
        ],
    );
    fails(&o, 1, "(file_not_found)");

    // timeout
    let o = server.run(&env, &["sandbox", "timeout", &id, "2h", "--json"]);
    assert!(json(&o)["expires_at"].is_string());

    // keys: create, use, list, revoke; a revoked key is refused
    let created = json(
        &env.cmd()
            .args([
                "keys",
                "create",
                "--tenant",
                "e2e-tenant",
                "--name",
                "ci",
                "--json",
            ])
            .output()
            .expect("runs"),
    );
    let tenant_key = created["key"].as_str().expect("key").to_owned();
    let key_id = created["id"].as_str().expect("id").to_owned();
    let o = server
        .client(&env)
        .env("PADDOCK_API_KEY", &tenant_key)
        .args(["sandbox", "ls", "--json"])
        .output()
        .expect("runs");
    assert_eq!(
        json(&o)["sandboxes"],
        serde_json::json!([]),
        "another tenant's sandboxes are invisible"
    );
    let o = server
        .client(&env)
        .env("PADDOCK_API_KEY", &tenant_key)
        .args(["sandbox", "get", &id])
        .output()
        .expect("runs");
    fails(&o, 1, "(sandbox_not_found)");
    let listed = ok(&env
        .cmd()
        .args(["keys", "list", "--tenant", "e2e-tenant"])
        .output()
        .expect("runs"));
    assert!(listed.contains(&key_id), "{listed}");
    ok(&env
        .cmd()
        .args(["keys", "revoke", &key_id])
        .output()
        .expect("runs"));
    let o = server
        .client(&env)
        .env("PADDOCK_API_KEY", &tenant_key)
        .args(["sandbox", "ls"])
        .output()
        .expect("runs");
    fails(&o, 1, "(unauthorized)");
    let o = env
        .cmd()
        .args(["keys", "revoke", "000000000000"])
        .output()
        .expect("runs");
    fails(&o, 1, "(key_not_found)");

    // audit, through the API and verified locally
    let page = json(&server.run(&env, &["audit", "--sandbox", &id, "--json"]));
    let actions: Vec<&str> = page["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter_map(|r| r["action"].as_str())
        .collect();
    assert!(actions.contains(&"sandbox.create"), "{actions:?}");
    assert!(actions.contains(&"process.exit"), "{actions:?}");
    let all = json(&server.run(&env, &["audit", "--action", "key.", "--json"]));
    let key_rows: Vec<_> = all["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter(|r| r["detail"]["via"] == "cli")
        .collect();
    assert_eq!(key_rows.len(), 2, "key.create and key.revoke from the CLI: {all}");
    let limited = json(&server.run(&env, &["audit", "--limit", "2", "--json"]));
    assert_eq!(limited["records"].as_array().map(Vec::len), Some(2));
    let table = ok(&server.run(&env, &["audit", "--sandbox", &id]));
    assert!(table.starts_with("SEQ"), "{table}");
    let verified = ok(&env.cmd().args(["audit", "verify"]).output().expect("runs"));
    assert!(verified.starts_with("audit log intact: "), "{verified}");
    let v = json(
        &env.cmd()
            .args(["audit", "verify", "--json"])
            .output()
            .expect("runs"),
    );
    assert_eq!(v["ok"], true);

    // rm: the sandbox is gone, a second rm says so
    assert_eq!(ok(&server.run(&env, &["sandbox", "rm", &id])).trim(), id);
    let o = server.run(&env, &["sandbox", "ls", "--json"]);
    assert_eq!(json(&o)["sandboxes"], serde_json::json!([]));
    let o = server.run(&env, &["sandbox", "exec", &id, "--", "true"]);
    assert_code(&o, 1);
    assert!(
        wait_until(Duration::from_secs(10), || env.processes().is_empty()),
        "sandbox processes remain"
    );

    server.stop();
    env.assert_clean();
}

#[test]
fn a_second_server_on_the_same_state_directory_is_refused() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let o = env
        .cmd()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    fails(&o, 125, "already running on state directory");
    // The first one still serves.
    ok(&server.run(&env, &["sandbox", "ls"]));
    server.stop();
    env.assert_clean();
}

#[test]
fn sandboxes_survive_a_server_restart() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let id = ok(&server.run(&env, &["sandbox", "create"])).trim().to_owned();
    ok(&server.run(
        &env,
        &[
            "sandbox",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo kept > /home/user/f",
        ],
    ));
    server.stop();

    let key = std::fs::read_to_string(env.state().join("admin.key")).expect("admin key");
    let server = Server::restart(&env, &[], "info");
    assert_eq!(
        std::fs::read_to_string(env.state().join("admin.key")).expect("admin key"),
        key,
        "a restart keeps the admin key"
    );
    let o = server.run(&env, &["sandbox", "exec", &id, "--", "cat", "/home/user/f"]);
    assert_eq!(ok(&o), "kept\n");
    ok(&server.run(&env, &["sandbox", "rm", &id]));
    server.stop();
    env.assert_clean();
}

#[test]
fn a_stopped_sandbox_survives_a_server_restart_and_resumes() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let id = ok(&server.run(&env, &["sandbox", "create"])).trim().to_owned();
    ok(&server.run(
        &env,
        &[
            "sandbox",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo kept > /home/user/f",
        ],
    ));
    ok(&server.run(&env, &["sandbox", "stop", &id]));
    let info = json(&server.run(&env, &["sandbox", "get", &id, "--json"]));
    assert_eq!(info["state"], "stopped", "{info}");
    assert!(
        info["expires_at"].is_null(),
        "a stopped sandbox does not expire: {info}"
    );
    fails(
        &server.run(&env, &["sandbox", "exec", &id, "--", "true"]),
        1,
        "stopped",
    );
    // No processes, no run directory, no cgroups: only its files.
    assert!(!env.state().join("run").join(&id).exists());
    assert!(env.state().join("pool/stopped").join(&id).is_dir());
    server.kill9();

    let server = Server::restart(&env, &[], "info");
    let info = json(&server.run(&env, &["sandbox", "get", &id, "--json"]));
    assert_eq!(info["state"], "stopped", "still stopped after a restart: {info}");
    assert!(
        env.state().join("pool/stopped").join(&id).is_dir(),
        "the restart's garbage collection keeps a stopped sandbox's files"
    );
    ok(&server.run(&env, &["sandbox", "resume", &id]));
    let info = json(&server.run(&env, &["sandbox", "get", &id, "--json"]));
    assert_eq!(info["state"], "running", "{info}");
    assert!(
        !info["expires_at"].is_null(),
        "resuming restarts the timeout: {info}"
    );
    let o = server.run(&env, &["sandbox", "exec", &id, "--", "cat", "/home/user/f"]);
    assert_eq!(ok(&o), "kept\n");
    // Stopped and removed: its files go.
    ok(&server.run(&env, &["sandbox", "stop", &id]));
    ok(&server.run(&env, &["sandbox", "rm", &id]));
    assert!(!env.state().join("pool/stopped").join(&id).exists());
    let info = json(&server.run(&env, &["sandbox", "get", &id, "--json"]));
    assert_eq!(info["state"], "killed", "{info}");
    server.stop();
    env.assert_clean();
}

/// Asserts two directory trees hold the same files, contents and symlinks.
fn assert_same_tree(a: &Path, b: &Path) {
    let mut entries: Vec<_> = std::fs::read_dir(a)
        .expect("read_dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    entries.sort();
    let mut other: Vec<_> = std::fs::read_dir(b)
        .unwrap_or_else(|e| panic!("{}: {e}", b.display()))
        .flatten()
        .map(|e| e.file_name())
        .collect();
    other.sort();
    assert_eq!(entries, other, "entries of {} and {}", a.display(), b.display());
    for name in entries {
        let (pa, pb) = (a.join(&name), b.join(&name));
        let ma = std::fs::symlink_metadata(&pa).expect("stat");
        let mb = std::fs::symlink_metadata(&pb).expect("stat");
        if ma.file_type().is_symlink() {
            assert!(mb.file_type().is_symlink(), "{} is a symlink", pb.display());
            assert_eq!(
                std::fs::read_link(&pa).expect("link"),
                std::fs::read_link(&pb).expect("link")
            );
        } else if ma.is_dir() {
            assert!(mb.is_dir(), "{} is a directory", pb.display());
            assert_same_tree(&pa, &pb);
        } else {
            assert!(
                std::fs::read(&pa).expect("read") == std::fs::read(&pb).expect("read"),
                "{} differs",
                pb.display()
            );
        }
    }
}

#[test]
fn volumes_with_the_cli_and_across_a_restart() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let vid = ok(&server.run(
        &env,
        &["volume", "create", "work", "--size", "64M", "--label", "k=v"],
    ))
    .trim()
    .to_owned();
    assert!(vid.starts_with("vol-"), "{vid}");
    fails(
        &server.run(&env, &["volume", "create", "work"]),
        1,
        "already exists",
    );
    let listed = ok(&server.run(&env, &["volume", "ls"]));
    assert!(listed.starts_with("ID"), "{listed}");
    assert!(listed.contains(&vid) && listed.contains("work"), "{listed}");
    let id = ok(&server.run(
        &env,
        &[
            "sandbox",
            "create",
            "--volume",
            "work:/data",
            "--volume",
            &format!("{vid}:/ref:ro"),
        ],
    ))
    .trim()
    .to_owned();
    ok(&server.run(
        &env,
        &["sandbox", "exec", &id, "--", "sh", "-c", "echo kept > /data/f"],
    ));
    let o = server.run(
        &env,
        &["sandbox", "exec", &id, "--", "sh", "-c", "echo x > /ref/f"],
    );
    assert_ne!(o.status.code(), Some(0), "the read-only mount took a write");
    fails(
        &server.run(&env, &["sandbox", "create", "--volume", "work"]),
        125,
        "VOLUME:PATH",
    );
    server.stop();

    // After a restart the adopted sandbox still holds the volume: the delete is refused.
    let server = Server::restart(&env, &[], "info");
    let info = json(&server.run(&env, &["volume", "get", "work", "--json"]));
    assert_eq!(info["id"], vid.as_str());
    assert_eq!(info["mounted_by"], serde_json::json!([id]));
    assert_eq!(info["labels"]["k"], "v");
    fails(&server.run(&env, &["volume", "rm", "work"]), 1, "is mounted by");
    let o = server.run(&env, &["sandbox", "exec", &id, "--", "cat", "/ref/f"]);
    assert_eq!(ok(&o), "kept\n");
    ok(&server.run(&env, &["sandbox", "rm", &id]));
    assert_eq!(ok(&server.run(&env, &["volume", "rm", "work"])).trim(), "work");
    assert!(!env.state().join("pool/volumes").join(&vid).exists());
    let all = json(&server.run(&env, &["volume", "ls", "--json"]));
    assert_eq!(all["volumes"], serde_json::json!([]));
    fails(&server.run(&env, &["volume", "get", "work"]), 1, "not found");
    server.stop();
    env.assert_clean();
}

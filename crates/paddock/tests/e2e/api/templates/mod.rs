//! Templates built from registry images through the REST API, in-process against a real service:
//! the images are made here with `umoci` (a static busybox and a few files, in two layers, the
//! second with a whiteout), pushed with `skopeo` to a real `docker-registry` on 127.0.0.1 (TLS from
//! a test CA, basic auth), pulled by paddock and unpacked into a template. Sandboxes made from it
//! run the image's programs with its environment, working directory and user, on a copy of its
//! tree; a hostile layer is refused with `invalid_image` and leaves nothing; bad input gets its
//! stable code; a template in use cannot be deleted; another tenant sees none of it.

mod archives;
mod boot;
mod contexts;
mod debian;
mod images;
mod quotas;
mod recipes;

use std::path::{Path, PathBuf};
use std::process::Command;

use paddock_registry::{CredentialSources, Credentials, PullOptions};
use reqwest::Method;
use serde_json::{json, Value};

use super::{JSON, NDJSON, SOON};
use crate::support::harness::{Client, Harness, Lines, Options};
use crate::support::registry::{run, TestRegistry, PASSWORD, USER};

/// Busybox applets the test image links (what the tests below run).
pub(super) const APPLETS: &[&str] = &[
    "sh", "cat", "id", "env", "pwd", "ls", "echo", "touch", "rm", "test", "stat", "mkdir", "readlink",
    "httpd", "wget", "sleep",
];

/// An OCI layout made with umoci, in a directory of its own.
pub(super) struct Layout {
    pub(super) dir: tempfile::TempDir,
}

impl Layout {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Self { dir };
        run(Command::new("umoci")
            .arg("init")
            .arg("--layout")
            .arg(layout.path()));
        run(Command::new("umoci")
            .args(["new", "--image"])
            .arg(layout.image("base")));
        layout
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("img")
    }

    fn image(&self, tag: &str) -> String {
        format!("{}:{tag}", self.path().display())
    }

    /// Unpacks `tag` into a fresh bundle; returns its root file system's path.
    fn unpack(&self, tag: &str, bundle: &str) -> PathBuf {
        let bundle = self.dir.path().join(bundle);
        run(Command::new("umoci")
            .args(["unpack", "--rootless", "--image"])
            .arg(self.image(tag))
            .arg(&bundle));
        bundle.join("rootfs")
    }

    fn repack(&self, tag: &str, rootfs: &Path) {
        run(Command::new("umoci")
            .args(["repack", "--refresh-bundle", "--image"])
            .arg(self.image(tag))
            .arg(rootfs.parent().expect("bundle")));
    }

    fn config(&self, tag: &str, args: &[&str]) {
        run(Command::new("umoci")
            .args(["config", "--image"])
            .arg(self.image(tag))
            .args(args));
    }
}

/// Image `app:v1`: layer 1 has busybox (and its applets), accounts with a user `app` (uid 2000),
/// `/etc/greeting`, `/usr/share/doomed` and `/srv`; layer 2 deletes `/usr/share/doomed` (a
/// whiteout) and adds `/etc/second`. Its config sets `PATH`, `GREETING`, `/srv` and `app`.
pub(super) fn app_image() -> Layout {
    let layout = Layout::new();
    let rootfs = layout.unpack("base", "bundle");
    for dir in ["bin", "etc", "usr/share", "srv", "home/app"] {
        std::fs::create_dir_all(rootfs.join(dir)).expect("mkdir");
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("copy busybox");
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).expect("applet");
    }
    std::fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\napp:x:2000:2000:app:/home/app:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\napp:x:2000:\n").expect("group");
    std::fs::write(rootfs.join("etc/greeting"), "hello from the image\n").expect("greeting");
    std::fs::write(rootfs.join("srv/index.html"), "served at boot\n").expect("index");
    // A set-uid root program (harmless on `nosuid` mounts) and a top-level symlink to `/` (the
    // sandbox's own root, never the host's).
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox-suid")).expect("copy busybox");
    rustix::fs::chmod(
        rootfs.join("bin/busybox-suid").as_path(),
        rustix::fs::Mode::from_raw_mode(0o4755),
    )
    .expect("chmod");
    std::os::unix::fs::symlink("/", rootfs.join("hostroot")).expect("symlink");
    std::fs::write(rootfs.join("usr/share/doomed"), "doomed\n").expect("doomed");
    layout.repack("v1", &rootfs);
    std::fs::remove_file(rootfs.join("usr/share/doomed")).expect("rm doomed");
    std::fs::write(rootfs.join("etc/second"), "second layer\n").expect("second");
    layout.repack("v1", &rootfs);
    layout.config(
        "v1",
        &[
            "--config.env=PATH=/bin",
            "--config.env=GREETING=hi",
            "--config.workingdir=/srv",
            "--config.user=app",
            "--config.cmd=/bin/sh",
            "--os=linux",
            "--architecture=amd64",
        ],
    );
    layout
}

/// Image `bad:v1`: busybox, then a layer whose symlink `evil -> /` is followed by a file written
/// through it (`evil/paddock-template-escape`), which must never land on the host.
pub(super) fn hostile_image() -> Layout {
    let layout = Layout::new();
    let rootfs = layout.unpack("base", "bundle");
    std::fs::create_dir_all(rootfs.join("bin")).expect("mkdir");
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("copy busybox");
    layout.repack("bad", &rootfs);
    let mut b = tar::Builder::new(Vec::new());
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(tar::EntryType::Symlink);
    link.set_size(0);
    link.set_mode(0o777);
    b.append_link(&mut link, "evil", "/").expect("symlink member");
    let data = b"escaped\n";
    let mut file = tar::Header::new_gnu();
    file.set_entry_type(tar::EntryType::Regular);
    file.set_size(data.len() as u64);
    file.set_mode(0o644);
    b.append_data(&mut file, "evil/tmp/paddock-template-escape", &data[..])
        .expect("file member");
    let tar = layout.dir.path().join("evil.tar");
    std::fs::write(&tar, b.into_inner().expect("tar")).expect("write tar");
    run(Command::new("umoci")
        .args(["raw", "add-layer", "--image"])
        .arg(layout.image("bad"))
        .arg(&tar));
    layout.config("bad", &["--os=linux", "--architecture=amd64"]);
    layout
}

/// Image `etclink:v1`: its `/etc` is a symlink to `/` (paddock mounts the sandbox's own `/etc`
/// there, and writes into it from the host: refused).
pub(super) fn etc_symlink_image() -> Layout {
    let layout = Layout::new();
    let rootfs = layout.unpack("base", "bundle");
    std::fs::create_dir_all(rootfs.join("bin")).expect("mkdir");
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("copy busybox");
    std::os::unix::fs::symlink("/", rootfs.join("etc")).expect("etc symlink");
    layout.repack("etclink", &rootfs);
    layout.config("etclink", &["--os=linux", "--architecture=amd64"]);
    layout
}

pub(super) fn options(registry: &TestRegistry, credentials: Credentials) -> Options {
    Options {
        images: paddock_control::ImagesConfig {
            pull_dir: None,
            pull: PullOptions {
                credentials: CredentialSources {
                    explicit: Some(credentials),
                    environment: None,
                    docker_config: None,
                },
                extra_ca_file: Some(registry.ca_file.clone()),
                ..PullOptions::default()
            },
            limits: paddock_runtime::TemplateLimits::default(),
        },
        ..Options::default()
    }
}

pub(super) fn good_credentials() -> Credentials {
    Credentials::Basic {
        username: USER.into(),
        password: PASSWORD.into(),
    }
}

/// Builds with `Accept: application/json`.
pub(super) async fn build(client: &Client, name: &str, from: &str) -> crate::support::harness::Reply {
    build_with(client, json!({"name": name, "from": from})).await
}

/// Builds `body` with `Accept: application/json`.
pub(super) async fn build_with(client: &Client, body: Value) -> crate::support::harness::Reply {
    Client::send(
        client
            .request(Method::POST, "/v1/templates")
            .header("accept", JSON)
            .json(&body),
    )
    .await
}

/// Runs `argv` in sandbox `id` (with extra request fields); returns (exit code, stdout, stderr).
pub(super) async fn run_in(client: &Client, id: &str, mut req: Value) -> (i64, String, String) {
    if req.get("argv").is_none() && req.get("shell").is_none() {
        panic!("no command in {req}");
    }
    req["timeout_ms"] = json!(60_000);
    let r = client.exec_json(id, req).await;
    (
        r["exit"]["exit_code"].as_i64().unwrap_or(-1),
        r["stdout"].as_str().unwrap_or_default().to_owned(),
        r["stderr"].as_str().unwrap_or_default().to_owned(),
    )
}

pub(super) fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Builds `body` streamed (NDJSON); returns its events.
pub(super) async fn build_streamed(client: &Client, body: Value) -> Vec<Value> {
    let response = client
        .request(Method::POST, "/v1/templates")
        .header("accept", NDJSON)
        .json(&body)
        .send()
        .await
        .expect("build answered");
    assert_eq!(response.status(), 200);
    Lines::new(response).rest(SOON * 9).await
}

pub(super) fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().filter_map(|e| e["event"].as_str()).collect()
}

/// `(instruction, cached)` of every step event.
pub(super) fn steps(events: &[Value]) -> Vec<(String, bool)> {
    events
        .iter()
        .filter(|e| e["event"] == "step")
        .map(|e| {
            (
                e["instruction"].as_str().unwrap_or_default().to_owned(),
                e["cached"] == true,
            )
        })
        .collect()
}

/// The `paddock_warm_pool_size` gauge of `template`.
pub(super) fn warm_gauge(metrics: &str, template: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.starts_with("paddock_warm_pool_size{") && l.contains(&format!("template=\"{template}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

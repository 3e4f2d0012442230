//! Templates built from registry images through the REST API, in-process against a real service:
//! the images are made here with `umoci` (a static busybox and a few files, in two layers, the
//! second with a whiteout), pushed with `skopeo` to a real `docker-registry` on 127.0.0.1 (TLS from
//! a test CA, basic auth), pulled by paddock and unpacked into a template. Sandboxes made from it
//! run the image's programs with its environment, working directory and user, on a copy of its
//! tree; a hostile layer is refused with `invalid_image` and leaves nothing; bad input gets its
//! stable code; a template in use cannot be deleted; another tenant sees none of it.

use std::path::{Path, PathBuf};
use std::process::Command;

use paddock_registry::{CredentialSources, Credentials, PullOptions};
use reqwest::Method;
use serde_json::{json, Value};

use super::{JSON, NDJSON, SOON};
use crate::support::harness::{Client, Harness, Lines, Options};
use crate::support::registry::{run, TestRegistry, PASSWORD, USER};

/// Busybox applets the test image links (what the tests below run).
const APPLETS: &[&str] = &[
    "sh", "cat", "id", "env", "pwd", "ls", "echo", "touch", "rm", "test", "stat", "mkdir", "readlink",
    "httpd", "wget", "sleep",
];

/// An OCI layout made with umoci, in a directory of its own.
struct Layout {
    dir: tempfile::TempDir,
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
fn app_image() -> Layout {
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
fn hostile_image() -> Layout {
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
fn etc_symlink_image() -> Layout {
    let layout = Layout::new();
    let rootfs = layout.unpack("base", "bundle");
    std::fs::create_dir_all(rootfs.join("bin")).expect("mkdir");
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("copy busybox");
    std::os::unix::fs::symlink("/", rootfs.join("etc")).expect("etc symlink");
    layout.repack("etclink", &rootfs);
    layout.config("etclink", &["--os=linux", "--architecture=amd64"]);
    layout
}

fn options(registry: &TestRegistry, credentials: Credentials) -> Options {
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

fn good_credentials() -> Credentials {
    Credentials::Basic {
        username: USER.into(),
        password: PASSWORD.into(),
    }
}

/// Builds with `Accept: application/json`.
async fn build(client: &Client, name: &str, from: &str) -> crate::support::harness::Reply {
    build_with(client, json!({"name": name, "from": from})).await
}

/// Builds `body` with `Accept: application/json`.
async fn build_with(client: &Client, body: Value) -> crate::support::harness::Reply {
    Client::send(
        client
            .request(Method::POST, "/v1/templates")
            .header("accept", JSON)
            .json(&body),
    )
    .await
}

/// Runs `argv` in sandbox `id` (with extra request fields); returns (exit code, stdout, stderr).
async fn run_in(client: &Client, id: &str, mut req: Value) -> (i64, String, String) {
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

fn names_in(dir: &Path) -> Vec<String> {
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

#[test]
fn an_image_template_runs_the_images_programs_with_its_env_workdir_and_user() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    let h = Harness::with(options(&registry, good_credentials()));
    let pool = h.env().state().join("pool");
    h.block_on(async {
        let a = h.admin.new_tenant("tpl-owner").await;
        let b = h.admin.new_tenant("tpl-other").await;

        // Built once (JSON answer), with the image's digest, layers and process defaults.
        let info = build(&a, "app", &from).await.ok(201);
        let id = info["id"].as_str().expect("id").to_owned();
        assert!(id.starts_with("tp-"), "{info}");
        assert_eq!(info["source"], from.as_str());
        assert!(info["digest"].as_str().is_some_and(|d| d.starts_with("sha256:")), "{info}");
        assert_eq!(info["layers"].as_array().map(Vec::len), Some(2), "{info}");
        assert_eq!(info["config"]["working_dir"], "/srv");
        assert_eq!(info["config"]["user"], "app");
        assert_eq!(names_in(&pool.join("images")), std::slice::from_ref(&id));
        assert!(names_in(&pool.join("builds")).iter().all(|n| !n.starts_with("tp-")));
        assert!(names_in(&h.env().state().join("pulls")).is_empty(), "the pulled image stays behind");

        // The same image again, streamed: both layers come from the cache.
        let response = a
            .request(Method::POST, "/v1/templates")
            .header("accept", NDJSON)
            .json(&json!({"name": "app-again", "from": from}))
            .send()
            .await
            .expect("build answered");
        assert_eq!(response.status(), 200);
        let events = Lines::new(response).rest(SOON * 6).await;
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
        assert_eq!(kinds, ["pulling", "pulled", "layer", "layer", "done"], "{events:#?}");
        assert!(events[2..4].iter().all(|e| e["cached"] == true), "{events:#?}");
        let again = events[4]["template"]["id"].as_str().expect("id").to_owned();

        // Listed with the server's own; another tenant sees neither and cannot use them.
        let list = a.get("/v1/templates").await.ok(200);
        let names: Vec<&str> = list["templates"]
            .as_array()
            .expect("templates")
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(names, ["default", "app", "app-again"]);
        let other = b.get("/v1/templates").await.ok(200);
        assert_eq!(other["templates"].as_array().map(Vec::len), Some(1), "{other}");
        b.get("/v1/templates/app").await.err(404, "template_not_found");
        b.get(&format!("/v1/templates/{id}")).await.err(404, "template_not_found");
        b.delete("/v1/templates/app").await.err(404, "template_not_found");
        b.post("/v1/sandboxes", json!({"template": "app"}))
            .await
            .err(400, "invalid_request");

        // A sandbox from it: the image's programs, env, working directory and user.
        let sb = a.create_sandbox(json!({"template": "app"})).await;
        let (code, out, err) = run_in(&a, &sb, json!({"argv": ["cat", "/etc/greeting", "/etc/second"]})).await;
        assert_eq!((code, out.as_str()), (0, "hello from the image\nsecond layer\n"), "{err}");
        let (code, out, _) = run_in(&a, &sb, json!({"shell": "echo $GREETING; pwd; id -un; id -u"})).await;
        assert_eq!((code, out.as_str()), (0, "hi\n/srv\napp\n2000\n"));
        // The whiteout of layer 2 removed layer 1's file.
        let (code, _, _) = run_in(&a, &sb, json!({"argv": ["test", "-e", "/usr/share/doomed"]})).await;
        assert_eq!(code, 1, "the whited-out file is there");
        // Root and the added default user exist; paddock's generated files are the sandbox's.
        let (_, out, _) = run_in(&a, &sb, json!({"argv": ["id", "-u"], "user": "root"})).await;
        assert_eq!(out, "0\n");
        let (_, out, _) = run_in(&a, &sb, json!({"argv": ["id", "-un"], "user": "user"})).await;
        assert_eq!(out, "user\n");
        let (_, out, _) = run_in(&a, &sb, json!({"argv": ["cat", "/etc/hostname"]})).await;
        assert_eq!(out.trim(), sb);
        // The image's tree is the sandbox's to change (nosuid, nodev), never the template's: a
        // second sandbox starts from the image as built. The root's top level stays read-only.
        let (code, _, err) = run_in(
            &a,
            &sb,
            json!({"shell": "echo changed > /etc/greeting && echo new > /bin/added", "user": "root"}),
        )
        .await;
        assert_eq!(code, 0, "{err}");
        let (code, _, _) = run_in(&a, &sb, json!({"argv": ["mkdir", "/newtop"], "user": "root"})).await;
        assert_ne!(code, 0, "a new top-level directory was made");
        let (_, mounts, _) = run_in(&a, &sb, json!({"argv": ["cat", "/proc/self/mountinfo"]})).await;
        for line in mounts.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if ["/usr", "/etc", "/bin", "/srv"].contains(&fields[4]) {
                assert!(
                    fields[5].contains("nosuid") && fields[5].contains("nodev"),
                    "{line}"
                );
            }
        }
        let sb2 = a.create_sandbox(json!({"template": "app", "env": {"GREETING": "mine"}, "workdir": "/tmp", "user": "root"})).await;
        let (_, out, _) = run_in(
            &a,
            &sb2,
            json!({"shell": "cat /etc/greeting; test -e /bin/added || echo no-added; echo $GREETING; pwd; id -un"}),
        )
        .await;
        assert_eq!(out, "hello from the image\nno-added\nmine\n/tmp\nroot\n", "the request's values win");

        // In use: not deletable; once its sandboxes are gone, deleted with its storage.
        let refused = a.delete("/v1/templates/app").await.err(409, "template_in_use");
        assert!(refused["message"].as_str().is_some_and(|m| m.contains(&sb)), "{refused}");
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
        a.delete(&format!("/v1/sandboxes/{sb2}")).await.ok(204);
        a.delete("/v1/templates/app").await.ok(204);
        a.get("/v1/templates/app").await.err(404, "template_not_found");
        assert_eq!(names_in(&pool.join("images")), std::slice::from_ref(&again));
        // Its layers stay cached while the other template uses them, and go with it.
        assert_eq!(names_in(&pool.join("layers")).len(), 2);
        a.delete("/v1/templates/app-again").await.ok(204);
        assert!(names_in(&pool.join("images")).is_empty());
        assert!(names_in(&pool.join("layers")).is_empty(), "unused layers stay cached");
        // The name is free again.
        build(&a, "app", &from).await.ok(201);
        a.delete("/v1/templates/app").await.ok(204);
        // Every build and delete is in the audit log.
        let rows = a.audit_rows(&[("action", "template.build")]).await;
        assert_eq!(rows.len(), 3, "{rows:#?}");
        let rows = a.audit_rows(&[("action", "template.delete")]).await;
        assert_eq!(rows.len(), 4, "three deletes and one refusal: {rows:#?}");
    });
}

#[test]
fn hostile_images_and_bad_input_are_refused_with_stable_codes_and_leave_nothing() {
    let registry = TestRegistry::start();
    let bad = hostile_image();
    registry.push(&bad.path(), "bad", "paddock/bad", "v1");
    let good = app_image();
    registry.push(&good.path(), "v1", "paddock/app", "v1");
    let h = Harness::with(options(&registry, good_credentials()));
    let pool = h.env().state().join("pool");
    h.block_on(async {
        let a = h.admin.new_tenant("tpl-attacker").await;
        let host = registry.host();
        // The symlink-then-write-through layer: refused, nothing on the host, nothing kept.
        let refused = build(&a, "bad", &format!("{host}/paddock/bad:v1"))
            .await
            .err(400, "invalid_image");
        assert!(
            !Path::new("/tmp/paddock-template-escape").exists(),
            "a layer wrote through a symlink onto the host"
        );
        assert!(
            refused["message"].as_str().is_some_and(|m| !m.contains('\n')),
            "{refused}"
        );
        // Streamed, the failure is the last event.
        let response = a
            .request(Method::POST, "/v1/templates")
            .header("accept", NDJSON)
            .json(&json!({"name": "bad", "from": format!("{host}/paddock/bad:v1")}))
            .send()
            .await
            .expect("answered");
        let events = Lines::new(response).rest(SOON * 3).await;
        let last = events.last().expect("events");
        assert_eq!(
            (last["event"].as_str(), last["code"].as_str()),
            (Some("error"), Some("invalid_image")),
            "{events:#?}"
        );

        // An image whose /etc is a symlink.
        let etclink = etc_symlink_image();
        registry.push(&etclink.path(), "etclink", "paddock/etclink", "v1");
        let refused = build(&a, "etclink", &format!("{host}/paddock/etclink:v1"))
            .await
            .err(400, "invalid_image");
        assert!(
            refused["message"].as_str().is_some_and(|m| m.contains("/etc")),
            "{refused}"
        );

        // Bad input, each with its code, none leaving a record.
        build(&a, "x", &format!("{host}/paddock/app:nope"))
            .await
            .err(404, "image_not_found");
        build(&a, "x", "127.0.0.1:1/paddock/app:v1")
            .await
            .err(502, "registry_unreachable");
        build(&a, "x", "Not A Reference")
            .await
            .err(400, "invalid_request");
        build(&a, "default", &format!("{host}/paddock/app:v1"))
            .await
            .err(409, "template_exists");
        build(&a, "tp-sneaky", &format!("{host}/paddock/app:v1"))
            .await
            .err(400, "invalid_request");
        build(&a, "../x", &format!("{host}/paddock/app:v1"))
            .await
            .err(400, "invalid_request");
        let list = a.get("/v1/templates").await.ok(200);
        assert_eq!(list["templates"].as_array().map(Vec::len), Some(1), "{list}");
        assert!(names_in(&pool.join("images")).is_empty());
        assert!(
            names_in(&pool.join("builds"))
                .iter()
                .all(|n| !n.starts_with("tp-")),
            "{:?}",
            names_in(&pool.join("builds"))
        );
        assert!(
            names_in(&pool.join("layers")).is_empty(),
            "{:?}",
            names_in(&pool.join("layers"))
        );
        assert!(names_in(&h.env().state().join("pulls")).is_empty());
    });
    drop(h);
    // Wrong credentials: the registry's refusal, as its own code.
    let h = Harness::with(options(
        &registry,
        Credentials::Basic {
            username: USER.into(),
            password: "wrong".into(),
        },
    ));
    h.block_on(async {
        let a = h.admin.new_tenant("tpl-wrong-creds").await;
        build(&a, "app", &format!("{}/paddock/app:v1", registry.host()))
            .await
            .err(502, "registry_unauthorized");
        a.get("/v1/templates/app").await.err(404, "template_not_found");
    });
}

#[test]
fn a_start_command_runs_at_every_boot_and_a_sandbox_is_handed_out_once_ready() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    let h = Harness::with(options(&registry, good_credentials()));
    h.block_on(async {
        let a = h.admin.new_tenant("tpl-start").await;
        // The server listens a second after the command starts: a sandbox handed out before its
        // port accepts would fail the first request below.
        let start = json!({
            "command": ["sh", "-c", "sleep 1; exec httpd -f -p 8000 -h /srv"],
            "ready": {"port": 8000, "timeout_secs": 60}
        });
        let info = build_with(&a, json!({"name": "web", "from": from, "start": start}))
            .await
            .ok(201);
        assert_eq!(info["start"]["ready"]["port"], 8000, "{info}");
        // Ready when handed out: the first request inside the sandbox is served.
        let sb = a.create_sandbox(json!({"template": "web"})).await;
        let (code, out, err) = run_in(&a, &sb, json!({"argv": ["wget", "-qO-", "http://127.0.0.1:8000/index.html"]})).await;
        assert_eq!((code, out.as_str()), (0, "served at boot\n"), "{err}");
        let processes = a.get(&format!("/v1/sandboxes/{sb}/processes")).await.ok(200);
        let started: Vec<&Value> = processes["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .filter(|p| p["tag"] == "start")
            .collect();
        assert_eq!(started.len(), 1, "{processes:#}");
        assert_eq!(started[0]["running"], true, "{processes:#}");
        // Again at a resume: a stopped sandbox boots anew.
        a.post(&format!("/v1/sandboxes/{sb}/stop"), json!({})).await.ok(200);
        a.post(&format!("/v1/sandboxes/{sb}/resume"), json!({})).await.ok(200);
        let (code, out, _) = run_in(&a, &sb, json!({"argv": ["wget", "-qO-", "http://127.0.0.1:8000/index.html"]})).await;
        assert_eq!((code, out.as_str()), (0, "served at boot\n"));
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);

        // A check that never passes: the create fails with `timeout` and leaves no sandbox.
        let never = json!({"command": ["sleep", "600"], "ready": {"command": ["test", "-e", "/nothing"], "timeout_secs": 1}});
        build_with(&a, json!({"name": "never", "from": from, "start": never}))
            .await
            .ok(201);
        a.post("/v1/sandboxes", json!({"template": "never"}))
            .await
            .err(504, "timeout");
        let list = a.get("/v1/sandboxes").await.ok(200);
        let running: Vec<&Value> = list["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .filter(|s| s["state"] == "running")
            .collect();
        assert!(running.is_empty(), "{list:#}");
        // Invalid start specifications are refused before anything is fetched.
        for (start, field) in [
            (json!({"command": []}), "start.command"),
            (json!({"ready": {"port": 80, "command": ["true"]}}), "start.ready"),
            (json!({"ready": {"port": 0}}), "start.ready.port"),
            (json!({"ready": {"port": 80, "timeout_secs": 100000}}), "start.ready.timeout_secs"),
        ] {
            let refused = build_with(&a, json!({"name": "bad-start", "from": from, "start": start}))
                .await
                .err(400, "invalid_request");
            assert_eq!(refused["field"], field, "{refused}");
        }
    });
}

#[test]
fn a_sandbox_from_an_image_keeps_every_isolation_property() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    let h = Harness::with(options(&registry, good_credentials()));
    let probe = format!("paddock-image-probe-{}", std::process::id());
    h.block_on(async {
        let a = h.admin.new_tenant("tpl-escape").await;
        build(&a, "app", &from).await.ok(201);
        let sb = a
            .create_sandbox(json!({"template": "app", "limits": {"disk": "64M"}}))
            .await;
        for user in ["app", "root"] {
            // No capabilities, no new privileges, seccomp filtering, unprivileged host ids.
            let (_, status, _) = run_in(&a, &sb, json!({"argv": ["cat", "/proc/self/status"], "user": user})).await;
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(str::trim)
                    .unwrap_or_default()
                    .to_owned()
            };
            assert_eq!(field("CapEff:"), "0000000000000000", "{user}: {status}");
            assert_eq!(field("NoNewPrivs:"), "1", "{user}");
            assert_eq!(field("Seccomp:"), "2", "{user}");
            let (_, map, _) = run_in(&a, &sb, json!({"argv": ["cat", "/proc/self/uid_map"], "user": user})).await;
            let host_base: u64 = map.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("uid_map");
            assert!(host_base >= 100_000, "{user} maps to host uid {host_base}");
            // The image's set-uid program gives nothing: its mounts are nosuid.
            let (_, mode, _) = run_in(&a, &sb, json!({"argv": ["stat", "-c", "%a %u", "/bin/busybox-suid"]})).await;
            assert_eq!(mode, "4755 0\n", "the image's set-uid root program is kept as it is");
            let (_, uid, err) = run_in(&a, &sb, json!({"argv": ["busybox-suid", "id", "-u"], "user": user})).await;
            let expected = if user == "root" { "0\n" } else { "2000\n" };
            assert_eq!(uid, expected, "the set-uid bit took effect for {user}: {err}");
            // No host path is writable or visible, also through the image's symlink to `/`.
            let script = format!(
                "for d in / /hostroot /hostroot/var/tmp /proc/sys/kernel /dev /sys; do \
                   if touch $d/{probe} 2>/dev/null; then echo WROTE $d; fi; done; \
                 for p in /var/tmp /hostroot/var/tmp /hostroot/root/.cargo /hostroot/work /run /sys/fs/cgroup; do \
                   if test -e $p; then echo VISIBLE $p; fi; done; \
                 if echo x > /proc/1/root/etc/hostname.host 2>/dev/null; then echo WROTE init-root; fi; \
                 echo done"
            );
            let (code, out, err) = run_in(&a, &sb, json!({"shell": script, "user": user})).await;
            assert_eq!((code, out.as_str()), (0, "done\n"), "{user}: {err}");
        }
        for d in ["/", "/var/tmp", "/tmp", "/dev"] {
            assert!(!Path::new(d).join(&probe).exists(), "probe appeared in host {d}");
        }
        // The agent, injected from the host, cannot be replaced.
        let (_, exe, _) = run_in(&a, &sb, json!({"argv": ["readlink", "/proc/1/exe"], "user": "root"})).await;
        let (code, _, _) = run_in(
            &a,
            &sb,
            json!({"shell": format!("echo x > {}", exe.trim()), "user": "root"}),
        )
        .await;
        assert_ne!(code, 0, "the agent binary {exe} was writable");
        // The sandbox's disk limit holds on the image's tree (the image's own bytes are not
        // charged to it: the 64M sandbox starts on a 1M image without using its limit).
        let (code, _, err) = run_in(
            &a,
            &sb,
            json!({"shell": "i=0; while [ $i -lt 100 ]; do cat /bin/busybox >> /srv/fill || exit 3; i=$((i+1)); done", "user": "root"}),
        )
        .await;
        assert_eq!(code, 3, "100 MB written under a 64M limit: {err}");
        assert!(err.contains("Disk quota exceeded") || err.contains("No space"), "{err}");
        let (code, _, _) = run_in(&a, &sb, json!({"shell": "rm /srv/fill", "user": "root"})).await;
        assert_eq!(code, 0);
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
    });
}

/// Builds `body` streamed (NDJSON); returns its events.
async fn build_streamed(client: &Client, body: Value) -> Vec<Value> {
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

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().filter_map(|e| e["event"].as_str()).collect()
}

/// `(instruction, cached)` of every step event.
fn steps(events: &[Value]) -> Vec<(String, bool)> {
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

#[test]
fn a_recipe_runs_its_steps_in_sandboxes_and_a_rebuild_reuses_the_unchanged_ones() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    let h = Harness::with(options(&registry, good_credentials()));
    h.block_on(async {
        let a = h.admin.new_tenant("tpl-recipe").await;
        let recipe = |last: &str| {
            format!(
                "ARG BASE={from}\n\
                 FROM $BASE\n\
                 # a comment (the image's USER is app: RUN steps run as it until this)\n\
                 USER root\n\
                 RUN echo made > /srv/made && id -u > /srv/made-by && echo to-the-log\n\
                 ENV STAGE=one\n\
                 RUN echo \"$STAGE\" >> /srv/made\n\
                 USER app\n\
                 WORKDIR /srv/work\n\
                 RUN {last}\n\
                 CMD [\"httpd\", \"-f\", \"-p\", \"8000\"]\n"
            )
        };
        let first = recipe("id -un > who");
        let run_rows = |rows: Vec<Value>| {
            rows.iter()
                .filter(|r| r["detail"]["tag"] == "recipe-step")
                .count()
        };

        // Built: every step runs (the FROM is pulled), its output streams as it comes.
        let events = build_streamed(&a, json!({"name": "r1", "recipe": first})).await;
        assert_eq!(
            events.last().map(|e| e["event"].clone()),
            Some(json!("done")),
            "{events:#?}"
        );
        assert!(kinds(&events).contains(&"pulling"), "{events:#?}");
        assert!(steps(&events).iter().all(|(_, cached)| !cached), "{events:#?}");
        assert!(
            events
                .iter()
                .any(|e| e["event"] == "log" && e["text"].as_str().is_some_and(|t| t.contains("to-the-log"))),
            "{events:#?}"
        );
        let info = &events.last().expect("done")["template"];
        assert_eq!(info["config"]["user"], "app");
        assert_eq!(info["config"]["working_dir"], "/srv/work");
        assert_eq!(info["config"]["cmd"], json!(["httpd", "-f", "-p", "8000"]));
        assert_eq!(run_rows(a.audit_rows(&[("action", "process.start")]).await), 3);

        // A sandbox from it has what the steps made, as their users, and the recipe's defaults.
        let sb = a.create_sandbox(json!({"template": "r1"})).await;
        let (code, out, err) = run_in(
            &a,
            &sb,
            json!({"shell": "cat /srv/made /srv/made-by /srv/work/who; echo $STAGE; pwd; id -un"}),
        )
        .await;
        assert_eq!(
            (code, out.as_str()),
            (0, "made\none\n0\napp\none\n/srv/work\napp\n"),
            "{err}"
        );
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);

        // The same recipe again: nothing runs, nothing is pulled.
        let events = build_streamed(&a, json!({"name": "r2", "recipe": first})).await;
        assert_eq!(
            events.last().map(|e| e["event"].clone()),
            Some(json!("done")),
            "{events:#?}"
        );
        assert!(!kinds(&events).contains(&"pulling"), "{events:#?}");
        assert!(steps(&events).iter().all(|(_, cached)| *cached), "{events:#?}");
        assert_eq!(run_rows(a.audit_rows(&[("action", "process.start")]).await), 3);

        // The last step changed: only it runs.
        let events = build_streamed(
            &a,
            json!({"name": "r3", "recipe": recipe("echo changed > /srv/work/changed")}),
        )
        .await;
        assert_eq!(
            events.last().map(|e| e["event"].clone()),
            Some(json!("done")),
            "{events:#?}"
        );
        let runs: Vec<bool> = steps(&events)
            .iter()
            .filter(|(instruction, _)| instruction.starts_with("RUN"))
            .map(|(_, cached)| *cached)
            .collect();
        assert_eq!(runs, [true, true, false], "{events:#?}");
        assert_eq!(run_rows(a.audit_rows(&[("action", "process.start")]).await), 4);
        let sb = a.create_sandbox(json!({"template": "r3"})).await;
        let (_, out, _) = run_in(
            &a,
            &sb,
            json!({"shell": "cat /srv/work/changed; test -e /srv/work/who || echo no-who"}),
        )
        .await;
        assert_eq!(out, "changed\nno-who\n");
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);

        // A failing step fails the build (with its line), keeps nothing of it and no sandbox.
        let failed = build_with(
            &a,
            json!({"name": "broken", "recipe": format!("FROM {from}\nRUN echo fine\nRUN exit 7\n")}),
        )
        .await
        .err(422, "build_failed");
        let message = failed["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("line 3") && message.contains("code 7"),
            "{failed}"
        );
        a.get("/v1/templates/broken").await.err(404, "template_not_found");
        let list = a.get("/v1/sandboxes").await.ok(200);
        assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0), "{list:#}");
        let images = names_in(&h.env().state().join("pool/images"));
        assert_eq!(images.len(), 3, "{images:?}");
        // What this server does not build, and what is no recipe.
        build_with(
            &a,
            json!({"name": "x", "recipe": format!("FROM {from}\nCOPY a /a\n")}),
        )
        .await
        .err(501, "unsupported");
        let bad = build_with(
            &a,
            json!({"name": "x", "recipe": format!("FROM {from}\nHEALTHCHECK NONE\n")}),
        )
        .await
        .err(400, "invalid_request");
        assert_eq!(bad["field"], "recipe", "{bad}");
        build_with(
            &a,
            json!({"name": "x", "from": from, "recipe": format!("FROM {from}\n")}),
        )
        .await
        .err(400, "invalid_request");
    });
}

#[test]
fn the_cli_builds_lists_shows_and_removes_templates_and_says_why_a_build_failed() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    let h = Harness::with(options(&registry, good_credentials()));
    let a = h.block_on(h.admin.new_tenant("tpl-cli"));
    let cli = |args: &[&str], stdin: Option<&str>| {
        use std::io::Write as _;
        let mut child = Command::new(crate::support::paddock_bin())
            .args(args)
            .env("PADDOCK_URL", &a.base)
            .env("PADDOCK_API_KEY", a.key.as_deref().expect("key"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run the CLI");
        let mut input = child.stdin.take().expect("stdin");
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .expect("write stdin");
        drop(input);
        child.wait_with_output().expect("CLI output")
    };
    // Not a terminal: plain progress lines on stderr, the name on stdout.
    let o = cli(&["template", "build", "app", "--from", &from], None);
    crate::support::assert_code(&o, 0);
    assert_eq!(crate::support::stdout(&o), "app\n");
    let progress = crate::support::stderr(&o);
    assert!(
        progress.contains("pulling") && progress.contains("layer 2/2"),
        "{progress}"
    );
    // A recipe from stdin, with a build argument and its step's output shown.
    let recipe = format!("FROM {from}\nARG WHO=nobody\nUSER root\nRUN echo built-for-$WHO\n");
    let o = cli(
        &[
            "template",
            "build",
            "app-recipe",
            "-f",
            "-",
            "--build-arg",
            "WHO=cli",
        ],
        Some(&recipe),
    );
    crate::support::assert_code(&o, 0);
    assert!(
        crate::support::stderr(&o).contains("built-for-cli"),
        "{}",
        crate::support::stderr(&o)
    );
    let o = cli(&["template", "ls"], None);
    crate::support::assert_code(&o, 0);
    let listing = crate::support::stdout(&o);
    assert!(
        listing.contains("default") && listing.contains("app-recipe") && listing.contains(&from),
        "{listing}"
    );
    let o = cli(&["template", "get", "app"], None);
    crate::support::assert_code(&o, 0);
    let shown = crate::support::stdout(&o);
    assert!(
        shown.contains("workdir:   /srv") && shown.contains("user:      app"),
        "{shown}"
    );
    // Failures: one readable line and a non-zero exit; nothing is left.
    for (args, code) in [
        (
            vec!["template", "build", "x", "--from", "127.0.0.1:1/paddock/app:v1"],
            "registry_unreachable",
        ),
        (
            vec!["template", "build", "app", "--from", from.as_str()],
            "template_exists",
        ),
        (vec!["template", "get", "nope"], "template_not_found"),
    ] {
        let o = cli(&args, None);
        assert_ne!(o.status.code(), Some(0), "{args:?}");
        // (Progress lines may come first: the error is the one `paddock:` line, last.)
        let err = crate::support::stderr(&o);
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("paddock:")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: {err}");
        assert!(
            errors[0].contains(code) && err.trim_end().ends_with(errors[0]),
            "{args:?}: {err}"
        );
    }
    let o = cli(&["template", "rm", "app", "app-recipe"], None);
    crate::support::assert_code(&o, 0);
    let o = cli(&["template", "ls", "--json"], None);
    let list: Value = serde_json::from_str(&crate::support::stdout(&o)).expect("json");
    assert_eq!(list["templates"].as_array().map(Vec::len), Some(1), "{list}");
}

/// The `paddock_warm_pool_size` gauge of `template`.
fn warm_gauge(metrics: &str, template: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.starts_with("paddock_warm_pool_size{") && l.contains(&format!("template=\"{template}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

#[test]
fn a_configured_image_template_is_built_at_start_for_every_tenant_with_its_warm_pool() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    let recipe = format!("FROM {from}\nUSER root\nRUN echo from-the-recipe > /srv/recipe\nUSER app\n");
    let mut opts = options(&registry, good_credentials());
    opts.templates = vec![
        (
            "app-pool".to_owned(),
            paddock_control::TemplateConfig {
                rootfs: paddock_types::RootfsSpec::Host,
                warm_pool_size: 2,
                image: Some(from.clone()),
                recipe: None,
            },
        ),
        (
            "app-recipe".to_owned(),
            paddock_control::TemplateConfig {
                rootfs: paddock_types::RootfsSpec::Host,
                warm_pool_size: 0,
                image: None,
                recipe: Some(recipe),
            },
        ),
    ];
    let h = Harness::with(opts);
    h.block_on(async {
        // Built in the background; its pool fills once it is.
        crate::support::harness::poll(SOON * 6, "the configured template's warm pool", || async {
            let metrics = h.admin.get("/metrics").await.text();
            (warm_gauge(&metrics, "app-pool") == Some(2)).then_some(())
        })
        .await;
        let a = h.admin.new_tenant("tpl-config-a").await;
        let b = h.admin.new_tenant("tpl-config-b").await;
        for (client, tenant) in [(&a, "a"), (&b, "b")] {
            let list = client.get("/v1/templates").await.ok(200);
            let names: Vec<&str> = list["templates"]
                .as_array()
                .expect("templates")
                .iter()
                .filter_map(|t| t["name"].as_str())
                .collect();
            assert!(
                names.contains(&"app-pool") && names.contains(&"app-recipe"),
                "{tenant}: {list}"
            );
            // Claimed from the pool, as the image's user with its env and workdir.
            let sb = client.create_sandbox(json!({"template": "app-pool"})).await;
            let (code, out, err) = run_in(
                client,
                &sb,
                json!({"shell": "cat /etc/greeting; echo $GREETING; pwd; id -un"}),
            )
            .await;
            assert_eq!(
                (code, out.as_str()),
                (0, "hello from the image\nhi\n/srv\napp\n"),
                "{tenant}: {err}"
            );
            client.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
            // A tenant cannot delete the server's template.
            client
                .delete("/v1/templates/app-pool")
                .await
                .err(403, "forbidden");
        }
        let claims = a
            .audit_rows(&[("action", "sandbox.create")])
            .await
            .into_iter()
            .filter(|r| r["detail"]["source"] == "pool")
            .count();
        assert_eq!(claims, 1, "the create was not a claim from the warm pool");
        // The recipe template (cold) once built.
        let sb = crate::support::harness::poll(SOON * 6, "the configured recipe template", || async {
            let r = a.post("/v1/sandboxes", json!({"template": "app-recipe"})).await;
            (r.status == 201).then(|| r.json()["id"].as_str().expect("id").to_owned())
        })
        .await;
        let (_, out, _) = run_in(&a, &sb, json!({"shell": "cat /srv/recipe; id -un"})).await;
        assert_eq!(out, "from-the-recipe\napp\n");
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
    });
}

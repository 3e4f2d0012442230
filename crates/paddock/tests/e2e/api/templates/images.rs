//! Templates from registry images: what their sandboxes run and keep, what a hostile image gets,
//! bad input, and the CLI.

use reqwest::Method;
use serde_json::{json, Value};

use super::*;

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
        // Cached layers are not even fetched: only the config is.
        let layer_bytes: u64 = events[2..4].iter().filter_map(|e| e["size"].as_u64()).sum();
        let fetched = events[1]["bytes"].as_u64().expect("bytes");
        assert!(fetched < 64 << 10 && fetched < layer_bytes, "{events:#?}");
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

        // A snapshot of it keeps the template: a sandbox made from the snapshot starts on it
        // (the image's programs, the snapshot's changes), whatever the request names.
        let snap = a
            .post(&format!("/v1/sandboxes/{sb}/snapshots"), json!({}))
            .await
            .ok(201);
        let sid = snap["id"].as_str().expect("snapshot id").to_owned();
        let from_snap = a.create_sandbox(json!({"snapshot": sid})).await;
        let (code, out, err) = run_in(&a, &from_snap, json!({"shell": "cat /etc/greeting; id -un; pwd"})).await;
        assert_eq!((code, out.as_str()), (0, "changed\napp\n/srv\n"), "{err}");
        let body = a
            .post("/v1/sandboxes", json!({"snapshot": sid, "template": "default"}))
            .await
            .err(400, "invalid_request");
        assert_eq!(body["field"], "template", "{body}");
        a.delete(&format!("/v1/sandboxes/{from_snap}")).await.ok(204);

        // In use: not deletable; once its sandboxes and snapshots are gone, deleted with its
        // storage.
        let refused = a.delete("/v1/templates/app").await.err(409, "template_in_use");
        assert!(refused["message"].as_str().is_some_and(|m| m.contains(&sb)), "{refused}");
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
        a.delete(&format!("/v1/sandboxes/{sb2}")).await.ok(204);
        let refused = a.delete("/v1/templates/app").await.err(409, "template_in_use");
        assert!(refused["message"].as_str().is_some_and(|m| m.contains(&sid)), "{refused}");
        a.delete(&format!("/v1/snapshots/{sid}")).await.ok(204);
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
        assert_eq!(rows.len(), 5, "three deletes and two refusals: {rows:#?}");
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

//! A template build interrupted by `kill -9` (a crash point, `PADDOCK_FAULT`) at each of its steps:
//! after the pull, after a layer is unpacked, after it is cached, before and after the build's
//! files move into place. After a restart nothing of it is left (no record, no template, no staging
//! subvolume, no cached layer nobody uses, no pulled image), the audit chain verifies, and the same
//! name builds again.

use std::os::unix::process::ExitStatusExt as _;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::support::crash::assert_consistent;
use crate::support::registry::{TestRegistry, PASSWORD, USER};
use crate::support::server::Server;
use crate::support::TestEnv;

/// The image pushed: busybox, then a second layer with one file (two layers, so a crash can
/// come between them).
fn push_image(registry: &TestRegistry) -> String {
    use crate::support::registry::run;
    use std::process::Command;
    let dir = tempfile::tempdir().expect("tempdir");
    let layout = dir.path().join("img");
    let image = |tag: &str| format!("{}:{tag}", layout.display());
    run(Command::new("umoci").arg("init").arg("--layout").arg(&layout));
    run(Command::new("umoci").args(["new", "--image"]).arg(image("base")));
    let bundle = dir.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(image("base"))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).expect("bin");
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("busybox");
    for applet in ["cat", "sh"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).expect("applet");
    }
    for pass in ["one", "two"] {
        std::fs::write(rootfs.join(format!("{pass}.txt")), pass).expect("file");
        run(Command::new("umoci")
            .args(["repack", "--refresh-bundle", "--image"])
            .arg(image("v1"))
            .arg(&bundle));
    }
    run(Command::new("umoci")
        .args(["config", "--image"])
        .arg(image("v1"))
        .args(["--os=linux", "--architecture=amd64", "--config.env=PATH=/bin"]));
    registry.push(&layout, "v1", "paddock/crash", "v1");
    format!("{}/paddock/crash:v1", registry.host())
}

/// The server's configuration: the registry's CA and credentials (a docker config), in a directory
/// of the test's own.
fn write_config(dir: &std::path::Path, registry: &TestRegistry) -> std::path::PathBuf {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let docker = dir.join("docker.json");
    std::fs::write(
        &docker,
        json!({"auths": {registry.host(): {"auth": auth}}}).to_string(),
    )
    .expect("docker config");
    let config = dir.join("paddock.toml");
    std::fs::write(
        &config,
        format!(
            "[registry]\nca_file = {:?}\ndocker_config = {:?}\n",
            registry.ca_file.display().to_string(),
            docker.display().to_string()
        ),
    )
    .expect("config");
    config
}

fn names_in(dir: &std::path::Path) -> Vec<String> {
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

/// What a crashed build built: the image itself, or a recipe with one `RUN` step on it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Build {
    Image,
    Recipe,
}

async fn crash_build(point: &str, build: Build) {
    let registry = TestRegistry::start();
    let from = push_image(&registry);
    let dir = tempfile::tempdir().expect("config dir");
    let config = write_config(dir.path(), &registry);
    let args = ["--config", config.to_str().expect("utf-8")];
    let env = TestEnv::new();
    let server = Server::start_with_env(&env, &args, "info", &[("PADDOCK_FAULT", point)]);
    let (api, admin) = (server.api(), server.admin_key.clone());
    let key = api.create_key(&admin, "crash").await;
    let body = match build {
        Build::Image => json!({"name": "app", "from": from}),
        Build::Recipe => {
            json!({"name": "app", "recipe": format!("FROM {from}\nRUN echo step > /tmp/three.txt\n")})
        }
    };
    let answer = api
        .try_request(
            &key,
            Method::POST,
            "/v1/templates",
            Some(&body),
            Some("application/json"),
        )
        .await;
    assert!(
        answer.is_err(),
        "the build was answered although the server should have died: {answer:?}"
    );
    let (status, lines) = server.wait_exit(Duration::from_secs(60));
    let name = point.split('@').next().expect("name");
    assert_eq!(status.signal(), Some(9), "{point}: not killed: {status:?}");
    assert!(
        lines
            .iter()
            .any(|l| l == &format!("paddock: fault point {name} reached")),
        "{point}: died elsewhere: {lines:#?}"
    );

    // Returns once recovery (and its garbage collection) is done.
    let server = Server::restart(&env, &args, "info");
    let api = server.api();
    let list = api.get(&key, "/v1/templates").await;
    assert_eq!(
        list["templates"].as_array().map(Vec::len),
        Some(1),
        "{point}: {list}"
    );
    let pool = env.state().join("pool");
    assert_eq!(names_in(&pool.join("images")), Vec::<String>::new(), "{point}");
    assert!(
        names_in(&pool.join("builds")).is_empty(),
        "{point}: {:?}",
        names_in(&pool.join("builds"))
    );
    assert!(
        names_in(&pool.join("layers")).is_empty(),
        "{point}: {:?}",
        names_in(&pool.join("layers"))
    );
    assert!(names_in(&env.state().join("pulls")).is_empty(), "{point}");
    // A recipe step's sandbox is not adopted: its build died with the server.
    let live = api.get(&key, "/v1/sandboxes").await;
    assert_eq!(
        live["sandboxes"].as_array().map(Vec::len),
        Some(0),
        "{point}: {live}"
    );
    assert_consistent(&env, &api, &admin).await;
    // The name is free and the image builds.
    let built = api
        .request(
            &key,
            Method::POST,
            "/v1/templates",
            Some(&body),
            Some("application/json"),
        )
        .await;
    assert_eq!(built.status.as_u16(), 201, "{point}: {}", built.text());
    let sb = api.create_sandbox(&key, &json!({"template": "app"})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let (script, expected) = match build {
        Build::Image => ("cat /one.txt /two.txt", "onetwo"),
        Build::Recipe => ("cat /one.txt /two.txt /tmp/three.txt", "onetwostep\n"),
    };
    assert_eq!(api.sh(&key, &sb, script).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_killed_at_any_step_leaves_nothing_after_a_restart() {
    for point in [
        "template.pulled",
        "template.layer_applied@1",
        "template.layer_cached@1",
        "template.layer_applied@2",
        "template.finishing",
        "template.built",
    ] {
        crash_build(point, Build::Image).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipe_build_killed_in_a_step_leaves_no_sandbox_after_a_restart() {
    crash_build("template.step_done", Build::Recipe).await;
}

/// A template recorded before templates were charged (its charge 0, as migration 0012 leaves
/// one) is measured at the next start and charged what it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_recorded_without_its_charge_is_measured_at_start() {
    let registry = TestRegistry::start();
    let from = push_image(&registry);
    let dir = tempfile::tempdir().expect("config dir");
    let config = write_config(dir.path(), &registry);
    let args = ["--config", config.to_str().expect("utf-8")];
    let env = TestEnv::new();
    let server = Server::start_with_env(&env, &args, "info", &[]);
    let (api, admin) = (server.api(), server.admin_key.clone());
    let key = api.create_key(&admin, "charge").await;
    let body = json!({"name": "app", "from": from});
    let built = api
        .request(
            &key,
            Method::POST,
            "/v1/templates",
            Some(&body),
            Some("application/json"),
        )
        .await;
    assert_eq!(built.status.as_u16(), 201, "{}", built.text());
    let info: serde_json::Value = serde_json::from_str(&built.text()).expect("json");
    let charged = info["storage_bytes"].as_u64().expect("storage_bytes");
    let id = info["id"].as_str().expect("id").to_owned();
    assert!(charged > 1 << 20, "{info}");
    server.stop();

    // As a database migrated from before the charge was kept.
    {
        let store = paddock_store::Store::open(&env.state().join("paddock.db")).expect("open the store");
        store.set_template_storage(&id, 0).expect("uncharge");
    }
    let server = Server::restart(&env, &args, "info");
    let api = server.api();
    let info = api.get(&key, "/v1/templates/app").await;
    let measured = info["storage_bytes"].as_u64().expect("storage_bytes");
    // Measured from its files (busybox and two small ones), as the build counted them.
    let busybox = std::fs::metadata("/bin/busybox").expect("busybox").len();
    assert!(
        measured >= busybox && measured <= charged.max(busybox) * 2,
        "{measured} vs {charged}: {info}"
    );
    let tenant = api.get(&key, "/v1/tenants/charge").await;
    assert_eq!(
        tenant["usage"]["storage_bytes"].as_u64(),
        Some(measured),
        "{tenant}"
    );
    assert_consistent(&env, &api, &admin).await;
}

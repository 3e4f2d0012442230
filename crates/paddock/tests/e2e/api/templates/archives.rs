//! Templates from uploaded archives (`POST /v1/templates/import`) and the CLI's local sources: a
//! `docker save` archive and an OCI archive written by `skopeo` from the umoci-made test image, an
//! OCI layout directory and a root file system directory packed by the CLI. Sandboxes from each run
//! the image's programs; a hostile or malformed archive is refused and leaves nothing.

use std::process::Command;

use reqwest::Method;
use serde_json::{json, Value};

use super::*;

/// Uploads `archive` as a template named `name` (with more query pairs), answered as JSON.
async fn import(
    client: &Client,
    name: &str,
    query: &[(&str, &str)],
    archive: Vec<u8>,
) -> crate::support::harness::Reply {
    let mut pairs = vec![("name", name)];
    pairs.extend_from_slice(query);
    Client::send(
        client
            .request(Method::POST, "/v1/templates/import")
            .query(&pairs)
            .header("accept", JSON)
            .header("content-type", "application/x-tar")
            .body(archive),
    )
    .await
}

/// `skopeo copy oci:LAYOUT:v1 <to>`.
fn skopeo_copy(layout: &Layout, to: &str) {
    run(Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!("oci:{}", layout.image("v1")))
        .arg(to));
}

/// What `/etc/greeting` of a new sandbox of `template` says, and who runs there.
async fn greeting(client: &Client, template: &str) -> String {
    let sb = client.create_sandbox(json!({"template": template})).await;
    let (code, out, err) = run_in(client, &sb, json!({"shell": "cat /etc/greeting; id -un"})).await;
    assert_eq!(code, 0, "{err}");
    client.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
    out
}

#[test]
fn templates_build_from_docker_and_oci_archives_layout_directories_and_root_file_systems() {
    let image = app_image();
    let work = tempfile::tempdir().expect("tempdir");
    let docker = work.path().join("app-docker.tar");
    let oci = work.path().join("app-oci.tar");
    skopeo_copy(
        &image,
        &format!("docker-archive:{}:paddock/app:v1", docker.display()),
    );
    skopeo_copy(&image, &format!("oci-archive:{}:v1", oci.display()));
    let rootfs = image.unpack("v1", "bundle-v1");
    let h = Harness::with(Options::default());
    let pool = h.env().state().join("pool");
    let a = h.block_on(h.admin.new_tenant("tpl-archive"));
    h.block_on(async {
        // A docker archive: the image's tree, config and layers (both cached from now on).
        let body = std::fs::read(&docker).expect("read the docker archive");
        let info = import(&a, "from-docker", &[], body).await.ok(201);
        assert_eq!(info["source"], "upload: image archive", "{info}");
        assert_eq!(info["config"]["user"], "app", "{info}");
        assert_eq!(info["layers"].as_array().map(Vec::len), Some(2), "{info}");
        assert_eq!(greeting(&a, "from-docker").await, "hello from the image\napp\n");

        // An OCI archive of the same image, streamed: a `received` event, then its layers (the
        // docker archive held them uncompressed: other blobs, so nothing is cached yet).
        let body = std::fs::read(&oci).expect("read the OCI archive");
        let response = a
            .request(Method::POST, "/v1/templates/import")
            .query(&[("name", "from-oci"), ("image", "v1")])
            .header("accept", NDJSON)
            .body(body)
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status(), 200);
        let events = Lines::new(response).rest(SOON * 6).await;
        assert_eq!(
            kinds(&events),
            ["received", "layer", "layer", "done"],
            "{events:#?}"
        );
        assert_eq!(events[0]["format"], "oci", "{events:#?}");
        assert_eq!(greeting(&a, "from-oci").await, "hello from the image\napp\n");

        // Bad input: each refused with its code, before or while reading, leaving nothing.
        let before = names_in(&pool.join("images"));
        import(&a, "junk", &[], b"not a tar at all".repeat(100))
            .await
            .err(400, "invalid_image");
        import(
            &a,
            "no-such-tag",
            &[("image", "other:v9")],
            std::fs::read(&docker).expect("read"),
        )
        .await
        .err(404, "image_not_found");
        let body = import(&a, "bad-format", &[("format", "zip")], Vec::new())
            .await
            .err(400, "invalid_request");
        assert_eq!(body["field"], "format", "{body}");
        let body = import(
            &a,
            "rootfs-tag",
            &[("format", "rootfs"), ("image", "x")],
            Vec::new(),
        )
        .await
        .err(400, "invalid_request");
        assert_eq!(body["field"], "image", "{body}");
        // A truncated archive.
        let mut cut = std::fs::read(&docker).expect("read");
        cut.truncate(cut.len() / 2);
        import(&a, "cut", &[], cut).await.err(400, "invalid_image");
        assert_eq!(
            names_in(&pool.join("images")),
            before,
            "a refused archive left a template"
        );
        assert!(
            names_in(&h.env().state().join("pulls")).is_empty(),
            "an upload stayed behind"
        );
        let names: Vec<String> = a.get("/v1/templates").await.ok(200)["templates"]
            .as_array()
            .expect("templates")
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(names, ["default", "from-docker", "from-oci"]);
    });

    // The CLI packs local sources: an OCI layout directory and a root file system directory.
    let cli = |args: &[&str]| {
        Command::new(crate::support::paddock_bin())
            .args(args)
            .env("PADDOCK_URL", &a.base)
            .env("PADDOCK_API_KEY", a.key.as_deref().expect("key"))
            .output()
            .expect("run the CLI")
    };
    let o = cli(&[
        "template",
        "build",
        "from-dir",
        "--from",
        &format!("oci:{}", image.image("v1")),
    ]);
    crate::support::assert_code(&o, 0);
    assert_eq!(crate::support::stdout(&o), "from-dir\n");
    // The layout holds the OCI archive's blobs: both layers come from the cache.
    let progress = crate::support::stderr(&o);
    assert_eq!(progress.matches(") cached").count(), 2, "{progress}");
    let o = cli(&[
        "template",
        "build",
        "from-docker-cli",
        "--from",
        &format!("docker-archive:{}:paddock/app:v1", docker.display()),
    ]);
    crate::support::assert_code(&o, 0);
    let o = cli(&[
        "template",
        "build",
        "from-rootfs",
        "--from",
        &format!("rootfs:{}", rootfs.display()),
    ]);
    crate::support::assert_code(&o, 0);
    assert!(
        crate::support::stderr(&o).contains("rootfs archive"),
        "{}",
        crate::support::stderr(&o)
    );
    let o = cli(&[
        "template",
        "build",
        "missing",
        "--from",
        "oci-archive:/nonexistent/app.tar",
    ]);
    crate::support::assert_code(&o, 1);
    let err = crate::support::stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("no such file"), "{err}");
    h.block_on(async {
        assert_eq!(greeting(&a, "from-dir").await, "hello from the image\napp\n");
        // A root file system has no process defaults: the default user runs there.
        assert_eq!(greeting(&a, "from-rootfs").await, "hello from the image\nuser\n");
        let info: Value = a.get("/v1/templates/from-rootfs").await.ok(200);
        assert_eq!(info["source"], "upload: root file system archive", "{info}");
        assert_eq!(info["layers"].as_array().map(Vec::len), Some(1), "{info}");
    });
}

#[test]
fn a_hostile_archive_is_refused_and_leaves_nothing_on_the_host() {
    let bad = hostile_image();
    let work = tempfile::tempdir().expect("tempdir");
    let docker = work.path().join("bad.tar");
    run(Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!("oci:{}", bad.image("bad")))
        .arg(format!("docker-archive:{}:bad:v1", docker.display())));
    let h = Harness::with(Options::default());
    let pool = h.env().state().join("pool");
    h.block_on(async {
        let a = h.admin.new_tenant("tpl-hostile-archive").await;
        let body = std::fs::read(&docker).expect("read");
        import(&a, "bad", &[], body).await.err(400, "invalid_image");
        assert!(names_in(&pool.join("images")).is_empty());
        assert!(names_in(&pool.join("builds"))
            .iter()
            .all(|n| !n.starts_with("tp-")));
        assert!(names_in(&h.env().state().join("pulls")).is_empty());
        assert!(
            !Path::new("/paddock-template-escape").exists(),
            "a layer wrote through a symlink onto the host"
        );
        // A tar whose members climb out and link out: nothing is created under their names.
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(5);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        let name = format!("../../../../tmp/paddock-archive-escape-{}", std::process::id());
        // (Written raw: the tar crate refuses `..` in `append_data`.)
        header.as_gnu_mut().expect("gnu").name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_cksum();
        builder.append(&header, &b"owned"[..]).expect("member");
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_size(0);
        builder
            .append_link(&mut link, "manifest.json", "/etc/passwd")
            .expect("link");
        let archive = builder.into_inner().expect("archive");
        import(&a, "climb", &[], archive).await.err(400, "invalid_image");
        assert!(!Path::new(&format!("/tmp/paddock-archive-escape-{}", std::process::id())).exists());
        assert!(names_in(&h.env().state().join("pulls")).is_empty());
    });
}

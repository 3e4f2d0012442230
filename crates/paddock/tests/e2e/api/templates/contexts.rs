//! Recipes with a build context: `COPY` and `ADD` take files from a directory the CLI packs and
//! uploads (`POST /v1/templates/import?format=context`); the files are made in the step's sandbox
//! by its agent, with their modes and the `--chown` owner; a step's cache key covers the files'
//! contents; hostile and unsupported input is refused with its code.

use std::process::Command;

use reqwest::Method;
use serde_json::json;

use super::*;

#[test]
fn copy_and_add_take_files_from_the_build_context_and_rebuild_only_when_they_change() {
    let registry = TestRegistry::start();
    let image = app_image();
    registry.push(&image.path(), "v1", "paddock/app", "v1");
    let from = format!("{}/paddock/app:v1", registry.host());
    let h = Harness::with(options(&registry, good_credentials()));
    let a = h.block_on(h.admin.new_tenant("tpl-context"));
    let work = tempfile::tempdir().expect("tempdir");
    let ctx = work.path().join("ctx");
    std::fs::create_dir_all(ctx.join("app/data")).expect("mkdir");
    std::fs::write(ctx.join("app/run.sh"), "#!/bin/sh\necho run from the context\n").expect("write");
    rustix::fs::chmod(
        ctx.join("app/run.sh").as_path(),
        rustix::fs::Mode::from_raw_mode(0o755),
    )
    .expect("chmod");
    std::fs::write(ctx.join("app/data/x.txt"), "one\n").expect("write");
    std::fs::write(ctx.join("README.md"), "read me\n").expect("write");
    let recipe = work.path().join("Recipe");
    std::fs::write(
        &recipe,
        format!(
            "FROM {from}\n\
             USER root\n\
             COPY app /opt/app\n\
             COPY --chown=app README.md /srv/\n\
             RUN cat /opt/app/data/x.txt > /srv/copied\n\
             WORKDIR /work\n\
             ADD README.md notes.md\n"
        ),
    )
    .expect("recipe");
    let cli = |name: &str| {
        Command::new(crate::support::paddock_bin())
            .args(["template", "build", name, "-f"])
            .arg(&recipe)
            .arg("--context")
            .arg(&ctx)
            .env("PADDOCK_URL", &a.base)
            .env("PADDOCK_API_KEY", a.key.as_deref().expect("key"))
            .output()
            .expect("run the CLI")
    };
    let steps_of = |o: &std::process::Output| -> Vec<String> {
        crate::support::stderr(o)
            .lines()
            .filter(|l| l.starts_with("step "))
            .map(str::to_owned)
            .collect()
    };

    // Built: every file where the recipe puts it, with its mode and owner (`/opt` and `/work`,
    // which the image lacks, are added to its top level).
    let o = cli("c1");
    crate::support::assert_code(&o, 0);
    assert!(
        steps_of(&o).iter().all(|l| !l.ends_with("(cached)")),
        "{:?}",
        steps_of(&o)
    );
    h.block_on(async {
        let sb = a.create_sandbox(json!({"template": "c1", "user": "root"})).await;
        let (code, out, err) = run_in(
            &a,
            &sb,
            json!({"shell": "/opt/app/run.sh; cat /srv/copied /work/notes.md; \
                             stat -c '%U %a' /srv/README.md /opt/app/run.sh /opt/app/data/x.txt; pwd"}),
        )
        .await;
        assert_eq!(
            (code, out.as_str()),
            (
                0,
                "run from the context\none\nread me\napp 644\nroot 755\nroot 644\n/work\n"
            ),
            "{err}"
        );
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
    });

    // Unchanged: every step is cached. A copied file changes: that step and those after it run.
    let o = cli("c2");
    crate::support::assert_code(&o, 0);
    assert!(
        steps_of(&o).iter().skip(1).all(|l| l.ends_with("(cached)")),
        "{:?}",
        steps_of(&o)
    );
    std::fs::write(ctx.join("app/data/x.txt"), "two\n").expect("write");
    let o = cli("c3");
    crate::support::assert_code(&o, 0);
    let steps = steps_of(&o);
    let cached: Vec<bool> = steps.iter().map(|l| l.ends_with("(cached)")).collect();
    assert_eq!(
        cached,
        [true, true, false, false, false, false, false],
        "{steps:?}"
    );
    h.block_on(async {
        let sb = a.create_sandbox(json!({"template": "c3"})).await;
        let (_, out, _) = run_in(&a, &sb, json!({"argv": ["cat", "/srv/copied"]})).await;
        assert_eq!(out, "two\n");
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
    });

    // A symlink is copied as a link: its target resolves inside the sandbox, never on the host.
    std::os::unix::fs::symlink("/etc/hostname", ctx.join("app/link")).expect("symlink");
    let o = cli("c4");
    crate::support::assert_code(&o, 0);
    h.block_on(async {
        let sb = a.create_sandbox(json!({"template": "c4"})).await;
        let (code, out, err) = run_in(
            &a,
            &sb,
            json!({"shell": "readlink /opt/app/link; cat /opt/app/link"}),
        )
        .await;
        assert_eq!((code, out), (0, format!("/etc/hostname\n{sb}\n")), "{err}");
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
    });
    std::fs::remove_file(ctx.join("app/link")).expect("rm");
    // Refused, with the recipe's line: an archive ADD would unpack, a source the context lacks, a
    // new top-level file; and a context that climbs out.
    for (line, wanted) in [
        ("ADD data.tar.bz2 /srv/\n", "bzip2-compressed archive"),
        ("COPY README.md /README\n", "top level is fixed"),
        ("COPY missing.txt /srv/\n", "not found"),
    ] {
        if line.starts_with("ADD") {
            std::fs::write(ctx.join("data.tar.bz2"), b"BZh91AY&SY not really").expect("write");
        }
        std::fs::write(&recipe, format!("FROM {from}\n{line}")).expect("recipe");
        let o = cli("c5");
        crate::support::assert_code(&o, 1);
        let err = crate::support::stderr(&o);
        assert!(err.contains("line 2") && err.contains(wanted), "{err}");
    }
    // ADD unpacks a local tar archive (told by its bytes) into the destination.
    let mut inner = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(6);
    header.set_mode(0o644);
    inner
        .append_data(&mut header, "inner/hello.txt", &b"hello\n"[..])
        .expect("member");
    let gz = inner.into_inner().expect("tar").finish().expect("gzip");
    std::fs::write(ctx.join("bundle.tgz"), gz).expect("write");
    std::fs::write(&recipe, format!("FROM {from}\nADD bundle.tgz /opt/unpacked/\n")).expect("recipe");
    let o = cli("c7");
    crate::support::assert_code(&o, 0);
    h.block_on(async {
        let sb = a.create_sandbox(json!({"template": "c7"})).await;
        let (code, out, err) = run_in(&a, &sb, json!({"shell": "cat /opt/unpacked/inner/hello.txt; test -e /opt/unpacked/bundle.tgz || echo unpacked"})).await;
        assert_eq!((code, out.as_str()), (0, "hello\nunpacked\n"), "{err}");
        a.delete(&format!("/v1/sandboxes/{sb}")).await.ok(204);
    });
    h.block_on(async {
        let mut b = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(1);
        header.set_mode(0o644);
        let name = b"../../escape";
        header.as_gnu_mut().expect("gnu").name[..name.len()].copy_from_slice(name);
        header.set_cksum();
        b.append(&header, &b"x"[..]).expect("member");
        let reply = Client::send(
            a.request(Method::POST, "/v1/templates/import")
                .query(&[("name", "c6"), ("format", "context")])
                .header("accept", JSON)
                .body(b.into_inner().expect("tar")),
        )
        .await;
        let body = reply.err(400, "invalid_request");
        assert_eq!(body["field"], "context", "{body}");
        assert!(
            names_in(&h.env().state().join("pulls")).is_empty(),
            "a context stayed behind"
        );
        let list = a.get("/v1/sandboxes").await.ok(200);
        assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0), "{list:#}");
    });
}

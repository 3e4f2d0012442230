//! Spare volumes (`pool/spare.rs`): `paddock run` makes the next run's volume while it runs, and a
//! creation from the template renames a spare into place. A spare is only ever a fresh snapshot of
//! the current template: nothing of an earlier sandbox, never one of an older template, and gc
//! removes what a dead maker left.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;

use crate::support::{assert_code, stdout, TestEnv};

/// The ready spares (names) of `env`'s pool.
fn spares(env: &TestEnv) -> BTreeSet<String> {
    std::fs::read_dir(env.state().join("pool/spares"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != ".making")
        .collect()
}

/// A `btrfs subvolume show` field (`UUID`, `Parent UUID`) of the subvolume at `path`.
fn subvolume_field(path: &Path, field: &str) -> String {
    let o = std::process::Command::new("btrfs")
        .args(["subvolume", "show"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .expect("btrfs subvolume show");
    assert_code(&o, 0);
    stdout(&o)
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no {field} in {}", stdout(&o)))
}

/// Every ready spare is a snapshot of the pool's current template.
fn assert_made_from_the_template(env: &TestEnv) {
    let pool = env.state().join("pool");
    let template = subvolume_field(&pool.join("templates/host"), "UUID");
    for name in spares(env) {
        assert_eq!(
            subvolume_field(&pool.join("spares").join(&name), "Parent UUID"),
            template,
            "spare {name} is not a snapshot of the current template"
        );
    }
}

#[test]
fn a_run_takes_a_spare_and_a_spare_carries_nothing_of_an_earlier_sandbox() {
    let env = TestEnv::new();
    // The first run of a pool finds no spare, makes its own snapshot, and leaves one spare. The
    // default user writes its home and /tmp; root (next run, on that spare) /etc and /root.
    let o = env.sh(
        &[],
        "echo one > /home/user/mark && echo one > /tmp/mark && hostname",
    );
    assert_code(&o, 0);
    let first_host = stdout(&o);
    let after_first = spares(&env);
    assert_eq!(after_first.len(), 1, "{after_first:?}");
    assert_made_from_the_template(&env);
    let spares_dir = std::fs::symlink_metadata(env.state().join("pool/spares")).expect("spares/");
    {
        use std::os::unix::fs::MetadataExt;
        assert_eq!((spares_dir.uid(), spares_dir.mode() & 0o777), (0, 0o700));
    }
    let o = env.sh(
        &["--user", "root"],
        "ls -A /home/user /tmp; echo one > /etc/mark && echo one > /root/mark",
    );
    assert_code(&o, 0);
    assert!(!stdout(&o).contains("mark"), "{}", stdout(&o));
    let after_root = spares(&env);
    assert_eq!(after_root.len(), 1, "{after_root:?}");
    assert!(after_root.is_disjoint(&after_first), "the spare was not taken");

    // The third run takes the spare the second left (it is gone, another is made) and sees nothing
    // of the earlier ones.
    let o = env.sh(
        &["--user", "root"],
        "hostname; ls -A /home/user /tmp /root; test -e /etc/mark && echo found /etc/mark; true",
    );
    assert_code(&o, 0);
    let seen = stdout(&o);
    assert!(
        !seen.contains("mark"),
        "the second run saw the first's files: {seen}"
    );
    assert!(first_host.starts_with("sb-"), "{first_host}");
    assert!(!seen.contains(first_host.trim()), "the same hostname: {seen}");
    let after_second = spares(&env);
    assert_eq!(after_second.len(), 1, "{after_second:?}");
    assert!(
        after_second.is_disjoint(&after_root),
        "the third run did not take the spare: {after_root:?} then {after_second:?}"
    );
    assert_made_from_the_template(&env);
    env.assert_clean();
}

#[test]
fn a_spare_of_an_older_template_is_never_taken_and_gc_removes_it() {
    let env = TestEnv::new();
    assert_code(&env.run(&[], &["true"]), 0);
    let old = spares(&env);
    assert_eq!(old.len(), 1, "{old:?}");
    // The template is built again (its marker says an older layout) and gets a new key: the old
    // spare differs from the new template in this file.
    let template = env.state().join("pool/templates/host");
    std::fs::write(template.join(".paddock-template"), "2").expect("mark the template old");
    let spare = env
        .state()
        .join("pool/spares")
        .join(old.first().expect("a spare"));
    std::fs::write(spare.join("etc/stale-spare"), "from the old template").expect("mark the spare");
    let o = env.sh(&[], "test -e /etc/stale-spare && echo stale; true");
    assert_code(&o, 0);
    assert_eq!(stdout(&o).trim(), "", "a spare of the older template was taken");
    let now = spares(&env);
    assert_eq!(now.len(), 1, "{now:?}");
    assert!(now.is_disjoint(&old), "the old spare is left: {now:?}");
    assert_made_from_the_template(&env);
    env.assert_clean();
}

#[test]
fn gc_removes_what_a_dead_spare_maker_left_and_keeps_a_live_ones() {
    let env = TestEnv::new();
    assert_code(&env.run(&[], &["true"]), 0);
    let making = env.state().join("pool/spares/.making");
    let template = env.state().join("pool/templates/host");
    // What makers killed mid-snapshot leave: a directory with the snapshot, and its lock file. One
    // maker still lives (its lock is held): that one stays.
    for name in ["t1.00000000000000aa", "t1.00000000000000bb"] {
        let dir = making.join(name);
        std::fs::create_dir_all(&dir).expect("making dir");
        paddock_sys::btrfs::snapshot_subvolume(&template, &dir, "volume", false).expect("snapshot");
        std::fs::File::create(making.join(format!("{name}.lock"))).expect("lock file");
    }
    let held = std::fs::File::open(making.join("t1.00000000000000bb.lock")).expect("lock file");
    rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).expect("flock");
    let entries = || -> BTreeSet<String> {
        std::fs::read_dir(&making)
            .expect("read .making")
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect()
    };
    env.gc();
    assert_eq!(
        entries(),
        BTreeSet::from([
            "t1.00000000000000bb".to_owned(),
            "t1.00000000000000bb.lock".to_owned()
        ]),
        "the dead maker's leftovers are gone, the live one's kept"
    );
    drop(held);
    env.gc();
    assert_eq!(entries(), BTreeSet::new());
    // `pool destroy` removes the ready spare with the rest of the pool.
    assert_eq!(spares(&env).len(), 1);
    let o = env
        .cmd()
        .args(["pool", "destroy"])
        .stdin(Stdio::null())
        .output()
        .expect("runs pool destroy");
    assert_code(&o, 0);
    assert!(!env.state().join("pool/spares").exists());
    env.assert_clean();
}

#[test]
fn a_creation_takes_only_a_spare_of_the_current_template() {
    use serde_json::json;
    let h = crate::support::harness::Harness::start();
    let pool = h.env().state().join("pool");
    let template = pool.join("templates/host");
    let dir = pool.join("spares");
    std::fs::create_dir_all(&dir).expect("spares/");
    // Two spares with a file each telling them apart: one keyed to another template (its
    // subvolume id, 1, is never a template's), one to the current template.
    let current = paddock_sys::btrfs::subvolume_id(&template).expect("the template's id");
    for (name, mark) in [
        ("t1.00000000000000aa".to_owned(), "stale"),
        (format!("t{current}.00000000000000bb"), "fresh"),
    ] {
        paddock_sys::btrfs::snapshot_subvolume(&template, &dir, &name, false).expect("snapshot");
        std::fs::write(dir.join(&name).join("etc").join(mark), mark).expect("mark the spare");
    }
    h.block_on(async {
        let a = h.admin.new_tenant("spares").await;
        let look = "for f in stale fresh; do test -e /etc/$f && echo $f; done; true";
        let first = a.create_sandbox(json!({})).await;
        assert_eq!(
            a.sh(&first, look).await,
            "fresh\n",
            "the current template's spare"
        );
        let second = a.create_sandbox(json!({})).await;
        assert_eq!(
            a.sh(&second, look).await,
            "",
            "no spare left: a snapshot of the template"
        );
    });
    assert!(
        dir.join("t1.00000000000000aa").exists(),
        "the other template's spare was taken"
    );
}

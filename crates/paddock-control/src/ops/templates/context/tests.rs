use super::*;

/// A tar of `(name, kind)` members: `Some(data)` a file, `None` a directory.
fn tar_of(members: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        match data {
            Some(data) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(data.len() as u64);
                h.set_mode(0o4755);
                b.append_data(&mut h, name, *data).expect("file");
            }
            None => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                h.set_mode(0o750);
                b.append_data(&mut h, name, &[][..]).expect("dir");
            }
        }
    }
    b.into_inner().expect("tar")
}

fn received(bytes: &[u8]) -> (tempfile::TempDir, Result<Context, ContextError>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = Context::receive(&mut &bytes[..], &dir.path().join("context.tar"), 1 << 20);
    (dir, ctx)
}

fn context() -> (tempfile::TempDir, Context) {
    let bytes = tar_of(&[
        ("./app/", None),
        ("./app/main.py", Some(b"print(1)\n")),
        ("./app/lib/util.py", Some(b"x = 1\n")),
        ("./README.md", Some(b"readme\n")),
        ("./notes.txt", Some(b"notes\n")),
        ("./Recipe", Some(b"FROM x\n")),
    ]);
    let (dir, ctx) = received(&bytes);
    (dir, ctx.expect("a good context"))
}

fn dests(placed: &[Placed]) -> Vec<&str> {
    placed.iter().map(|p| p.dest.as_str()).collect()
}

#[test]
fn a_file_goes_to_the_destination_or_into_it() {
    let (_d, ctx) = context();
    let placed = ctx.select(&["README.md".into()], "/srv/README").expect("select");
    assert_eq!(dests(&placed), ["/srv/README"]);
    assert_eq!(placed[0].member.mode, 0o755, "set-id bits are dropped");
    let placed = ctx.select(&["README.md".into()], "/srv/").expect("select");
    assert_eq!(dests(&placed), ["/srv/README.md"]);
    let placed = ctx
        .select(&["README.md".into(), "notes.txt".into()], "/srv/")
        .expect("select");
    assert_eq!(dests(&placed), ["/srv/README.md", "/srv/notes.txt"]);
    assert_eq!(
        ctx.read_file("Recipe", 100).expect("read"),
        Some(b"FROM x\n".to_vec())
    );
    assert_eq!(ctx.read_file("absent", 100).expect("read"), None);
    assert!(ctx.read_file("Recipe", 3).is_err(), "bounded");
}

#[test]
fn a_directory_s_contents_go_into_the_destination() {
    let (_d, ctx) = context();
    let placed = ctx.select(&["app".into()], "/opt/app").expect("select");
    assert_eq!(
        dests(&placed),
        ["/opt/app/lib", "/opt/app/lib/util.py", "/opt/app/main.py"]
    );
    assert_eq!(placed[0].member.kind, Kind::Dir, "an implied directory");
    // The whole context.
    let placed = ctx.select(&[".".into()], "/ctx/").expect("select");
    assert_eq!(placed.len(), 7, "{placed:#?}");
    assert!(dests(&placed).contains(&"/ctx/app/lib/util.py"));
}

#[test]
fn wildcards_match_within_a_name_and_a_missing_source_is_an_error() {
    let (_d, ctx) = context();
    let placed = ctx.select(&["*.md".into()], "/x/").expect("select");
    assert_eq!(dests(&placed), ["/x/README.md"]);
    let placed = ctx.select(&["app/*.py".into()], "/x/").expect("select");
    assert_eq!(dests(&placed), ["/x/main.py"]);
    let placed = ctx.select(&["[nR]*".into()], "/x/").expect("select");
    assert_eq!(dests(&placed), ["/x/README.md", "/x/Recipe", "/x/notes.txt"]);
    let e = ctx.select(&["nothing*".into()], "/x/").expect_err("no match");
    assert!(e.contains("not found"), "{e}");
    assert!(glob("a*b*c", "aXXbYYc"));
    assert!(!glob("a*b*c", "aXXbYY"));
    assert!(glob("?.t[a-z]t", "x.txt"));
    assert!(!glob("[!x].txt", "x.txt"));
    assert!(glob("\\*", "*"));
    // A hostile pattern costs the product of the lengths, not an exponential.
    let name = "a".repeat(4000);
    assert!(!glob(
        &"*a".repeat(60).chars().chain(['b']).collect::<String>(),
        &name
    ));
}

#[test]
fn the_digest_changes_with_content_mode_and_destination() {
    let (_d, a) = context();
    let (_e, b) = {
        let bytes = tar_of(&[("app/main.py", Some(b"print(2)\n"))]);
        let (dir, ctx) = received(&bytes);
        (dir, ctx.expect("context"))
    };
    let one = Context::digest(&a.select(&["app/main.py".into()], "/m.py").expect("a"));
    let two = Context::digest(&b.select(&["app/main.py".into()], "/m.py").expect("b"));
    let three = Context::digest(&a.select(&["app/main.py".into()], "/n.py").expect("a"));
    assert_ne!(one, two);
    assert_ne!(one, three);
    assert_eq!(
        one,
        Context::digest(&a.select(&["app/main.py".into()], "/m.py").expect("again"))
    );
}

#[test]
fn hostile_contexts_are_refused() {
    // A name climbing out (written raw: the tar crate refuses `..`).
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(1);
    h.set_mode(0o644);
    let name = b"../../etc/evil";
    h.as_gnu_mut().expect("gnu").name[..name.len()].copy_from_slice(name);
    h.set_cksum();
    b.append(&h, &b"x"[..]).expect("member");
    let (_d, ctx) = received(&b.into_inner().expect("tar"));
    assert!(
        matches!(ctx, Err(ContextError::Invalid(ref m)) if m.contains("..")),
        "{ctx:?}"
    );

    // A hard link.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Link);
    h.set_size(0);
    b.append_link(&mut h, "link", "/etc/shadow").expect("link");
    let (_d, ctx) = received(&b.into_inner().expect("tar"));
    assert!(matches!(ctx, Err(ContextError::Invalid(_))), "{ctx:?}");

    // A symlink is copied as a link (its target as stored, never followed here).
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "dir/link", "/etc").expect("symlink");
    let (_d, ctx) = received(&b.into_inner().expect("tar"));
    let placed = ctx
        .expect("listed")
        .select(&["dir".into()], "/x")
        .expect("selected");
    assert_eq!(dests(&placed), ["/x/link"]);
    assert_eq!(
        placed[0].member.kind,
        Kind::Symlink {
            target: "/etc".into()
        }
    );

    // Too large (gzip of zeros: bounded while decompressing), truncated, not a tar.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&vec![0u8; 8 << 20]).expect("gzip");
    let (_d, ctx) = received(&gz.finish().expect("gzip"));
    assert!(matches!(ctx, Err(ContextError::TooLarge { .. })), "{ctx:?}");
    let mut cut = tar_of(&[("big", Some(&[7u8; 4096][..]))]);
    cut.truncate(1024);
    let (_d, ctx) = received(&cut);
    assert!(matches!(ctx, Err(ContextError::Invalid(_))), "{ctx:?}");
    let (_d, ctx) = received(&b"definitely not a tar archive, but long enough to be read".repeat(20));
    assert!(matches!(ctx, Err(ContextError::Invalid(_))), "{ctx:?}");
    // A gzip-compressed good one is read.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar_of(&[("f", Some(b"1"))])).expect("gzip");
    let (_d, ctx) = received(&gz.finish().expect("gzip"));
    assert_eq!(
        ctx.expect("gzip context").read_file("f", 10).expect("read"),
        Some(b"1".to_vec())
    );
}

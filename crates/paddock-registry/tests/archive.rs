//! Image archives read into OCI layouts: real ones written by `umoci` and `skopeo`, ones built
//! here with the tar crate (several images, links, Docker >= 25's shape), hostile ones that must
//! be refused with the right kind leaving nothing behind, and root file system tars.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use paddock_registry::{
    read_image_archive, read_rootfs_archive, ArchiveFormat, ArchiveImage, ArchiveLimits, ErrorKind, Platform,
    RegistryError, MAX_MANIFEST_BYTES, REF_NAME,
};
use proptest::prelude::*;
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};

const LIMITS: ArchiveLimits = ArchiveLimits {
    max_bytes: 256 << 20,
    max_members: 10_000,
};
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).expect("gzip");
    enc.finish().expect("gzip")
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(bytes), &mut out).expect("gunzip");
    out
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// The checker: walks a written layout as the runtime's reader does, re-hashing every blob.

/// What a layout's chosen image is made of.
struct Checked {
    manifest: Value,
    config: Value,
    /// Each layer's media type and bytes.
    layers: Vec<(String, Vec<u8>)>,
}

fn read_blob(dest: &Path, descriptor: &Value) -> Vec<u8> {
    let digest = descriptor["digest"].as_str().expect("digest");
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let bytes =
        std::fs::read(dest.join("blobs/sha256").join(hex)).unwrap_or_else(|e| panic!("blob {digest}: {e}"));
    assert_eq!(sha(&bytes), hex, "blob {digest} does not hash to its name");
    assert_eq!(
        Some(bytes.len() as u64),
        descriptor["size"].as_u64(),
        "blob {digest} size"
    );
    bytes
}

/// Checks `dest` as [`check_structure`] does, and that each layer, decompressed, hashes to its
/// config's `diff_id`.
fn check_layout(dest: &Path, reference: Option<&str>) -> Checked {
    let checked = check_structure(dest, reference);
    let diff_ids = checked.config["rootfs"]["diff_ids"].as_array().expect("diff_ids");
    assert_eq!(diff_ids.len(), checked.layers.len());
    for ((media_type, bytes), diff_id) in checked.layers.iter().zip(diff_ids) {
        let tar = match media_type.as_str() {
            "application/vnd.oci.image.layer.v1.tar" => bytes.clone(),
            "application/vnd.oci.image.layer.v1.tar+gzip" => gunzip(bytes),
            other => panic!("layer media type {other}"),
        };
        assert_eq!(diff_id.as_str(), Some(format!("sha256:{}", sha(&tar)).as_str()));
    }
    checked
}

/// Checks `dest`: mode 0700, `oci-layout` 1.0.0, `index.json` naming `reference` (or holding one
/// manifest), a manifest whose config and layers are there and hash right, no stray files, and
/// every blob hashing to its name.
fn check_structure(dest: &Path, reference: Option<&str>) -> Checked {
    let mode = std::fs::metadata(dest).expect("dest").permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "layout directory mode");
    let marker: Value = serde_json::from_slice(&std::fs::read(dest.join("oci-layout")).expect("oci-layout"))
        .expect("oci-layout json");
    assert_eq!(marker["imageLayoutVersion"], "1.0.0");
    let index: Value = serde_json::from_slice(&std::fs::read(dest.join("index.json")).expect("index.json"))
        .expect("index json");
    let manifests = index["manifests"].as_array().expect("manifests");
    let entry = match reference {
        None => {
            assert_eq!(manifests.len(), 1, "{index}");
            &manifests[0]
        }
        Some(r) => {
            let named: Vec<&Value> = manifests
                .iter()
                .filter(|m| m["annotations"][REF_NAME] == r)
                .collect();
            assert_eq!(named.len(), 1, "index.json names {r} once: {index}");
            named[0]
        }
    };
    assert_eq!(entry["mediaType"], OCI_MANIFEST);
    let manifest: Value = serde_json::from_slice(&read_blob(dest, entry)).expect("manifest json");
    assert_eq!(manifest["schemaVersion"], 2);
    let config: Value = serde_json::from_slice(&read_blob(dest, &manifest["config"])).expect("config json");
    let layers: Vec<(String, Vec<u8>)> = manifest["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| {
            (
                l["mediaType"].as_str().expect("media type").to_owned(),
                read_blob(dest, l),
            )
        })
        .collect();
    let mut top: Vec<String> = std::fs::read_dir(dest)
        .expect("dest")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, ["blobs", "index.json", "oci-layout"]);
    for e in std::fs::read_dir(dest.join("blobs/sha256")).expect("blobs") {
        let e = e.expect("entry");
        assert!(e.file_type().expect("type").is_file());
        let name = e.file_name().to_string_lossy().into_owned();
        assert_eq!(
            sha(&std::fs::read(e.path()).expect("blob")),
            name,
            "stray or bad blob {name}"
        );
    }
    Checked {
        manifest,
        config,
        layers,
    }
}

// ---------------------------------------------------------------------------------------------
// Archives built here, names written raw so that hostile ones can be.

struct Archive {
    builder: tar::Builder<Vec<u8>>,
}

impl Archive {
    fn new() -> Self {
        Self {
            builder: tar::Builder::new(Vec::new()),
        }
    }

    fn header(name: &str, kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        let raw = name.as_bytes();
        assert!(raw.len() < 100, "raw names are short: {name}");
        h.as_gnu_mut().expect("gnu").name[..raw.len()].copy_from_slice(raw);
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_mtime(0);
        h
    }

    fn file(&mut self, name: &str, bytes: &[u8]) -> &mut Self {
        let mut h = Self::header(name, tar::EntryType::Regular, bytes.len() as u64);
        h.set_cksum();
        self.builder.append(&h, bytes).expect("append");
        self
    }

    /// A file whose name may be longer than a header holds (a GNU long-name header).
    fn long_file(&mut self, name: &str, bytes: &[u8]) -> &mut Self {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        self.builder.append_data(&mut h, name, bytes).expect("append");
        self
    }

    fn link(&mut self, name: &str, kind: tar::EntryType, target: &str) -> &mut Self {
        let mut h = Self::header(name, kind, 0);
        let raw = target.as_bytes();
        h.as_gnu_mut().expect("gnu").linkname[..raw.len()].copy_from_slice(raw);
        h.set_cksum();
        self.builder.append(&h, &[][..]).expect("append");
        self
    }

    fn dir(&mut self, name: &str) -> &mut Self {
        let mut h = Self::header(name, tar::EntryType::Directory, 0);
        h.set_cksum();
        self.builder.append(&h, &[][..]).expect("append");
        self
    }

    fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        self.builder
            .append_pax_extensions(records.iter().map(|(k, v)| (*k, *v)))
            .expect("pax");
        self
    }

    fn json(&mut self, name: &str, value: &Value) -> &mut Self {
        self.file(name, &serde_json::to_vec(value).expect("json"))
    }

    fn finish(self) -> Vec<u8> {
        self.builder.into_inner().expect("finish")
    }
}

/// A layer: a plain tar of one file.
fn layer_tar(greeting: &str) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(greeting.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, "etc/greeting", greeting.as_bytes())
        .expect("layer");
    b.into_inner().expect("layer")
}

fn config_for(layers: &[&[u8]]) -> Value {
    json!({
        "architecture": Platform::host().architecture,
        "os": "linux",
        "config": { "Cmd": ["/bin/sh"] },
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|l| format!("sha256:{}", sha(l))).collect::<Vec<_>>(),
        },
    })
}

/// Adds a legacy docker image (config `<hex>.json`, layer `<hex>.tar` with `<id>/layer.tar` a
/// link to it) and returns its manifest.json entry and config digest.
fn add_docker_image(a: &mut Archive, id: &str, tags: &[&str], layer: &[u8], hard: bool) -> (Value, String) {
    let config = serde_json::to_vec(&config_for(&[layer])).expect("json");
    let config_name = format!("{}.json", sha(&config));
    let layer_name = format!("{}.tar", sha(layer));
    a.file(&config_name, &config).file(&layer_name, layer).dir(id);
    if hard {
        a.link(
            &format!("{id}/layer.tar"),
            tar::EntryType::Link,
            &format!("./{layer_name}"),
        );
    } else {
        a.link(
            &format!("{id}/layer.tar"),
            tar::EntryType::Symlink,
            &format!("../{layer_name}"),
        );
    }
    (
        json!({ "Config": config_name, "RepoTags": tags, "Layers": [format!("{id}/layer.tar")] }),
        format!("sha256:{}", sha(&config)),
    )
}

/// A legacy docker archive of one image tagged `app:v1`.
fn one_image_archive() -> Vec<u8> {
    let mut a = Archive::new();
    let (entry, _) = add_docker_image(&mut a, "aaaa", &["app:v1"], &layer_tar("hello\n"), false);
    a.json("manifest.json", &json!([entry]));
    a.finish()
}

/// A minimal OCI layout archive: one image, one gzip layer; blobs as `(name, bytes)` added
/// before `oci-layout` and `index.json`.
fn oci_archive(extra: &[(&str, &[u8])], ref_name: Option<&str>) -> Vec<u8> {
    let layer = gzip(&layer_tar("oci\n"));
    let config = serde_json::to_vec(&config_for(&[&layer_tar("oci\n")])).expect("json");
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{}", sha(&config)), "size": config.len() },
        "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": format!("sha256:{}", sha(&layer)), "size": layer.len() }],
    }))
    .expect("json");
    let mut descriptor = json!({ "mediaType": OCI_MANIFEST, "digest": format!("sha256:{}", sha(&manifest)), "size": manifest.len() });
    if let Some(r) = ref_name {
        descriptor["annotations"] = json!({ REF_NAME: r });
    }
    let mut a = Archive::new();
    a.dir("blobs").dir("blobs/sha256");
    for blob in [&layer, &config, &manifest] {
        a.file(&format!("blobs/sha256/{}", sha(blob)), blob);
    }
    for (name, bytes) in extra {
        a.file(name, bytes);
    }
    a.json("oci-layout", &json!({ "imageLayoutVersion": "1.0.0" }));
    a.json(
        "index.json",
        &json!({ "schemaVersion": 2, "manifests": [descriptor] }),
    );
    a.finish()
}

/// Reads `archive` into a new directory of a fresh temporary one.
fn read(
    archive: &[u8],
    image: Option<&str>,
    limits: ArchiveLimits,
) -> (tempfile::TempDir, PathBuf, ArchiveImage) {
    let base = tempfile::tempdir().expect("tempdir");
    let dest = base.path().join("layout");
    let got = read_image_archive(&mut &archive[..], &dest, image, &limits)
        .unwrap_or_else(|e| panic!("read archive: {e} ({:?})", e.kind()));
    assert_eq!(got.bytes, archive_len_as_read(archive));
    (base, dest, got)
}

/// What a reader of the tar consumes of it: up to its end-of-archive block.
fn archive_len_as_read(archive: &[u8]) -> u64 {
    let tar = if archive.starts_with(&[0x1f, 0x8b]) {
        gunzip(archive)
    } else {
        archive.to_vec()
    };
    let mut at = 0usize;
    while tar[at..at + 512].iter().any(|b| *b != 0) {
        let header = tar::Header::from_byte_slice(&tar[at..at + 512]);
        let size = header.entry_size().expect("size") as usize;
        at += 512 + size.div_ceil(512) * 512;
    }
    (at + 512) as u64
}

/// Reads `archive`, which must be refused, and checks nothing is left: no `dest`, nothing beside
/// it, and a one-line message.
fn refused(archive: &[u8], image: Option<&str>, limits: ArchiveLimits) -> RegistryError {
    let base = tempfile::tempdir().expect("tempdir");
    let dest = base.path().join("layout");
    let err = read_image_archive(&mut &archive[..], &dest, image, &limits).expect_err("must be refused");
    assert_nothing_left(base.path(), &dest, &err);
    err
}

fn assert_nothing_left(base: &Path, dest: &Path, err: &RegistryError) {
    assert!(!dest.exists(), "{} left after: {err}", dest.display());
    let beside: Vec<_> = std::fs::read_dir(base).expect("base").collect();
    assert!(
        beside.is_empty(),
        "files beside the layout after {err}: {beside:?}"
    );
    assert!(!err.to_string().contains('\n'), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Real archives, from umoci and skopeo.

/// An OCI layout `DIR:v1` made by umoci, with a file added; returns its directory's parent.
fn umoci_image() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let layout = dir.path().join("img");
    run(Command::new("umoci").arg("init").arg("--layout").arg(&layout));
    run(Command::new("umoci")
        .args(["new", "--image"])
        .arg(format!("{}:v1", layout.display())));
    let bundle = dir.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:v1", layout.display()))
        .arg(&bundle));
    std::fs::create_dir_all(bundle.join("rootfs/etc")).expect("etc");
    std::fs::write(bundle.join("rootfs/etc/greeting"), "hello from umoci\n").expect("greeting");
    run(Command::new("umoci")
        .args(["repack", "--image"])
        .arg(format!("{}:v1", layout.display()))
        .arg(&bundle));
    (dir, layout)
}

fn skopeo_copy(from: &str, to: &str) {
    run(Command::new("skopeo").args(["copy", "--quiet", from, to]));
}

/// The config digest of image `v1` of a umoci layout.
fn layout_config_digest(layout: &Path) -> String {
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).expect("index")).expect("json");
    let m = &index["manifests"][0]["digest"];
    let hex = m.as_str().expect("digest").trim_start_matches("sha256:");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(hex)).expect("manifest"))
            .expect("json");
    manifest["config"]["digest"].as_str().expect("config").to_owned()
}

#[test]
fn skopeo_oci_archive_reads_into_a_layout() {
    let (dir, layout) = umoci_image();
    let archive = dir.path().join("x.tar");
    skopeo_copy(
        &format!("oci:{}:v1", layout.display()),
        &format!("oci-archive:{}", archive.display()),
    );
    let bytes = std::fs::read(&archive).expect("archive");
    let (_base, dest, got) = read(&bytes, None, LIMITS);
    assert_eq!(got.format, ArchiveFormat::Oci);
    // skopeo writes no ref.name for an archive without a reference.
    assert_eq!(got.reference, None);
    let checked = check_layout(&dest, None);
    assert_eq!(
        checked.manifest["config"]["digest"],
        layout_config_digest(&layout).as_str()
    );
    let files = gunzip(&checked.layers[0].1);
    assert!(
        String::from_utf8_lossy(&files).contains("hello from umoci"),
        "the added file is in the layer"
    );

    // Named in the archive: picked by its ref.name, other names not found.
    let named = dir.path().join("z.tar");
    skopeo_copy(
        &format!("oci:{}:v1", layout.display()),
        &format!("oci-archive:{}:v1", named.display()),
    );
    let bytes = std::fs::read(&named).expect("archive");
    let (_base, dest, got) = read(&bytes, Some("v1"), LIMITS);
    assert_eq!(got.reference.as_deref(), Some("v1"));
    check_layout(&dest, Some("v1"));
    let (_base, _, got) = read(&bytes, None, LIMITS);
    assert_eq!(got.reference.as_deref(), Some("v1"));
    assert_eq!(refused(&bytes, Some("v2"), LIMITS).kind(), ErrorKind::NotFound);
}

#[test]
fn skopeo_docker_archive_reads_into_a_layout_plain_and_gzipped() {
    let (dir, layout) = umoci_image();
    let archive = dir.path().join("y.tar");
    skopeo_copy(
        &format!("oci:{}:v1", layout.display()),
        &format!("docker-archive:{}:app:v1", archive.display()),
    );
    let bytes = std::fs::read(&archive).expect("archive");
    for image in [
        Some("app:v1"),
        Some("docker.io/library/app:v1"),
        Some("library/app:v1"),
        None,
    ] {
        let (_base, dest, got) = read(&bytes, image, LIMITS);
        assert_eq!(got.format, ArchiveFormat::Docker);
        assert_eq!(
            got.reference.as_deref(),
            Some("docker.io/library/app:v1"),
            "{image:?}"
        );
        let checked = check_layout(&dest, got.reference.as_deref());
        assert_eq!(
            checked.manifest["config"]["digest"],
            layout_config_digest(&layout).as_str()
        );
        assert_eq!(
            checked.manifest["config"]["mediaType"],
            "application/vnd.oci.image.config.v1+json"
        );
        assert_eq!(checked.layers.len(), 1);
        assert_eq!(checked.layers[0].0, "application/vnd.oci.image.layer.v1.tar");
        assert!(String::from_utf8_lossy(&checked.layers[0].1).contains("hello from umoci"));
    }
    assert_eq!(
        refused(&bytes, Some("app:v2"), LIMITS).kind(),
        ErrorKind::NotFound
    );

    let gz = gzip(&bytes);
    let (_base, dest, got) = read(&gz, None, LIMITS);
    assert_eq!(got.format, ArchiveFormat::Docker);
    check_layout(&dest, got.reference.as_deref());
}

#[test]
fn docker_25_archives_are_read_through_their_oci_layout() {
    let (_dir, layout) = umoci_image();
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).expect("index")).expect("json");
    let mut descriptor = index["manifests"][0].clone();
    descriptor["annotations"] =
        json!({ REF_NAME: "v1", "io.containerd.image.name": "docker.io/library/app:v1" });
    let manifest_hex = descriptor["digest"]
        .as_str()
        .expect("digest")
        .trim_start_matches("sha256:")
        .to_owned();
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(layout.join("blobs/sha256").join(&manifest_hex)).expect("manifest"),
    )
    .expect("json");

    let mut a = Archive::new();
    a.dir("blobs").dir("blobs/sha256");
    for e in std::fs::read_dir(layout.join("blobs/sha256")).expect("blobs") {
        let e = e.expect("entry");
        let name = format!("blobs/sha256/{}", e.file_name().to_string_lossy());
        a.file(&name, &std::fs::read(e.path()).expect("blob"));
    }
    let blob_path = |d: &Value| {
        format!(
            "blobs/sha256/{}",
            d["digest"]
                .as_str()
                .expect("digest")
                .trim_start_matches("sha256:")
        )
    };
    a.json(
        "index.json",
        &json!({ "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [descriptor] }),
    )
    .json(
        "manifest.json",
        &json!([{
            "Config": blob_path(&manifest["config"]),
            "RepoTags": ["app:v1"],
            "Layers": manifest["layers"].as_array().expect("layers").iter().map(blob_path).collect::<Vec<_>>(),
        }]),
    )
    .json("oci-layout", &json!({ "imageLayoutVersion": "1.0.0" }))
    .json("repositories", &json!({ "app": { "v1": manifest_hex } }));
    let bytes = a.finish();

    for image in [Some("app:v1"), Some("v1"), None] {
        let (_base, dest, got) = read(&bytes, image, LIMITS);
        assert_eq!(got.format, ArchiveFormat::Docker);
        assert_eq!(got.reference.as_deref(), Some("v1"), "{image:?}");
        let checked = check_layout(&dest, Some("v1"));
        assert_eq!(
            checked.manifest, manifest,
            "the archive's own manifest, not a converted one"
        );
    }
    assert_eq!(
        refused(&bytes, Some("app:v2"), LIMITS).kind(),
        ErrorKind::NotFound
    );
}

// ---------------------------------------------------------------------------------------------
// Picking one image of several.

fn two_image_archive() -> (Vec<u8>, String, String) {
    let mut a = Archive::new();
    let (one, config1) = add_docker_image(&mut a, "1111", &["app:v1"], &layer_tar("one\n"), false);
    let (two, config2) = add_docker_image(
        &mut a,
        "2222",
        &["app:v2", "other:latest"],
        &layer_tar("two\n"),
        true,
    );
    a.json("manifest.json", &json!([one, two]));
    (a.finish(), config1, config2)
}

#[test]
fn an_image_is_picked_by_tag() {
    let (bytes, config1, config2) = two_image_archive();
    let (_base, dest, got) = read(&bytes, Some("app:v2"), LIMITS);
    assert_eq!(got.reference.as_deref(), Some("app:v2"));
    let checked = check_layout(&dest, Some("app:v2"));
    assert_eq!(checked.manifest["config"]["digest"], config2.as_str());
    assert_eq!(checked.layers[0].1, layer_tar("two\n"), "through the hard link");

    let blobs = std::fs::read_dir(dest.join("blobs/sha256"))
        .expect("blobs")
        .count();
    assert_eq!(
        blobs, 3,
        "the config, the layer and the new manifest; other members dropped"
    );

    let (_base, dest, got) = read(&bytes, Some("docker.io/library/app:v1"), LIMITS);
    assert_eq!(
        got.reference.as_deref(),
        Some("app:v1"),
        "the tag as the archive writes it"
    );
    let checked = check_layout(&dest, Some("app:v1"));
    assert_eq!(checked.manifest["config"]["digest"], config1.as_str());
    assert_eq!(checked.layers[0].1, layer_tar("one\n"), "through the symlink");

    let (_base, _, got) = read(&bytes, Some("other"), LIMITS);
    assert_eq!(got.reference.as_deref(), Some("other:latest"));

    let err = refused(&bytes, None, LIMITS);
    assert_eq!(err.kind(), ErrorKind::InvalidArchive);
    assert!(err.to_string().contains("app:v2"), "{err}");
    let err = refused(&bytes, Some("app:v3"), LIMITS);
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert!(err.to_string().contains("app:v1"), "{err}");
}

#[test]
fn an_untagged_image_has_no_reference_and_long_names_work() {
    let layer = gzip(&layer_tar("long\n"));
    let config = serde_json::to_vec(&config_for(&[&layer_tar("long\n")])).expect("json");
    let long = format!("{}/layer.tar", "d".repeat(150));
    let mut a = Archive::new();
    a.file("cfg.json", &config).long_file(&long, &layer);
    a.json(
        "manifest.json",
        &json!([{ "Config": "cfg.json", "RepoTags": null, "Layers": [long] }]),
    );
    let (_base, dest, got) = read(&a.finish(), None, LIMITS);
    assert_eq!(got.reference, None);
    let checked = check_layout(&dest, None);
    assert_eq!(
        checked.layers[0].0, "application/vnd.oci.image.layer.v1.tar+gzip",
        "told by its magic"
    );
    let index: Value =
        serde_json::from_slice(&std::fs::read(dest.join("index.json")).expect("index")).expect("json");
    assert!(index["manifests"][0]["annotations"].is_null(), "{index}");
    assert_eq!(
        checked.config["architecture"],
        Platform::host().architecture.as_str()
    );
}

/// `archive` (an OCI one) with its index.json replaced by `index`.
fn with_index(archive: &[u8], index: &Value) -> Vec<u8> {
    let mut a = Archive::new();
    for_each_member(archive, |name, bytes| {
        if name != "index.json" {
            a.file(name, bytes);
        }
    });
    a.json("index.json", index);
    a.finish()
}

#[test]
fn oci_archives_with_several_images_need_a_name() {
    let single = oci_archive(&[], Some("v1"));
    let (_base, _, got) = read(&single, Some("v1"), LIMITS);
    assert_eq!(
        (got.format, got.reference.as_deref()),
        (ArchiveFormat::Oci, Some("v1"))
    );

    let mut d = None;
    for_each_member(&single, |name, bytes| {
        if name == "index.json" {
            let index: Value = serde_json::from_slice(bytes).expect("json");
            d = Some(index["manifests"][0].clone());
        }
    });
    let d = d.expect("index.json");
    let mut v2 = d.clone();
    v2["annotations"][REF_NAME] = json!("v2");
    let mut unnamed = d.clone();
    unnamed.as_object_mut().expect("object").remove("annotations");

    // The same manifest under two names, and once without a name: index.json kept as read.
    let index = json!({ "schemaVersion": 2, "manifests": [d, v2, unnamed] });
    let bytes = with_index(&single, &index);
    let (_base, dest, got) = read(&bytes, Some("v2"), LIMITS);
    assert_eq!(got.reference.as_deref(), Some("v2"));
    check_layout(&dest, Some("v2"));
    let written: Value =
        serde_json::from_slice(&std::fs::read(dest.join("index.json")).expect("index")).expect("json");
    assert_eq!(written, index, "index.json as read");
    assert_eq!(refused(&bytes, None, LIMITS).kind(), ErrorKind::InvalidArchive);
    assert_eq!(refused(&bytes, Some("v3"), LIMITS).kind(), ErrorKind::NotFound);

    // A name given twice: index.json narrowed to the image chosen, so that the name finds it.
    let index = json!({ "schemaVersion": 2, "manifests": [d.clone(), d.clone()] });
    let (_base, dest, got) = read(&with_index(&single, &index), Some("v1"), LIMITS);
    assert_eq!(got.reference.as_deref(), Some("v1"));
    check_layout(&dest, Some("v1"));
    let written: Value =
        serde_json::from_slice(&std::fs::read(dest.join("index.json")).expect("index")).expect("json");
    assert_eq!(written["manifests"], json!([d]));
}

fn for_each_member(archive: &[u8], mut f: impl FnMut(&str, &[u8])) {
    let mut ar = tar::Archive::new(archive);
    for e in ar.entries().expect("entries") {
        let mut e = e.expect("entry");
        if e.header().entry_type().is_file() {
            let name = e.path().expect("path").to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut bytes).expect("read");
            f(&name, &bytes);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile archives: each refused with its kind, nothing left behind.

#[test]
fn climbing_and_absolute_member_names_are_refused() {
    for name in ["../x", "a/../../x", "/etc/paddock-archive-hostile"] {
        let mut a = Archive::new();
        a.file(name, b"pwned");
        let bytes = a.finish();
        let err = refused(&bytes, None, LIMITS);
        assert_eq!(err.kind(), ErrorKind::InvalidArchive, "{name}: {err}");
    }
    assert!(!Path::new("/etc/paddock-archive-hostile").exists());
    // Through a pax header too.
    let mut a = Archive::new();
    a.pax(&[("path", &b"../pax-escape"[..])])
        .file("innocent", b"pwned");
    assert_eq!(
        refused(&a.finish(), None, LIMITS).kind(),
        ErrorKind::InvalidArchive
    );
}

#[test]
fn a_link_out_of_the_archive_is_refused_when_used() {
    let mut a = Archive::new();
    let config = serde_json::to_vec(&config_for(&[])).expect("json");
    a.file("cfg.json", &config)
        .dir("evil")
        .link("evil/layer.tar", tar::EntryType::Symlink, "../../etc/passwd")
        .json(
            "manifest.json",
            &json!([{ "Config": "cfg.json", "RepoTags": ["app:v1"], "Layers": ["evil/layer.tar"] }]),
        );
    let err = refused(&a.finish(), None, LIMITS);
    assert_eq!(err.kind(), ErrorKind::InvalidArchive);
    assert!(err.to_string().contains("outside"), "{err}");

    let mut a = Archive::new();
    a.file("cfg.json", &config)
        .link("hard.tar", tar::EntryType::Link, "../../etc/passwd")
        .json(
            "manifest.json",
            &json!([{ "Config": "cfg.json", "Layers": ["hard.tar"] }]),
        );
    assert_eq!(
        refused(&a.finish(), None, LIMITS).kind(),
        ErrorKind::InvalidArchive
    );

    // Unused, such a link is harmless: nothing is created for it.
    let mut a = Archive::new();
    let (entry, _) = add_docker_image(&mut a, "aaaa", &["app:v1"], &layer_tar("x\n"), false);
    a.link("stray", tar::EntryType::Symlink, "/etc/passwd")
        .json("manifest.json", &json!([entry]));
    let (_base, dest, _) = read(&a.finish(), None, LIMITS);
    check_layout(&dest, Some("app:v1"));
}

#[test]
fn a_blob_that_does_not_hash_to_its_name_is_refused() {
    let wrong = format!("blobs/sha256/{}", sha(b"something else"));
    let err = refused(&oci_archive(&[(&wrong, b"not that")], None), None, LIMITS);
    assert_eq!(err.kind(), ErrorKind::DigestMismatch, "{err}");
}

#[test]
fn a_missing_file_is_refused() {
    let mut a = Archive::new();
    let (mut entry, _) = add_docker_image(&mut a, "aaaa", &["app:v1"], &layer_tar("x\n"), false);
    entry["Layers"] = json!(["bbbb/layer.tar"]);
    a.json("manifest.json", &json!([entry]));
    assert_eq!(
        refused(&a.finish(), None, LIMITS).kind(),
        ErrorKind::InvalidArchive
    );

    // An OCI manifest naming a layer the archive lacks.
    let full = oci_archive(&[], None);
    let mut a = Archive::new();
    let layer_hex = sha(&gzip(&layer_tar("oci\n")));
    for_each_member(&full, |name, bytes| {
        if !name.ends_with(&layer_hex) {
            a.file(name, bytes);
        }
    });
    assert_eq!(
        refused(&a.finish(), None, LIMITS).kind(),
        ErrorKind::InvalidArchive
    );
}

#[test]
fn bad_json_is_refused() {
    let mut a = Archive::new();
    a.file("manifest.json", b"[{\"Config\": ");
    assert_eq!(
        refused(&a.finish(), None, LIMITS).kind(),
        ErrorKind::InvalidArchive
    );
    let mut a = Archive::new();
    a.file("cfg.json", b"not json").file("l.tar", &layer_tar("x"));
    a.json(
        "manifest.json",
        &json!([{ "Config": "cfg.json", "Layers": ["l.tar"] }]),
    );
    assert_eq!(
        refused(&a.finish(), None, LIMITS).kind(),
        ErrorKind::InvalidArchive
    );
}

#[test]
fn truncated_archives_are_refused() {
    let big = layer_tar(&"x".repeat(40_000));
    let mut a = Archive::new();
    let (entry, _) = add_docker_image(&mut a, "aaaa", &["app:v1"], &big, false);
    a.json("manifest.json", &json!([entry]));
    let bytes = a.finish();
    // Inside the layer member (after the config's header and data, and the layer's header).
    let err = refused(&bytes[..3 * 512 + 20_000], None, LIMITS);
    assert_eq!(err.kind(), ErrorKind::InvalidArchive, "{err}");
    // Inside the layer's header.
    assert_eq!(
        refused(&bytes[..1024 + 100], None, LIMITS).kind(),
        ErrorKind::InvalidArchive
    );
    // Between members, where an end-of-archive block should be.
    let end = archive_len_as_read(&bytes) as usize - 512;
    assert_eq!(
        refused(&bytes[..end], None, LIMITS).kind(),
        ErrorKind::InvalidArchive
    );
    // A gzip stream cut short.
    let gz = gzip(&bytes);
    assert_eq!(
        refused(&gz[..gz.len() / 2], None, LIMITS).kind(),
        ErrorKind::InvalidArchive
    );
}

#[test]
fn more_members_than_allowed_are_refused() {
    let mut a = Archive::new();
    for i in 0..20 {
        a.file(&format!("f{i}"), b"x");
    }
    let limits = ArchiveLimits {
        max_members: 10,
        ..LIMITS
    };
    let err = refused(&a.finish(), None, limits);
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
}

#[test]
fn more_bytes_than_allowed_are_refused() {
    let bytes = one_image_archive();
    let limits = ArchiveLimits {
        max_bytes: bytes.len() as u64 / 2,
        ..LIMITS
    };
    assert_eq!(refused(&bytes, None, limits).kind(), ErrorKind::TooLarge);
    // Exactly what is read fits.
    let limits = ArchiveLimits {
        max_bytes: archive_len_as_read(&bytes),
        ..LIMITS
    };
    read(&bytes, None, limits);
}

#[test]
fn a_gzip_bomb_is_bounded_by_the_decompressed_size() {
    // One member of 64 MiB of zeros: a tar header, then 64 gzip members of 1 MiB of zeros each
    // (a gzip stream may hold several), about 64 KiB in all.
    let mut header = tar::Header::new_gnu();
    header.set_path("bomb").expect("path");
    header.set_size(64 << 20);
    header.set_cksum();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(&vec![0u8; 1 << 20]).expect("gzip");
    let zeros = enc.finish().expect("gzip");
    let mut stream = gzip(header.as_bytes());
    for _ in 0..64 {
        stream.extend_from_slice(&zeros);
    }
    assert!(stream.len() < 1 << 20, "{} bytes compressed", stream.len());
    let limits = ArchiveLimits {
        max_bytes: 1 << 20,
        ..LIMITS
    };
    assert_eq!(refused(&stream, None, limits).kind(), ErrorKind::TooLarge);
    let base = tempfile::tempdir().expect("tempdir");
    let dest = base.path().join("layout");
    let err = read_rootfs_archive(&mut &stream[..], &dest, &limits).expect_err("bounded");
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    assert_nothing_left(base.path(), &dest, &err);

    // The compressed stream is bounded too: empty gzip members decompress to nothing, forever.
    let empty = gzip(b"");
    let flood: Vec<u8> = std::iter::repeat_n(empty.as_slice(), (2 << 20) / empty.len())
        .flatten()
        .copied()
        .collect();
    assert_eq!(refused(&flood, None, limits).kind(), ErrorKind::TooLarge);
}

/// A reader that fails after `left` bytes of `bytes`.
struct Failing<'a> {
    bytes: &'a [u8],
    left: usize,
}

impl std::io::Read for Failing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "upload cut",
            ));
        }
        let n = buf.len().min(self.left).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        self.left -= n;
        Ok(n)
    }
}

#[test]
fn a_failing_upload_is_an_io_error() {
    let bytes = one_image_archive();
    for archive in [bytes.clone(), gzip(&bytes)] {
        let base = tempfile::tempdir().expect("tempdir");
        let dest = base.path().join("layout");
        let mut input = Failing {
            bytes: &archive,
            left: archive.len() / 2,
        };
        let err = read_image_archive(&mut input, &dest, None, &LIMITS).expect_err("failed upload");
        assert_eq!(err.kind(), ErrorKind::Io, "{err}");
        assert_nothing_left(base.path(), &dest, &err);
        let mut input = Failing {
            bytes: &archive,
            left: archive.len() / 2,
        };
        let err = read_rootfs_archive(&mut input, &dest, &LIMITS).expect_err("failed upload");
        assert_eq!(err.kind(), ErrorKind::Io, "{err}");
        assert_nothing_left(base.path(), &dest, &err);
    }
}

#[test]
fn streams_that_are_not_tar_archives_are_refused() {
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let gz = gzip(&noise);
    for bytes in [&b""[..], &b"{\"not\": \"a tar\"}"[..], &noise, &gz] {
        let err = refused(bytes, None, LIMITS);
        assert_eq!(err.kind(), ErrorKind::InvalidArchive, "{err}");
    }
    // A tar, but of neither format.
    let mut a = Archive::new();
    a.file("hello.txt", b"hi");
    assert_eq!(
        refused(&a.finish(), None, LIMITS).kind(),
        ErrorKind::InvalidArchive
    );
    // zstd and xz are told apart, not taken for tar.
    let zstd = [0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0];
    assert_eq!(
        refused(&zstd, None, LIMITS).kind(),
        ErrorKind::UnsupportedMediaType
    );
}

#[test]
fn json_larger_than_allowed_is_refused() {
    let mut a = Archive::new();
    a.file("manifest.json", &vec![b' '; MAX_MANIFEST_BYTES + 1]);
    let err = refused(&a.finish(), None, LIMITS);
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");

    let mut a = Archive::new();
    a.file("cfg.json", &vec![b' '; MAX_MANIFEST_BYTES + 1])
        .file("l.tar", &layer_tar("x"));
    a.json(
        "manifest.json",
        &json!([{ "Config": "cfg.json", "Layers": ["l.tar"] }]),
    );
    assert_eq!(refused(&a.finish(), None, LIMITS).kind(), ErrorKind::TooLarge);
}

#[test]
fn duplicate_members_are_refused() {
    let mut a = Archive::new();
    let (entry, _) = add_docker_image(&mut a, "aaaa", &["app:v1"], &layer_tar("x\n"), false);
    a.json("manifest.json", &json!([entry]))
        .json("./manifest.json", &json!([entry]));
    assert_eq!(
        refused(&a.finish(), None, LIMITS).kind(),
        ErrorKind::InvalidArchive
    );
}

#[test]
fn an_existing_destination_is_left_alone() {
    let base = tempfile::tempdir().expect("tempdir");
    let dest = base.path().join("layout");
    std::fs::create_dir(&dest).expect("dest");
    std::fs::write(dest.join("mine"), "keep").expect("file");
    let err = read_image_archive(&mut &one_image_archive()[..], &dest, None, &LIMITS).expect_err("exists");
    assert_eq!(err.kind(), ErrorKind::Io);
    assert_eq!(std::fs::read_to_string(dest.join("mine")).expect("kept"), "keep");
}

// ---------------------------------------------------------------------------------------------
// Root file system tars.

fn rootfs_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    b.append_data(&mut dir, "etc/", &[][..]).expect("dir");
    for (name, body) in [
        ("etc/hostname", "sandbox\n"),
        ("bin/hello", "#!/bin/sh\necho hi\n"),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o755);
        b.append_data(&mut h, name, body.as_bytes()).expect("file");
    }
    let mut link = tar::Header::new_gnu();
    link.set_entry_type(tar::EntryType::Symlink);
    link.set_size(0);
    b.append_link(&mut link, "bin/hi", "hello").expect("link");
    b.into_inner().expect("tar")
}

fn read_rootfs(
    bytes: &[u8],
    limits: ArchiveLimits,
) -> Result<(tempfile::TempDir, PathBuf, ArchiveImage), RegistryError> {
    let base = tempfile::tempdir().expect("tempdir");
    let dest = base.path().join("layout");
    match read_rootfs_archive(&mut &bytes[..], &dest, &limits) {
        Ok(got) => Ok((base, dest, got)),
        Err(e) => {
            assert_nothing_left(base.path(), &dest, &e);
            Err(e)
        }
    }
}

#[test]
fn a_rootfs_tar_becomes_a_one_layer_image() {
    let tar = rootfs_tar();
    for (bytes, media_type) in [
        (tar.clone(), "application/vnd.oci.image.layer.v1.tar"),
        (gzip(&tar), "application/vnd.oci.image.layer.v1.tar+gzip"),
    ] {
        let (_base, dest, got) = read_rootfs(&bytes, LIMITS).expect("rootfs");
        assert_eq!(got.format, ArchiveFormat::Rootfs);
        assert_eq!(got.reference, None);
        assert_eq!(got.bytes, tar.len() as u64);
        let checked = check_layout(&dest, None);
        assert_eq!(
            checked.layers,
            [(media_type.to_owned(), bytes.clone())],
            "stored as given"
        );
        assert_eq!(
            checked.config["rootfs"]["diff_ids"],
            json!([format!("sha256:{}", sha(&tar))])
        );
        assert_eq!(checked.config["os"], "linux");
        assert_eq!(
            checked.config["architecture"],
            Platform::host().architecture.as_str()
        );
    }
}

#[test]
fn a_rootfs_tar_is_bounded_and_must_not_be_empty() {
    let tar = rootfs_tar();
    let limits = ArchiveLimits {
        max_bytes: tar.len() as u64 - 1,
        ..LIMITS
    };
    let err = read_rootfs(&tar, limits).expect_err("too large");
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    assert_eq!(
        read_rootfs(&gzip(&tar), limits).expect_err("too large").kind(),
        ErrorKind::TooLarge
    );
    let exact = ArchiveLimits {
        max_bytes: tar.len() as u64,
        ..LIMITS
    };
    read_rootfs(&tar, exact).expect("exactly at the limit");
    assert_eq!(
        read_rootfs(b"", LIMITS).expect_err("empty").kind(),
        ErrorKind::InvalidArchive
    );
    let gz = gzip(&tar);
    assert_eq!(
        read_rootfs(&gz[..gz.len() - 10], LIMITS)
            .expect_err("truncated")
            .kind(),
        ErrorKind::InvalidArchive
    );
}

// ---------------------------------------------------------------------------------------------
// Any bytes: refused or read, never a panic, never a half-written layout.

fn check_any(bytes: &[u8]) {
    let base = tempfile::tempdir().expect("tempdir");
    let dest = base.path().join("layout");
    match read_image_archive(&mut &bytes[..], &dest, None, &LIMITS) {
        Ok(got) => {
            check_structure(&dest, got.reference.as_deref());
        }
        Err(e) => assert_nothing_left(base.path(), &dest, &e),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_are_refused_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..3000)) {
        check_any(&bytes);
    }

    #[test]
    fn damaged_archives_are_refused_or_read_cleanly(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = one_image_archive();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        let keep = cut.index(bytes.len() + 1);
        check_any(&bytes[..keep.max(bytes.len() / 2)]);
    }
}

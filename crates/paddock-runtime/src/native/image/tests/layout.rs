//! Image layouts written in a temporary directory, read back through [`ImageLayout`].

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::super::{
    apply_layer, host_architecture, Digest, ImageError, ImageLayout, LayerCompression, LayerLimits,
    MAX_JSON_BYTES,
};
use crate::native::IdRange;

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

struct Layout {
    tmp: tempfile::TempDir,
    path: PathBuf,
}

fn descriptor(media_type: &str, bytes: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": Digest::of(bytes).to_string(), "size": bytes.len()})
}

fn tar_layer(name: &str, data: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_path(name).expect("path");
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    b.append(&h, data).expect("append");
    b.into_inner().expect("finish")
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

impl Layout {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("layout");
        fs::create_dir_all(path.join("blobs/sha256")).expect("blobs");
        fs::write(path.join("oci-layout"), br#"{"imageLayoutVersion": "1.0.0"}"#).expect("oci-layout");
        Self { tmp, path }
    }

    fn blob_path(&self, bytes: &[u8]) -> PathBuf {
        self.path.join("blobs/sha256").join(Digest::of(bytes).hex())
    }

    /// Stores `bytes` and returns their descriptor.
    fn blob(&self, media_type: &str, bytes: &[u8]) -> Value {
        fs::write(self.blob_path(bytes), bytes).expect("blob");
        descriptor(media_type, bytes)
    }

    fn json(&self, media_type: &str, value: &Value) -> (Value, Vec<u8>) {
        let bytes = serde_json::to_vec(value).expect("json");
        (self.blob(media_type, &bytes), bytes)
    }

    /// An image of one layer holding `name`, for `arch`; its manifest's descriptor.
    fn image(&self, name: &str, arch: &str, manifest_type: &str) -> Value {
        let layer = gzip(&tar_layer(name, name.as_bytes()));
        let layer = self.blob(TAR_GZIP, &layer);
        let config = json!({
            "architecture": arch, "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []},
            "config": {
                "Env": ["PATH=/usr/bin:/bin", format!("IMAGE={name}")],
                "WorkingDir": "/srv", "User": "1000:1000",
                "ExposedPorts": {"8080/tcp": {}},
                "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["exec app"]
            }
        });
        let (config, _) = self.json(OCI_CONFIG, &config);
        let manifest =
            json!({"schemaVersion": 2, "mediaType": manifest_type, "config": config, "layers": [layer]});
        self.json(manifest_type, &manifest).0
    }

    fn index(&self, manifests: Vec<Value>) {
        let index = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests});
        fs::write(
            self.path.join("index.json"),
            serde_json::to_vec(&index).expect("json"),
        )
        .expect("index.json");
    }

    fn open(&self) -> ImageLayout {
        ImageLayout::open(&self.path).expect("open layout")
    }
}

fn named(mut d: Value, name: &str) -> Value {
    d["annotations"] = json!({"org.opencontainers.image.ref.name": name});
    d
}

fn with_platform(mut d: Value, arch: &str) -> Value {
    d["platform"] = json!({"architecture": arch, "os": "linux"});
    d
}

#[test]
fn references_resolve_by_name_by_digest_or_alone() {
    let l = Layout::new();
    let arch = host_architecture();
    let a = l.image("a", arch, OCI_MANIFEST);
    let b = l.image("b", arch, DOCKER_MANIFEST);
    l.index(vec![named(a.clone(), "alpha"), named(b.clone(), "beta")]);
    let layout = l.open();
    let beta = layout.resolve(Some("beta")).expect("by name");
    assert_eq!(beta.digest.to_string(), b["digest"]);
    assert_eq!(beta.layers.len(), 1);
    assert_eq!(beta.layers[0].compression, LayerCompression::Gzip);
    assert_eq!(beta.config.env, ["PATH=/usr/bin:/bin", "IMAGE=b"]);
    assert_eq!(beta.config.working_dir.as_deref(), Some("/srv"));
    assert_eq!(beta.config.user.as_deref(), Some("1000:1000"));
    assert_eq!(beta.config.exposed_ports, ["8080/tcp"]);
    assert_eq!(beta.config.entrypoint, Some(vec!["/bin/sh".into(), "-c".into()]));
    assert_eq!(beta.config.cmd, Some(vec!["exec app".into()]));
    let by_digest = layout.resolve(a["digest"].as_str()).expect("by digest");
    assert_eq!(by_digest.config.env[1], "IMAGE=a");
    assert!(matches!(
        layout.resolve(Some("gamma")),
        Err(ImageError::NotFound { .. })
    ));
    assert!(matches!(
        layout.resolve(None),
        Err(ImageError::InvalidImage { .. })
    ));
    let sha512 = format!("sha512:{}", "0".repeat(128));
    assert!(matches!(
        layout.resolve(Some(&sha512)),
        Err(ImageError::NotFound { .. })
    ));

    l.index(vec![a]);
    let alone = l.open().resolve(None).expect("the only manifest");
    assert_eq!(alone.config.env[1], "IMAGE=a");
}

#[test]
fn layers_open_decompressed_and_checked() {
    assert!(
        rustix::process::geteuid().is_root(),
        "applying a layer chowns: run as root"
    );
    let l = Layout::new();
    l.index(vec![l.image("hello", host_architecture(), OCI_MANIFEST)]);
    let image = l.open().resolve(None).expect("resolve");
    let root = l.tmp.path().join("root");
    fs::create_dir(&root).expect("root");
    let dir = fs::File::open(&root).expect("open root");
    let ids = IdRange::DEFAULT;
    let reader = l.open().open_layer(&image.layers[0]).expect("open layer");
    apply_layer(
        std::os::fd::AsFd::as_fd(&dir),
        reader,
        &ids,
        LayerLimits::default(),
    )
    .expect("apply");
    assert_eq!(fs::read(root.join("hello")).expect("hello"), b"hello");

    // The blob altered behind the descriptor's back (same size, other bytes): refused.
    let blob = l.path.join("blobs/sha256").join(image.layers[0].digest.hex());
    let mut bytes = fs::read(&blob).expect("blob");
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&blob, &bytes).expect("rewrite");
    let again = l.tmp.path().join("again");
    fs::create_dir(&again).expect("again");
    let dir = fs::File::open(&again).expect("open again");
    let reader = l.open().open_layer(&image.layers[0]).expect("open layer");
    let e = apply_layer(
        std::os::fd::AsFd::as_fd(&dir),
        reader,
        &ids,
        LayerLimits::default(),
    )
    .expect_err("altered");
    assert!(
        matches!(
            e,
            ImageError::InvalidImage { .. } | ImageError::InvalidLayer { .. }
        ),
        "{e:?}"
    );
}

#[test]
fn an_index_picks_this_hosts_platform() {
    let l = Layout::new();
    let arch = host_architecture();
    let other = if arch == "arm64" { "amd64" } else { "arm64" };
    let mine = with_platform(l.image("mine", arch, OCI_MANIFEST), arch);
    let theirs = with_platform(l.image("theirs", other, OCI_MANIFEST), other);
    let (index, _) = l.json(
        OCI_INDEX,
        &json!({"schemaVersion": 2, "manifests": [theirs, mine]}),
    );
    l.index(vec![named(index, "multi")]);
    let image = l.open().resolve(Some("multi")).expect("resolve");
    assert_eq!(image.config.env[1], "IMAGE=mine");

    let l = Layout::new();
    let theirs = with_platform(l.image("theirs", other, OCI_MANIFEST), other);
    let (index, _) = l.json(OCI_INDEX, &json!({"schemaVersion": 2, "manifests": [theirs]}));
    l.index(vec![index]);
    assert!(matches!(
        l.open().resolve(None),
        Err(ImageError::Unsupported { .. })
    ));
}

#[test]
fn nested_indexes_are_bounded() {
    let arch = host_architecture();
    for (depth, ok) in [(4, true), (5, false)] {
        let l = Layout::new();
        let mut d = with_platform(l.image("deep", arch, OCI_MANIFEST), arch);
        for _ in 0..depth {
            let (index, _) = l.json(OCI_INDEX, &json!({"schemaVersion": 2, "manifests": [d]}));
            d = with_platform(index, arch);
        }
        l.index(vec![d]);
        let result = l.open().resolve(None);
        assert_eq!(result.is_ok(), ok, "{depth} nested: {result:?}");
        if !ok {
            assert!(matches!(result, Err(ImageError::InvalidImage { .. })));
        }
    }
}

fn assert_invalid(layout: &Path, reference: Option<&str>, what: &str) {
    let e = ImageLayout::open(layout)
        .and_then(|l| l.resolve(reference))
        .expect_err(what);
    assert!(matches!(e, ImageError::InvalidImage { .. }), "{what}: {e:?}");
}

#[test]
fn symlinks_and_oversized_files_are_refused() {
    let l = Layout::new();
    let manifest = l.image("x", host_architecture(), OCI_MANIFEST);
    l.index(vec![manifest.clone()]);
    // The manifest's blob swapped for a symlink to an identical copy outside the layout.
    let hex = manifest["digest"]
        .as_str()
        .expect("digest")
        .trim_start_matches("sha256:")
        .to_owned();
    let blob = l.path.join("blobs/sha256").join(&hex);
    let copy = l.tmp.path().join("copy");
    fs::rename(&blob, &copy).expect("move");
    std::os::unix::fs::symlink(&copy, &blob).expect("symlink");
    assert_invalid(&l.path, None, "a blob that is a symlink");
    fs::remove_file(&blob).expect("unlink");
    fs::rename(&copy, &blob).expect("move back");
    l.open().resolve(None).expect("resolves again");

    // blobs/ itself a symlink.
    let blobs = l.path.join("blobs");
    let moved = l.tmp.path().join("blobs");
    fs::rename(&blobs, &moved).expect("move blobs");
    std::os::unix::fs::symlink(&moved, &blobs).expect("symlink blobs");
    assert_invalid(&l.path, None, "blobs/ a symlink");
    fs::remove_file(&blobs).expect("unlink");
    fs::rename(&moved, &blobs).expect("move back");

    // index.json a fifo: refused without blocking.
    let index = l.path.join("index.json");
    fs::rename(&index, l.tmp.path().join("index.json")).expect("move index");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &index,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .expect("fifo");
    assert_invalid(&l.path, None, "index.json a fifo");
    fs::remove_file(&index).expect("unlink");

    // index.json larger than the JSON bound.
    let mut big = br#"{"schemaVersion": 2, "manifests": [], "annotations": {"pad": ""#.to_vec();
    big.resize(MAX_JSON_BYTES as usize + 16, b'x');
    big.extend_from_slice(br#""}}"#);
    fs::write(&index, &big).expect("big index");
    assert_invalid(&l.path, None, "an oversized index.json");

    // A manifest whose declared size is past the bound is not read at all.
    let mut huge = manifest.clone();
    huge["size"] = json!(MAX_JSON_BYTES + 1);
    l.index(vec![huge]);
    assert_invalid(&l.path, None, "an oversized manifest");
}

#[test]
fn unsupported_things_are_refused_as_such() {
    let unsupported = |l: &Layout, what: &str| {
        let e = ImageLayout::open(&l.path)
            .and_then(|x| x.resolve(None))
            .expect_err(what);
        assert!(matches!(e, ImageError::Unsupported { .. }), "{what}: {e:?}");
    };
    let l = Layout::new();
    l.index(vec![l.image("x", host_architecture(), OCI_MANIFEST)]);
    fs::write(l.path.join("oci-layout"), br#"{"imageLayoutVersion": "2.0.0"}"#).expect("write");
    unsupported(&l, "layout version 2.0.0");

    let l = Layout::new();
    let config = l
        .json(
            OCI_CONFIG,
            &json!({"architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": []}}),
        )
        .0;
    let zstd = l.blob("application/vnd.oci.image.layer.v1.tar+zstd", b"not really zstd");
    let manifest = json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config, "layers": [zstd]});
    l.index(vec![l.json(OCI_MANIFEST, &manifest).0]);
    unsupported(&l, "a zstd layer");

    let l = Layout::new();
    let odd = l.blob("application/vnd.example.thing+json", b"{}");
    l.index(vec![odd]);
    unsupported(&l, "an unknown manifest media type");

    let l = Layout::new();
    let plain = l.blob(TAR, &tar_layer("a", b"a"));
    let manifest =
        json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config, "layers": [plain]});
    l.blob(
        OCI_CONFIG,
        &serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": []}}))
        .expect("json"),
    );
    l.index(vec![l.json(OCI_MANIFEST, &manifest).0]);
    let image = l.open().resolve(None).expect("a plain tar layer is fine");
    assert_eq!(image.layers[0].compression, LayerCompression::None);
    assert_eq!(image.config, Default::default());
}

//! Test images built without Docker: OCI layouts made with `umoci` (a static busybox and small
//! files), a second layer that deletes a file (a whiteout), and a two-platform index.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest as _, Sha256};

use super::registry::run;

/// An OCI layout under construction, in its own temporary directory.
pub struct LayoutBuilder {
    pub dir: tempfile::TempDir,
}

impl LayoutBuilder {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        run(Command::new("umoci")
            .arg("init")
            .arg("--layout")
            .arg(dir.path().join("img")));
        run(Command::new("umoci")
            .args(["new", "--image"])
            .arg(format!("{}:base", dir.path().join("img").display())));
        Self { dir }
    }

    pub fn layout(&self) -> PathBuf {
        self.dir.path().join("img")
    }

    fn image(&self, tag: &str) -> String {
        format!("{}:{tag}", self.layout().display())
    }

    /// Image `tag`: base + one layer (busybox, /etc/greeting, /etc/doomed), and with `two_layers`
    /// a second layer deleting /etc/doomed and adding /etc/second; Env, WorkingDir, User, Cmd set;
    /// the config's architecture is `arch`.
    pub fn build(&self, tag: &str, two_layers: bool, arch: &str) {
        let bundle = self.dir.path().join(format!("bundle-{tag}"));
        run(Command::new("umoci")
            .args(["unpack", "--rootless", "--image"])
            .arg(self.image("base"))
            .arg(&bundle));
        let rootfs = bundle.join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).expect("bin");
        std::fs::create_dir_all(rootfs.join("etc")).expect("etc");
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("copy busybox");
        std::fs::write(rootfs.join("etc/greeting"), format!("hello from {tag}\n")).expect("greeting");
        std::fs::write(rootfs.join("etc/doomed"), "doomed\n").expect("doomed");
        run(Command::new("umoci")
            .args(["repack", "--refresh-bundle", "--image"])
            .arg(self.image(tag))
            .arg(&bundle));
        if two_layers {
            std::fs::remove_file(rootfs.join("etc/doomed")).expect("rm doomed");
            std::fs::write(rootfs.join("etc/second"), "second layer\n").expect("second");
            run(Command::new("umoci")
                .args(["repack", "--image"])
                .arg(self.image(tag))
                .arg(&bundle));
        }
        run(Command::new("umoci")
            .args(["config", "--image"])
            .arg(self.image(tag))
            .args([
                "--config.env=PATH=/bin",
                "--config.env=GREETING=hi",
                "--config.workingdir=/etc",
                "--config.user=1000:1000",
                "--config.cmd=/bin/busybox",
                "--config.cmd=sh",
                "--os=linux",
            ])
            .arg(format!("--architecture={arch}")));
    }

    fn index(&self) -> serde_json::Value {
        let text = std::fs::read(self.layout().join("index.json")).expect("index.json");
        serde_json::from_slice(&text).expect("index json")
    }

    /// The descriptor of image `tag` in the layout's index.json.
    pub fn descriptor(&self, tag: &str) -> serde_json::Value {
        self.index()["manifests"]
            .as_array()
            .expect("manifests")
            .iter()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
            .unwrap_or_else(|| panic!("no {tag} in index.json"))
            .clone()
    }

    /// Writes a blob, returning its digest and size.
    pub fn put_blob(&self, bytes: &[u8]) -> (String, usize) {
        let hex = hex::encode(Sha256::digest(bytes));
        std::fs::write(self.layout().join("blobs/sha256").join(&hex), bytes).expect("write blob");
        (format!("sha256:{hex}"), bytes.len())
    }

    /// Names `desc` as `tag` in the layout's index.json.
    pub fn tag_descriptor(&self, tag: &str, mut desc: serde_json::Value) {
        desc["annotations"] = serde_json::json!({ "org.opencontainers.image.ref.name": tag });
        let mut index = self.index();
        index["manifests"].as_array_mut().expect("manifests").push(desc);
        std::fs::write(
            self.layout().join("index.json"),
            serde_json::to_vec(&index).expect("json"),
        )
        .expect("write index.json");
    }

    /// Image `tag`: an index of the images `entries` names, each `(tag, architecture)`.
    pub fn build_index(&self, tag: &str, entries: &[(&str, &str)]) {
        let manifests: Vec<serde_json::Value> = entries
            .iter()
            .map(|(t, arch)| {
                let d = self.descriptor(t);
                serde_json::json!({
                    "mediaType": d["mediaType"],
                    "digest": d["digest"],
                    "size": d["size"],
                    "platform": { "os": "linux", "architecture": arch },
                })
            })
            .collect();
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests,
        });
        let (digest, size) = self.put_blob(&serde_json::to_vec(&index).expect("json"));
        self.tag_descriptor(
            tag,
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.index.v1+json",
                "digest": digest,
                "size": size,
            }),
        );
    }

    /// Image `tag`: `from`'s config with one layer of an unknown media type.
    pub fn build_unsupported(&self, tag: &str, from: &str) {
        let d = self.descriptor(from);
        let hex = d["digest"]
            .as_str()
            .expect("digest")
            .trim_start_matches("sha256:")
            .to_owned();
        let manifest: serde_json::Value = serde_json::from_slice(
            &std::fs::read(self.layout().join("blobs/sha256").join(hex)).expect("manifest"),
        )
        .expect("manifest json");
        let (layer, layer_size) = self.put_blob(b"not a tar at all");
        let odd = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": manifest["config"],
            "layers": [{ "mediaType": "application/vnd.paddock.test.unknown", "digest": layer, "size": layer_size }],
        });
        let (digest, size) = self.put_blob(&serde_json::to_vec(&odd).expect("json"));
        self.tag_descriptor(
            tag,
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest,
                "size": size,
            }),
        );
    }
}

/// The SHA-256 of a file, as `sha256:<hex>`.
pub fn file_digest(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

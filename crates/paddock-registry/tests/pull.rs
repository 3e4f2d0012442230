//! Pulls from a real registry on 127.0.0.1 (Debian's docker-registry, basic auth, TLS from a test
//! CA) of images these tests build and push themselves.

mod support;

use std::path::Path;

use paddock_registry::{
    pull, CredentialSources, Credentials, ErrorKind, ImageReference, Platform, PullOptions, PulledImage,
    RegistryError, REF_NAME,
};
use support::images::{file_digest, LayoutBuilder};
use support::registry::{TestRegistry, PASSWORD, USER};

fn creds(user: &str, password: &str) -> Credentials {
    Credentials::Basic {
        username: user.into(),
        password: password.into(),
    }
}

fn options(registry: &TestRegistry) -> PullOptions {
    PullOptions {
        credentials: CredentialSources {
            explicit: Some(creds(USER, PASSWORD)),
            ..CredentialSources::default()
        },
        extra_ca_file: Some(registry.ca_file.clone()),
        ..PullOptions::default()
    }
}

fn reference(s: &str) -> ImageReference {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// A registry holding `test/img:v1` (one layer, busybox and two files).
fn registry_with_image() -> (TestRegistry, LayoutBuilder) {
    let registry = TestRegistry::start();
    let images = LayoutBuilder::new();
    images.build("v1", false, &Platform::host().architecture);
    registry.push(&images.layout(), "v1", "test/img", "v1");
    (registry, images)
}

/// Checks a pulled layout: oci-layout, index.json naming `ref_name`, every blob hashing to its
/// name, no partial files.
fn check_layout(dest: &Path, pulled: &PulledImage) -> serde_json::Value {
    let marker = std::fs::read_to_string(dest.join("oci-layout")).expect("oci-layout");
    assert!(marker.contains("imageLayoutVersion"), "{marker}");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dest.join("index.json")).expect("index.json"))
            .expect("index json");
    let entry = index["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .find(|m| m["annotations"][REF_NAME] == pulled.ref_name.as_str())
        .unwrap_or_else(|| panic!("index.json does not name {}: {index}", pulled.ref_name))
        .clone();
    assert_eq!(entry["digest"], pulled.manifest_digest.as_str());
    assert_eq!(
        entry["annotations"]["io.containerd.image.name"],
        pulled.reference.as_str()
    );
    let blobs = dest.join("blobs/sha256");
    for entry in std::fs::read_dir(&blobs).expect("blobs") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name").to_string_lossy().into_owned();
        assert!(!name.contains('.'), "stray file {name}");
        assert_eq!(file_digest(&path), format!("sha256:{name}"), "blob {name}");
    }
    for digest in std::iter::once(&pulled.manifest_digest)
        .chain(std::iter::once(&pulled.config.digest))
        .chain(pulled.layers.iter().map(|l| &l.digest))
    {
        assert!(blobs.join(&digest[7..]).is_file(), "{digest} missing");
    }
    let names: Vec<_> = std::fs::read_dir(dest)
        .expect("dest")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    entry
}

fn blob_json(dest: &Path, digest: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dest.join("blobs/sha256").join(&digest[7..])).expect("blob"))
        .expect("json blob")
}

/// Entry names of a gzip-compressed tar layer.
fn layer_entries(dest: &Path, digest: &str) -> Vec<String> {
    let file = std::fs::File::open(dest.join("blobs/sha256").join(&digest[7..])).expect("layer");
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    archive
        .entries()
        .expect("entries")
        .map(|e| {
            e.expect("entry")
                .path()
                .expect("path")
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// No partial files and no index.json: nothing half-made.
fn assert_nothing_half_made(dest: &Path) {
    assert!(
        !dest.join("index.json").exists(),
        "index.json written by a failed pull"
    );
    if let Ok(dir) = std::fs::read_dir(dest.join("blobs/sha256")) {
        for e in dir {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            assert!(!name.ends_with(".partial"), "partial file {name} left");
        }
    }
}

fn assert_one_line(err: &RegistryError) {
    let line = err.to_string();
    assert!(!line.contains('\n') && !line.is_empty(), "{line:?}");
}

#[tokio::test]
async fn pulls_by_tag_and_by_digest_into_a_verified_layout() {
    let (registry, images) = registry_with_image();
    let dest = tempfile::tempdir().expect("dest");
    let r = reference(&format!("{}/test/img:v1", registry.host()));
    let pulled = pull(&r, dest.path(), &options(&registry))
        .await
        .expect("pull by tag");
    assert_eq!(pulled.ref_name, "v1");
    assert_eq!(pulled.reference, format!("{}/test/img:v1", registry.host()));
    assert_eq!(pulled.index_digest, None);
    assert_eq!(pulled.platform, Platform::host(), "read from the image's config");
    // skopeo pushed the OCI manifest as it was: same digest as in the built layout.
    assert_eq!(
        pulled.manifest_digest,
        images.descriptor("v1")["digest"].as_str().expect("digest")
    );
    assert_eq!(pulled.layers.len(), 1);
    assert!(pulled.bytes_downloaded > 500_000, "busybox is in the layer");
    check_layout(dest.path(), &pulled);
    let config = blob_json(dest.path(), &pulled.config.digest);
    assert_eq!(config["config"]["WorkingDir"], "/etc");
    assert_eq!(config["config"]["User"], "1000:1000");
    assert_eq!(config["config"]["Cmd"], serde_json::json!(["/bin/busybox", "sh"]));
    let entries = layer_entries(dest.path(), &pulled.layers[0].digest);
    assert!(entries.iter().any(|e| e.ends_with("bin/busybox")), "{entries:?}");

    // By digest, into a fresh layout: the same manifest, named by its digest.
    let by_digest = reference(&format!(
        "{}/test/img@{}",
        registry.host(),
        pulled.manifest_digest
    ));
    let dest2 = tempfile::tempdir().expect("dest2");
    let again = pull(&by_digest, dest2.path(), &options(&registry))
        .await
        .expect("pull by digest");
    assert_eq!(again.manifest_digest, pulled.manifest_digest);
    assert_eq!(again.ref_name, pulled.manifest_digest);
    check_layout(dest2.path(), &again);

    // Pulled again into the first layout: every blob is reused, none fetched.
    let reused = pull(&r, dest.path(), &options(&registry))
        .await
        .expect("pull again");
    assert_eq!(reused.bytes_downloaded, 0);
    // A damaged blob is noticed and fetched again.
    let layer = dest
        .path()
        .join("blobs/sha256")
        .join(&pulled.layers[0].digest[7..]);
    let mut bytes = std::fs::read(&layer).expect("layer");
    bytes[100] ^= 0xff;
    std::fs::write(&layer, bytes).expect("damage");
    let repaired = pull(&r, dest.path(), &options(&registry))
        .await
        .expect("pull repairs");
    assert_eq!(repaired.bytes_downloaded, pulled.layers[0].size);
    check_layout(dest.path(), &repaired);
}

#[tokio::test]
async fn a_multi_platform_index_gives_the_hosts_platform() {
    let registry = TestRegistry::start();
    let images = LayoutBuilder::new();
    images.build("amd", false, "amd64");
    images.build("arm", false, "arm64");
    images.build_index("multi", &[("amd", "amd64"), ("arm", "arm64")]);
    registry.push(&images.layout(), "multi", "test/multi", "latest");
    let r = reference(&format!("{}/test/multi", registry.host()));
    assert_eq!(r.tag(), Some("latest"));

    let host = Platform::host();
    let dest = tempfile::tempdir().expect("dest");
    let pulled = pull(&r, dest.path(), &options(&registry))
        .await
        .expect("pull index");
    assert!(pulled.index_digest.is_some());
    check_layout(dest.path(), &pulled);
    let config = blob_json(dest.path(), &pulled.config.digest);
    assert_eq!(config["architecture"], host.architecture.as_str());
    let index_blob = dest
        .path()
        .join("blobs/sha256")
        .join(&pulled.index_digest.clone().expect("index")[7..]);
    assert!(index_blob.is_file(), "the index is kept in the layout");

    // Each platform when asked for, and a clear refusal for one the index lacks.
    for arch in ["amd64", "arm64"] {
        let mut opts = options(&registry);
        opts.platform = Platform {
            os: "linux".into(),
            architecture: arch.into(),
            variant: None,
        };
        let d = tempfile::tempdir().expect("dest");
        let p = pull(&r, d.path(), &opts).await.expect("pull platform");
        let tag = if arch == "amd64" { "amd" } else { "arm" };
        assert_eq!(
            p.manifest_digest,
            images.descriptor(tag)["digest"].as_str().expect("digest")
        );
        assert_eq!(blob_json(d.path(), &p.config.digest)["architecture"], arch);
    }
    let mut opts = options(&registry);
    opts.platform = Platform {
        os: "linux".into(),
        architecture: "s390x".into(),
        variant: None,
    };
    let d = tempfile::tempdir().expect("dest");
    let err = pull(&r, d.path(), &opts).await.expect_err("no s390x");
    assert_eq!(err.kind(), ErrorKind::NoMatchingPlatform, "{err}");
    assert!(err.to_string().contains("linux/amd64, linux/arm64"), "{err}");
    assert_one_line(&err);
    assert_nothing_half_made(d.path());
}

#[tokio::test]
async fn a_multi_layer_image_keeps_both_layers_and_its_whiteout() {
    let registry = TestRegistry::start();
    let images = LayoutBuilder::new();
    images.build("two", true, &Platform::host().architecture);
    registry.push(&images.layout(), "two", "test/layers", "two");
    let dest = tempfile::tempdir().expect("dest");
    let r = reference(&format!("{}/test/layers:two", registry.host()));
    let pulled = pull(&r, dest.path(), &options(&registry)).await.expect("pull");
    check_layout(dest.path(), &pulled);
    assert_eq!(pulled.layers.len(), 2);
    let first = layer_entries(dest.path(), &pulled.layers[0].digest);
    assert!(first.iter().any(|e| e.ends_with("etc/doomed")), "{first:?}");
    let second = layer_entries(dest.path(), &pulled.layers[1].digest);
    assert!(second.iter().any(|e| e.ends_with("etc/.wh.doomed")), "{second:?}");
    assert!(second.iter().any(|e| e.ends_with("etc/second")), "{second:?}");
    let manifest = blob_json(dest.path(), &pulled.manifest_digest);
    assert_eq!(manifest["layers"].as_array().expect("layers").len(), 2);
}

#[tokio::test]
async fn refusals_are_one_line_and_leave_nothing_half_made() {
    let (registry, images) = registry_with_image();
    images.build_unsupported("odd", "v1");
    registry.push(&images.layout(), "odd", "test/odd", "v1");
    let host = registry.host();
    let cases: Vec<(String, PullOptions, ErrorKind)> = vec![
        // Bad credentials, and none at all.
        (
            format!("{host}/test/img:v1"),
            PullOptions {
                credentials: CredentialSources {
                    explicit: Some(creds(USER, "wrong")),
                    ..Default::default()
                },
                ..options(&registry)
            },
            ErrorKind::Unauthorized,
        ),
        (
            format!("{host}/test/img:v1"),
            PullOptions {
                credentials: CredentialSources::default(),
                ..options(&registry)
            },
            ErrorKind::Unauthorized,
        ),
        // A missing tag, a missing repository, a missing digest.
        (
            format!("{host}/test/img:nope"),
            options(&registry),
            ErrorKind::NotFound,
        ),
        (
            format!("{host}/test/absent:v1"),
            options(&registry),
            ErrorKind::NotFound,
        ),
        (
            format!("{host}/test/img@sha256:{}", "0".repeat(64)),
            options(&registry),
            ErrorKind::NotFound,
        ),
        // A layer of an unknown media type.
        (
            format!("{host}/test/odd:v1"),
            options(&registry),
            ErrorKind::UnsupportedMediaType,
        ),
        // The registry's certificate is not trusted without the test CA.
        (
            format!("{host}/test/img:v1"),
            PullOptions {
                extra_ca_file: None,
                ..options(&registry)
            },
            ErrorKind::Tls,
        ),
        // Nothing listens there.
        (
            format!("127.0.0.1:{}/test/img:v1", closed_port()),
            options(&registry),
            ErrorKind::Unreachable,
        ),
        // A name that never resolves.
        (
            "registry.invalid/test/img:v1".into(),
            options(&registry),
            ErrorKind::Unreachable,
        ),
        // Bigger than allowed in all.
        (
            format!("{host}/test/img:v1"),
            PullOptions {
                max_total_bytes: 1000,
                ..options(&registry)
            },
            ErrorKind::TooLarge,
        ),
    ];
    for (i, (r, opts, kind)) in cases.into_iter().enumerate() {
        let dest = tempfile::tempdir().expect("dest");
        let err = pull(&reference(&r), dest.path(), &opts).await.expect_err(&r);
        assert_eq!(err.kind(), kind, "{r}: {err}");
        if kind == ErrorKind::Unauthorized {
            let anonymous = i == 1;
            assert_eq!(
                err.to_string().contains("refuses anonymous pulls"),
                anonymous,
                "{err}"
            );
        }
        assert_one_line(&err);
        assert_nothing_half_made(dest.path());
        eprintln!("{r}: {err}");
    }
}

fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    port
}

#[tokio::test]
async fn credentials_come_from_a_docker_config() {
    let (registry, _images) = registry_with_image();
    let home = tempfile::tempdir().expect("home");
    let config = home.path().join(".docker/config.json");
    std::fs::create_dir_all(config.parent().expect("parent")).expect("mkdir");
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    std::fs::write(
        &config,
        format!(
            r#"{{"auths":{{"https://{}":{{"auth":"{auth}"}}}}}}"#,
            registry.host()
        ),
    )
    .expect("write config");
    let opts = PullOptions {
        credentials: CredentialSources {
            docker_config: Some(config.clone()),
            ..CredentialSources::default()
        },
        ..options(&registry)
    };
    let dest = tempfile::tempdir().expect("dest");
    let r = reference(&format!("{}/test/img:v1", registry.host()));
    let pulled = pull(&r, dest.path(), &opts)
        .await
        .expect("pull with docker config");
    check_layout(dest.path(), &pulled);

    // The environment's (here given as such) win over the file's.
    let opts = PullOptions {
        credentials: CredentialSources {
            environment: Some(creds(USER, "wrong")),
            docker_config: Some(config),
            ..CredentialSources::default()
        },
        ..options(&registry)
    };
    let dest = tempfile::tempdir().expect("dest");
    let err = pull(&r, dest.path(), &opts).await.expect_err("env wins");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
}

#[tokio::test]
async fn the_size_budget_counts_config_and_layers() {
    let (registry, _images) = registry_with_image();
    let r = reference(&format!("{}/test/img:v1", registry.host()));
    let dest = tempfile::tempdir().expect("dest");
    let first = pull(&r, dest.path(), &options(&registry)).await.expect("pull");
    let total = first.config.size + first.layers[0].size;
    // Exactly enough: pulled. One byte less: refused before anything is fetched.
    let exact = PullOptions {
        max_total_bytes: total,
        ..options(&registry)
    };
    let ok = tempfile::tempdir().expect("dest");
    pull(&r, ok.path(), &exact).await.expect("exact budget");
    let short = PullOptions {
        max_total_bytes: total - 1,
        ..options(&registry)
    };
    let small = tempfile::tempdir().expect("dest");
    let err = pull(&r, small.path(), &short).await.expect_err("over budget");
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
    assert_one_line(&err);
    assert_nothing_half_made(small.path());
    assert!(!small.path().join("blobs").exists(), "nothing fetched: {err}");
}

#[tokio::test]
async fn docker_schema2_images_and_manifest_lists_are_pulled_as_they_are() {
    let registry = TestRegistry::start();
    let images = LayoutBuilder::new();
    let host = Platform::host().architecture;
    let other = if host == "arm64" { "amd64" } else { "arm64" };
    images.build("two", true, &host);
    images.build("other", false, other);
    images.build_index("multi", &[("other", other), ("two", &host)]);
    registry.push_as(&images.layout(), "two", "test/docker", "v2s2", Some("v2s2"));
    registry.push_as(&images.layout(), "multi", "test/docker", "list", Some("v2s2"));
    for tag in ["v2s2", "list"] {
        let dest = tempfile::tempdir().expect("dest");
        let r = reference(&format!("{}/test/docker:{tag}", registry.host()));
        let pulled = pull(&r, dest.path(), &options(&registry))
            .await
            .expect("pull v2s2");
        check_layout(dest.path(), &pulled);
        assert_eq!(pulled.manifest_media_type, paddock_registry::DOCKER_MANIFEST);
        assert_eq!(
            pulled.config.media_type,
            "application/vnd.docker.container.image.v1+json"
        );
        assert_eq!(pulled.layers.len(), 2, "{tag}: the host's image, not the other");
        for layer in &pulled.layers {
            assert_eq!(
                layer.media_type,
                "application/vnd.docker.image.rootfs.diff.tar.gzip"
            );
        }
        let second = layer_entries(dest.path(), &pulled.layers[1].digest);
        assert!(second.iter().any(|e| e.ends_with("etc/.wh.doomed")), "{second:?}");
        if tag == "list" {
            let index_digest = pulled.index_digest.clone().expect("a manifest list");
            let list = blob_json(dest.path(), &index_digest);
            assert_eq!(list["mediaType"], paddock_registry::DOCKER_LIST);
        }
    }
}

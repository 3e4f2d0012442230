//! What a real registry never does, from a fake one over plain HTTP on 127.0.0.1 (listed as
//! insecure, which only loopback registries may be): blobs longer than their descriptors, blobs
//! that do not hash to their digest, manifests of unsupported types. Each refused with its kind,
//! no partial file left.

#[path = "support/fake.rs"]
mod fake;

use std::collections::HashMap;
use std::path::Path;

use fake::{serve, Reply};
use paddock_registry::{pull, ErrorKind, ImageReference, PullOptions};
use sha2::{Digest as _, Sha256};

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// A registry serving `test/img:v1` whose config is `config` and whose one layer's descriptor
/// says `layer_digest` and `layer_size`, while the blob endpoint answers `layer_reply`.
async fn lying_registry(layer_digest: &str, layer_size: usize, layer_reply: Reply) -> u16 {
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#.to_vec();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer_size}],
    }))
    .expect("json");
    let mut routes = HashMap::new();
    routes.insert("/v2/".to_owned(), Reply::ok("application/json", b"{}".to_vec()));
    routes.insert(
        "/v2/test/img/manifests/v1".to_owned(),
        Reply::ok(MANIFEST, manifest),
    );
    routes.insert(
        format!("/v2/test/img/blobs/{}", digest(&config)),
        Reply::ok("application/octet-stream", config),
    );
    routes.insert(format!("/v2/test/img/blobs/{layer_digest}"), layer_reply);
    serve(routes).await
}

fn insecure(port: u16) -> PullOptions {
    PullOptions {
        insecure_registries: vec![format!("127.0.0.1:{port}")],
        ..PullOptions::default()
    }
}

fn assert_no_partials(dest: &Path) {
    assert!(!dest.join("index.json").exists());
    for e in std::fs::read_dir(dest.join("blobs/sha256")).expect("blobs") {
        let name = e.expect("entry").file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".partial"), "{name} left behind");
    }
}

async fn pull_from(
    port: u16,
) -> (
    tempfile::TempDir,
    Result<paddock_registry::PulledImage, paddock_registry::RegistryError>,
) {
    let r: ImageReference = format!("127.0.0.1:{port}/test/img:v1")
        .parse()
        .expect("reference");
    let dest = tempfile::tempdir().expect("dest");
    let result = pull(&r, dest.path(), &insecure(port)).await;
    (dest, result)
}

#[tokio::test]
async fn plain_http_to_loopback_works_when_listed() {
    let layer = b"layer bytes".to_vec();
    let port = lying_registry(
        &digest(&layer),
        layer.len(),
        Reply::ok("application/octet-stream", layer),
    )
    .await;
    let (dest, result) = pull_from(port).await;
    let pulled = result.expect("pull over plain HTTP");
    assert_eq!(pulled.layers.len(), 1);
    assert!(dest.path().join("index.json").is_file());
    // Not listed: TLS is spoken, and the plain-HTTP server cannot answer it.
    let r: ImageReference = format!("127.0.0.1:{port}/test/img:v1")
        .parse()
        .expect("reference");
    let d = tempfile::tempdir().expect("dest");
    let quick = PullOptions {
        connect_timeout: std::time::Duration::from_secs(2),
        read_timeout: std::time::Duration::from_secs(2),
        ..PullOptions::default()
    };
    let err = pull(&r, d.path(), &quick).await.expect_err("https to http");
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Tls | ErrorKind::Protocol | ErrorKind::Unreachable
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_blob_longer_than_its_descriptor_is_cut_off() {
    let layer = vec![7u8; 200_000];
    // Announced: refused before a byte is written.
    let port = lying_registry(
        &digest(&layer[..10]),
        10,
        Reply::ok("application/octet-stream", layer.clone()),
    )
    .await;
    let (dest, result) = pull_from(port).await;
    let err = result.expect_err("too long");
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
    assert_no_partials(dest.path());
    // Not announced (the body runs to the close): cut off midway, the partial file removed.
    let reply = Reply {
        with_length: false,
        ..Reply::ok("application/octet-stream", layer.clone())
    };
    let port = lying_registry(&digest(&layer[..10]), 10, reply).await;
    let (dest, result) = pull_from(port).await;
    let err = result.expect_err("too long");
    assert_eq!(err.kind(), ErrorKind::TooLarge, "{err}");
    assert!(
        err.to_string().contains("more bytes than its descriptor"),
        "{err}"
    );
    assert_no_partials(dest.path());
}

#[tokio::test]
async fn a_blob_that_does_not_hash_to_its_digest_is_refused() {
    let layer = b"the real layer".to_vec();
    let forged = b"a forged layer".to_vec();
    assert_eq!(layer.len(), forged.len());
    let port = lying_registry(
        &digest(&layer),
        layer.len(),
        Reply::ok("application/octet-stream", forged),
    )
    .await;
    let (dest, result) = pull_from(port).await;
    let err = result.expect_err("forged");
    assert_eq!(err.kind(), ErrorKind::DigestMismatch, "{err}");
    assert!(!err.to_string().contains('\n'));
    assert_no_partials(dest.path());
    // A shorter blob than announced is a mismatch too.
    let port = lying_registry(
        &digest(&layer),
        layer.len(),
        Reply::ok("application/octet-stream", layer[..5].to_vec()),
    )
    .await;
    let (dest, result) = pull_from(port).await;
    let err = result.expect_err("short");
    assert_eq!(err.kind(), ErrorKind::DigestMismatch, "{err}");
    assert_no_partials(dest.path());
}

#[tokio::test]
async fn oversized_and_foreign_manifests_are_refused() {
    let big = format!(
        r#"{{"schemaVersion":2,"mediaType":"{MANIFEST}","annotations":{{"pad":"{}"}}}}"#,
        "x".repeat(5 << 20)
    );
    let schema1 = br#"{"schemaVersion":1,"name":"test/img","tag":"v1","fsLayers":[]}"#.to_vec();
    let helm = br#"{"schemaVersion":2,"mediaType":"application/vnd.cncf.helm.chart.v1+json"}"#.to_vec();
    for (body, kind) in [
        (big.into_bytes(), ErrorKind::TooLarge),
        (schema1, ErrorKind::UnsupportedMediaType),
        (helm, ErrorKind::UnsupportedMediaType),
        (b"<html>not json</html>".to_vec(), ErrorKind::Protocol),
    ] {
        let mut routes = HashMap::new();
        routes.insert("/v2/".to_owned(), Reply::ok("application/json", b"{}".to_vec()));
        routes.insert("/v2/test/img/manifests/v1".to_owned(), Reply::ok(MANIFEST, body));
        let port = serve(routes).await;
        let (dest, result) = pull_from(port).await;
        let err = result.expect_err("refused");
        assert_eq!(err.kind(), kind, "{err}");
        assert!(!err.to_string().contains('\n'), "{err}");
        assert!(!dest.path().join("index.json").exists());
    }
}

#[tokio::test]
async fn a_registry_that_stalls_is_cut_off_at_the_deadline() {
    let layer = vec![1u8; 100_000];
    let reply = Reply {
        hang: true,
        ..Reply::ok("application/octet-stream", layer.clone())
    };
    let port = lying_registry(&digest(&layer), layer.len(), reply).await;
    let r: ImageReference = format!("127.0.0.1:{port}/test/img:v1")
        .parse()
        .expect("reference");
    let dest = tempfile::tempdir().expect("dest");
    let options = PullOptions {
        timeout: std::time::Duration::from_secs(1),
        ..insecure(port)
    };
    let started = std::time::Instant::now();
    let err = pull(&r, dest.path(), &options).await.expect_err("stalled");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_no_partials(dest.path());
}

//! The listener over TLS (`[http] tls_cert` / `tls_key`) with a wildcard certificate for the
//! `[e2b] domain`: the control plane at `api.<domain>`, a sandbox's envd at
//! `49983-<id>.<domain>` routed by the host alone (SNI and `Host`), the JavaScript SDK over HTTPS,
//! and plain HTTP refused. Names are mapped to 127.0.0.1 by the client (no DNS).

use std::net::SocketAddr;
use std::process::Command;

use super::sdk::{clients, e2b_spelling};
use crate::support::server::Server;
use crate::support::TestEnv;

const DOMAIN: &str = "paddock.test";

/// A self-signed certificate for `*.paddock.test`, `paddock.test` and 127.0.0.1, written as PEM.
fn certificate(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let names = vec![format!("*.{DOMAIN}"), DOMAIN.to_owned(), "127.0.0.1".to_owned()];
    let cert = rcgen::generate_simple_self_signed(names).expect("a self-signed certificate");
    let pem = cert.cert.pem();
    let cert_path = dir.join("tls.crt");
    let key_path = dir.join("tls.key");
    std::fs::write(&cert_path, &pem).expect("write the certificate");
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).expect("write the key");
    (cert_path, key_path, pem)
}

#[test]
fn https_with_a_wildcard_certificate_routes_per_sandbox_hosts() {
    let env = TestEnv::new();
    // Beside the state directory, never in it (the server only takes over an empty one).
    let files = tempfile::tempdir().expect("a directory for the certificate and configuration");
    let (cert, key, pem) = certificate(files.path());
    let config = files.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[http]\ntls_cert = {:?}\ntls_key = {:?}\n\n[e2b]\ndomain = \"{DOMAIN}\"\n",
            cert.display().to_string(),
            key.display().to_string()
        ),
    )
    .expect("write the configuration");
    let server = Server::start(&env, &["--config", config.to_str().expect("utf-8")], "info");
    let https = server.url.clone();
    assert!(https.starts_with("https://127.0.0.1:"), "{https}");
    let addr: SocketAddr = https.trim_start_matches("https://").parse().expect("address");
    let port = addr.port();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let plain = reqwest::Client::builder().no_proxy().build().expect("client");
        assert!(
            plain.get(format!("http://{addr}/healthz")).send().await.is_err(),
            "plain HTTP on the TLS listener must fail"
        );
        // A client that trusts only the test's certificate and maps these names to the listener.
        let trusting = |names: &[String]| {
            let mut b = reqwest::Client::builder()
                .no_proxy()
                .tls_built_in_root_certs(false)
                .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).expect("certificate"));
            for n in names {
                b = b.resolve(n, addr);
            }
            b.build().expect("client")
        };
        // The /v1 admin API over TLS makes the tenant's key.
        let admin = server.admin_key.clone();
        let client = trusting(&[format!("api.{DOMAIN}")]);
        let created: serde_json::Value = client
            .post(format!("https://api.{DOMAIN}:{port}/v1/keys"))
            .bearer_auth(&admin)
            .json(&serde_json::json!({ "tenant": "tls" }))
            .send()
            .await
            .expect("create a key")
            .json()
            .await
            .expect("key JSON");
        let key = e2b_spelling(created["key"].as_str().expect("key"));
        let sandbox: serde_json::Value = client
            .post(format!("https://api.{DOMAIN}:{port}/v2/sandboxes"))
            .header("X-API-KEY", &key)
            .json(&serde_json::json!({ "templateID": "base", "timeout": 60 }))
            .send()
            .await
            .expect("create a sandbox")
            .json()
            .await
            .expect("sandbox JSON");
        let id = sandbox["sandboxID"].as_str().expect("id").to_owned();
        let envd = format!("49983-{id}.{DOMAIN}");
        let client = trusting(&[format!("api.{DOMAIN}"), envd.clone()]);
        let health = client
            .get(format!("https://{envd}:{port}/health"))
            .send()
            .await
            .expect("envd health over TLS");
        assert_eq!(health.status(), 204);
        let denied = client
            .get(format!("https://{envd}:{port}/envs"))
            .header("X-Access-Token", "0".repeat(64))
            .send()
            .await
            .expect("envd over TLS");
        assert_eq!(denied.status(), 401);
        let killed = client
            .delete(format!("https://api.{DOMAIN}:{port}/sandboxes/{id}"))
            .header("X-API-KEY", &key)
            .send()
            .await
            .expect("kill");
        assert_eq!(killed.status(), 204);

        // E2B's JavaScript SDK over HTTPS (routing by header on the one port), trusting the
        // certificate through Node's own variable.
        let script = "import { Sandbox } from 'e2b';\n\
            const s = await Sandbox.create({ timeoutMs: 60000 });\n\
            const r = await s.commands.run('echo over-tls');\n\
            await s.kill();\n\
            if (r.stdout !== 'over-tls\\n') { console.error(r); process.exit(1) }\n";
        let out = Command::new("node")
            .current_dir(clients().join("js"))
            .args(["--input-type=module", "-e", script])
            .env("E2B_API_URL", &https)
            .env("E2B_SANDBOX_URL", &https)
            .env("E2B_API_KEY", &key)
            .env("NODE_EXTRA_CA_CERTS", &cert)
            .env("NO_PROXY", "*")
            .output()
            .expect("node runs");
        assert!(
            out.status.success(),
            "the JS SDK over HTTPS failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    });
    drop(server);
}

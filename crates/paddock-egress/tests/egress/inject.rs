//! Credential injection: placeholders become values only in requests to the hosts they are bound to.

use std::io::Write;
use std::sync::{Arc, Mutex};

use hickory_proto::rr::RecordType;
use paddock_egress::Secret;
use paddock_types::SandboxId;
use zeroize::Zeroizing;

use crate::common::*;

const VALUE: &str = "ghp_the-real-token-0123456789";

fn secret(name: &str, host: &str) -> Secret {
    Secret::new(
        name.parse().unwrap(),
        Zeroizing::new(VALUE.to_owned()),
        vec![host.parse().unwrap()],
    )
    .unwrap()
}

#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn req(host: &str, auth: &str) -> String {
    format!("GET /user HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {auth}\r\nX-Other: {auth}\r\n\r\n")
}

/// Every test here runs on a current-thread runtime so the log capture sees every task.
#[tokio::test]
async fn placeholders_are_replaced_for_bound_hosts_only_and_never_logged() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let ca = TestCa::new();
    let api = ca.https_server(&["api.test", "plain.test"]).await;
    let mut h = egress(
        operator(
            &[api.port()],
            &[("api.test", "127.0.0.1"), ("plain.test", "127.0.0.1")],
        ),
        Some(ca.pem()),
    );
    let sb: SandboxId = "sb-inject".parse().unwrap();
    let out = h
        .egress
        .add_sandbox(sb.clone(), policy(r#"{"allow":[{"domain":"*.test"}]}"#), LOOPBACK)
        .await
        .unwrap();
    h.egress.set_secrets(&sb, vec![secret("GH", "api.test")]).unwrap();
    let placeholder = "paddock-secret:GH";

    // Bound host through CONNECT: intercepted with the sandbox's CA, value substituted.
    let (status, tunnel) = connect_via(out.proxy_addr, &format!("api.test:{}", api.port())).await;
    assert_eq!(status, 200);
    let mut tls = tls_connect(tunnel, &out.ca_pem, "api.test").await.unwrap();
    for _ in 0..2 {
        let (status, seen) = request(&mut tls, &req("api.test", placeholder)).await;
        assert_eq!(status, 200);
        let seen = String::from_utf8(seen).unwrap();
        assert!(
            seen.contains(&format!("authorization: Bearer {VALUE}\r\n")),
            "{seen}"
        );
        assert!(
            seen.contains(&format!("x-other: {VALUE}\r\n")) && !seen.contains(placeholder),
            "{seen}"
        );
    }
    drop(tls);
    let r = h.next_connection().await;
    assert!(r.allowed);
    assert_eq!(r.secrets_injected, vec!["GH".to_owned()]);

    // Another host: not intercepted (the sandbox sees the real server's certificate), placeholder
    // unchanged.
    let (_, tunnel) = connect_via(out.proxy_addr, &format!("plain.test:{}", api.port())).await;
    assert!(
        tls_connect(tunnel, &out.ca_pem, "plain.test").await.is_err(),
        "not signed by the sandbox CA"
    );
    h.next_connection().await;
    let (_, tunnel) = connect_via(out.proxy_addr, &format!("plain.test:{}", api.port())).await;
    let mut tls = tls_connect(tunnel, &ca.pem(), "plain.test").await.unwrap();
    let (_, seen) = request(&mut tls, &req("plain.test", placeholder)).await;
    let seen = String::from_utf8(seen).unwrap();
    assert!(
        seen.contains(&format!("Authorization: Bearer {placeholder}\r\n")) && !seen.contains(VALUE),
        "{seen}"
    );
    drop(tls);
    assert!(h.next_connection().await.secrets_injected.is_empty());

    // Transparent door: SNI of a bound host, pinned by DNS, intercepted too.
    dns_query(out.dns_addr, "api.test.", RecordType::A).await;
    let (client, proxy_end) = intercepted_pair().await;
    let (egress, id) = (h.egress.clone(), sb.clone());
    tokio::spawn(async move { egress.serve_intercepted(&id, proxy_end, api).await.unwrap() });
    let mut tls = tls_connect(client, &out.ca_pem, "api.test").await.unwrap();
    let (_, seen) = request(
        &mut tls,
        &req("api.test", "paddock-secret:GH paddock-secret:NOPE"),
    )
    .await;
    let seen = String::from_utf8(seen).unwrap();
    assert!(
        seen.contains(&format!("Bearer {VALUE} paddock-secret:NOPE\r\n")),
        "{seen}"
    );
    drop(tls);
    assert_eq!(h.next_connection().await.secrets_injected, vec!["GH".to_owned()]);

    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("sandbox egress started"), "the capture works");
    assert!(!logs.contains(VALUE), "the secret value was logged");
}

//! Credential injection: placeholders become values only in the fields they are bound to, of
//! requests whose target is the host they are bound to; anything else is refused or left alone.

use std::io::Write;
use std::sync::{Arc, Mutex};

use hickory_proto::rr::RecordType;
use paddock_egress::{Secret, SecretBinding};
use paddock_types::SandboxId;
use zeroize::Zeroizing;

use crate::common::*;

const VALUE: &str = "ghp_the-real-token-0123456789";

fn secret(name: &str, host: &str) -> Secret {
    Secret::new(
        name.parse().unwrap(),
        Zeroizing::new(VALUE.to_owned()),
        SecretBinding::new(vec![host.parse().unwrap()], None, false).unwrap(),
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
        // A field the secret is not bound to keeps the placeholder: an endpoint echoing headers
        // hands back nothing the sandbox did not have.
        assert!(
            seen.contains(&format!("x-other: {placeholder}\r\n")) && seen.matches(VALUE).count() == 1,
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

/// Opens an intercepted TLS connection to `host` through the sandbox's CONNECT proxy.
async fn intercepted(
    out: &paddock_egress::SandboxEgress,
    host: &str,
    port: u16,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let (status, tunnel) = connect_via(out.proxy_addr, &format!("{host}:{port}")).await;
    assert_eq!(status, 200);
    tls_connect(tunnel, &out.ca_pem, host).await.unwrap()
}

/// The two leaks of issue 11: a reflecting endpoint on the bound host, and a shared front end asked
/// for another host inside the bound host's intercepted connection. Neither gets the value: only the
/// bound field is substituted, and a request naming another host is answered 403 by the proxy and
/// never reaches the upstream (which records every byte it receives).
#[tokio::test]
async fn reflecting_and_fronting_requests_never_carry_the_value() {
    let ca = TestCa::new();
    // One front end serving both names, as a CDN does.
    let (front, received) = ca.recording_https_server(&["api.test", "evil.test"]).await;
    let mut h = egress(
        operator(
            &[front.port()],
            &[("api.test", "127.0.0.1"), ("evil.test", "127.0.0.1")],
        ),
        Some(ca.pem()),
    );
    let sb: SandboxId = "sb-front".parse().unwrap();
    let out = h
        .egress
        .add_sandbox(sb.clone(), policy(r#"{"allow":[{"domain":"*.test"}]}"#), LOOPBACK)
        .await
        .unwrap();
    h.egress.set_secrets(&sb, vec![secret("GH", "api.test")]).unwrap();
    let port = front.port();

    // A reflecting endpoint: the placeholder in every header it echoes; only Authorization carries
    // the value (which the endpoint may echo too: what injection cannot prevent).
    let mut tls = intercepted(&out, "api.test", port).await;
    let (status, seen) = request(
        &mut tls,
        "GET /echo HTTP/1.1\r\nHost: api.test\r\nX-Echo: paddock-secret:GH\r\nCookie: t=paddock-secret:GH\r\nUser-Agent: paddock-secret:GH\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    let seen = String::from_utf8(seen).unwrap();
    assert!(!seen.contains(VALUE), "{seen}");
    assert_eq!(seen.matches("paddock-secret:GH").count(), 3, "{seen}");
    drop(tls);
    assert!(h.next_connection().await.secrets_injected.is_empty());

    // Fronting: a Host header, an absolute-form URI, a second Host header, a port naming another
    // virtual host. Each is refused by the proxy on the spot.
    let attempts = [
        "GET /echo HTTP/1.1\r\nHost: evil.test\r\nAuthorization: Bearer paddock-secret:GH\r\n\r\n".to_owned(),
        "GET https://evil.test/echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer paddock-secret:GH\r\n\r\n".to_owned(),
        "GET /echo HTTP/1.1\r\nHost: api.test\r\nHost: evil.test\r\nAuthorization: Bearer paddock-secret:GH\r\n\r\n".to_owned(),
        format!("GET /echo HTTP/1.1\r\nHost: api.test:{}\r\nAuthorization: Bearer paddock-secret:GH\r\n\r\n", port + 1),
    ];
    for attempt in &attempts {
        let mut tls = intercepted(&out, "api.test", port).await;
        let (status, body) = request(&mut tls, attempt).await;
        let body = String::from_utf8(body).unwrap();
        assert_eq!(status, 403, "{attempt:?}: {body}");
        assert!(body.contains("paddock egress: request refused:"), "{body}");
        assert!(
            body.contains("the host this connection was opened to") || body.contains("Host headers"),
            "{body}"
        );
        drop(tls);
        let r = h.next_connection().await;
        assert!(r.allowed && r.secrets_injected.is_empty(), "{r:?}");
        assert_eq!(r.requests_refused.len(), 1, "{r:?}");
    }
    // A refused request ends the connection: a legitimate one after it is not smuggled through.
    let mut tls = intercepted(&out, "api.test", port).await;
    let (status, _) = request(&mut tls, &attempts[0]).await;
    assert_eq!(status, 403);
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut tls, &mut rest),
    )
    .await;
    assert!(rest.is_empty());
    drop(tls);
    h.next_connection().await;
    let upstream = String::from_utf8_lossy(&received.lock().unwrap()).into_owned();
    assert!(
        !upstream.contains(VALUE),
        "the front end received the value: {upstream}"
    );
    assert!(
        !upstream.contains("evil.test"),
        "a fronted request reached the front end: {upstream}"
    );

    // Bodies and query strings are never substituted for a header binding.
    let body = "token=paddock-secret:GH";
    let mut tls = intercepted(&out, "api.test", port).await;
    let (status, seen) = request(
        &mut tls,
        &format!(
            "POST /echo?t=paddock-secret:GH HTTP/1.1\r\nHost: api.test\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert_eq!(status, 200);
    let seen = String::from_utf8(seen).unwrap();
    assert!(
        seen.starts_with("POST /echo?t=paddock-secret:GH HTTP/1.1\r\n"),
        "{seen}"
    );
    assert!(seen.ends_with(body) && !seen.contains(VALUE), "{seen}");
}

/// A binding naming its own header and the query string: the value goes there (percent-encoded in
/// the query), and not into Authorization.
#[tokio::test]
async fn a_binding_names_its_fields() {
    let ca = TestCa::new();
    let api = ca.https_server(&["api.test"]).await;
    let mut h = egress(
        operator(&[api.port()], &[("api.test", "127.0.0.1")]),
        Some(ca.pem()),
    );
    let sb: SandboxId = "sb-fields".parse().unwrap();
    let out = h
        .egress
        .add_sandbox(
            sb.clone(),
            policy(r#"{"allow":[{"domain":"api.test"}]}"#),
            LOOPBACK,
        )
        .await
        .unwrap();
    let binding = SecretBinding::new(
        vec!["api.test".parse().unwrap()],
        Some(vec!["X-Api-Key".parse().unwrap()]),
        true,
    )
    .unwrap();
    let key = Secret::new("KEY".parse().unwrap(), Zeroizing::new("k&1 2".into()), binding).unwrap();
    h.egress.set_secrets(&sb, vec![key]).unwrap();
    let mut tls = intercepted(&out, "api.test", api.port()).await;
    let (_, seen) = request(
        &mut tls,
        "GET /q?key=paddock-secret:KEY&k2=paddock-secret%3AKEY HTTP/1.1\r\nHost: api.test\r\nX-Api-Key: paddock-secret:KEY\r\nAuthorization: paddock-secret:KEY\r\n\r\n",
    )
    .await;
    let seen = String::from_utf8(seen).unwrap();
    assert!(
        seen.starts_with("GET /q?key=k%261%202&k2=k%261%202 HTTP/1.1\r\n"),
        "{seen}"
    );
    assert!(seen.contains("x-api-key: k&1 2\r\n"), "{seen}");
    assert!(seen.contains("authorization: paddock-secret:KEY\r\n"), "{seen}");
    drop(tls);
    assert_eq!(h.next_connection().await.secrets_injected, vec!["KEY".to_owned()]);
}

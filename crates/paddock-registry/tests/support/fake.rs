//! A registry that lies, for what a real one never does: plain HTTP on 127.0.0.1, answering fixed
//! bodies by path (a blob longer than its descriptor says, a blob that does not hash right).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// A response: status, content type, body, and whether to announce its length (without it the
/// body runs to the connection's close).
#[derive(Clone)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub with_length: bool,
    /// Send the head and half the body, then nothing more for a minute.
    pub hang: bool,
}

impl Reply {
    pub fn ok(content_type: &'static str, body: Vec<u8>) -> Self {
        Self {
            status: 200,
            content_type,
            body,
            with_length: true,
            hang: false,
        }
    }
}

/// Serves `routes` (path → reply; anything else 404) on 127.0.0.1 until the runtime ends;
/// returns the port.
pub async fn serve(routes: HashMap<String, Reply>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let routes = Arc::new(routes);
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let routes = routes.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while head.first() != Some(&0x16)
                    && !head.windows(4).any(|w| w == b"\r\n\r\n")
                    && head.len() < 16384
                {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                if head.first() == Some(&0x16) {
                    return; // a TLS ClientHello: this registry speaks plain HTTP only
                }
                let line = String::from_utf8_lossy(&head);
                let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let reply = routes.get(&path).cloned().unwrap_or(Reply {
                    status: 404,
                    content_type: "application/json",
                    body: br#"{"errors":[{"code":"NOT_FOUND","message":"nope"}]}"#.to_vec(),
                    with_length: true,
                    hang: false,
                });
                let mut out = format!(
                    "HTTP/1.1 {} X\r\nContent-Type: {}\r\nConnection: close\r\n",
                    reply.status, reply.content_type
                );
                if reply.with_length {
                    out.push_str(&format!("Content-Length: {}\r\n", reply.body.len()));
                }
                out.push_str("\r\n");
                let _ = conn.write_all(out.as_bytes()).await;
                if reply.hang {
                    let _ = conn.write_all(&reply.body[..reply.body.len() / 2]).await;
                    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                    return;
                }
                let _ = conn.write_all(&reply.body).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    port
}

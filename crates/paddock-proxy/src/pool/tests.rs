use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::*;

const DEADLINE: Duration = Duration::from_secs(20);

/// A loopback HTTP/1.1 server (GETs only) counting the connections it accepted. `/close` answers
/// with `Connection: close`; `/drop` answers and then closes the connection without saying so;
/// `/big` answers 4 MiB; anything else `ok`. Connections are kept alive otherwise.
async fn upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&seen[..end]).into_owned();
                    seen.drain(..end + 4);
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let (body, extra) = match path.as_str() {
                        "/close" => (b"closing".to_vec(), "connection: close\r\n"),
                        "/drop" => (b"dropping".to_vec(), ""),
                        "/big" => (vec![b'x'; 4 << 20], ""),
                        _ => (b"ok".to_vec(), ""),
                    };
                    let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n{extra}\r\n", body.len());
                    if s.write_all(answer.as_bytes()).await.is_err() || s.write_all(&body).await.is_err() {
                        return;
                    }
                    if path == "/close" || path == "/drop" {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

fn fwd() -> Forward {
    Forward {
        client: None,
        proto: "http",
        host: None,
        path_and_query: None,
        strip: &[],
    }
}

fn get(path: &str) -> Request<http_body_util::Empty<Bytes>> {
    Request::builder()
        .uri(path)
        .header("host", "upstream.test")
        .body(http_body_util::Empty::new())
        .expect("request")
}

/// One request for `key`, its body read to the end.
async fn fetch(pool: &Pool<&'static str>, key: &'static str, addr: SocketAddr, path: &str) -> Bytes {
    let resp = forward_pooled(get(path), pool, key, || TcpStream::connect(addr), &fwd())
        .await
        .unwrap_or_else(|e| panic!("{path}: {e:?}"));
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.expect("body").to_bytes()
}

/// Waits until the pool holds `n` idle connections (a returned connection joins it in a task).
async fn idle(pool: &Pool<&'static str>, n: usize) {
    let end = Instant::now() + DEADLINE;
    while pool.idle_connections() != n {
        assert!(Instant::now() < end, "the pool never held {n} idle connections");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn sequential_requests_reuse_one_connection() {
    let (addr, accepted) = upstream().await;
    let pool = Pool::new(PoolLimits::default());
    for _ in 0..5 {
        assert_eq!(fetch(&pool, "a", addr, "/").await, "ok");
        idle(&pool, 1).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn keys_never_share_a_connection() {
    let (addr, accepted) = upstream().await;
    let pool = Pool::new(PoolLimits::default());
    fetch(&pool, "a", addr, "/").await;
    idle(&pool, 1).await;
    fetch(&pool, "b", addr, "/").await;
    idle(&pool, 2).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    fetch(&pool, "a", addr, "/").await;
    fetch(&pool, "b", addr, "/").await;
    idle(&pool, 2).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_connection_the_upstream_closes_is_not_reused() {
    let (addr, accepted) = upstream().await;
    let pool = Pool::new(PoolLimits::default());
    assert_eq!(fetch(&pool, "a", addr, "/close").await, "closing");
    assert_eq!(fetch(&pool, "a", addr, "/").await, "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    // An idle connection the upstream closed without a word is not used again.
    idle(&pool, 1).await;
    assert_eq!(fetch(&pool, "a", addr, "/drop").await, "dropping");
    // Seen closed, it leaves the pool.
    idle(&pool, 0).await;
    assert_eq!(fetch(&pool, "a", addr, "/").await, "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_body_dropped_before_its_end_takes_its_connection_along() {
    let (addr, accepted) = upstream().await;
    let pool = Pool::new(PoolLimits::default());
    let resp = forward_pooled(get("/big"), &pool, "a", || TcpStream::connect(addr), &fwd())
        .await
        .expect("forwarded");
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert!(first.is_data());
    drop(body);
    assert_eq!(pool.idle_connections(), 0);
    assert_eq!(fetch(&pool, "a", addr, "/").await, "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_pool_keeps_no_more_than_its_limits() {
    let (addr, accepted) = upstream().await;
    let limits = PoolLimits {
        per_key: 1,
        total: 2,
        idle: Duration::from_secs(60),
    };
    let pool = Pool::new(limits);
    // Three at once for one key: three connections, one kept.
    let (a, b, c) = tokio::join!(
        fetch(&pool, "a", addr, "/"),
        fetch(&pool, "a", addr, "/"),
        fetch(&pool, "a", addr, "/")
    );
    assert_eq!(
        (a, b, c),
        (Bytes::from("ok"), Bytes::from("ok"), Bytes::from("ok"))
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    idle(&pool, 1).await;
    for key in ["b", "c"] {
        fetch(&pool, key, addr, "/").await;
    }
    idle(&pool, 2).await;
    // Nothing idle survives an idle time of zero.
    let pool = Pool::new(PoolLimits {
        idle: Duration::ZERO,
        ..limits
    });
    fetch(&pool, "a", addr, "/").await;
    let before = accepted.load(Ordering::SeqCst);
    fetch(&pool, "a", addr, "/").await;
    assert_eq!(accepted.load(Ordering::SeqCst), before + 1);
    assert_eq!(pool.idle_connections(), 0);
}

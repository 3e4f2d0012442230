//! File operations, their error codes, ownership, and attempts to escape the root.

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use paddock_protocol::{ErrorCode, FileKind};
use paddock_runtime::agent_client::{AgentClientError, MkdirOptions, WriteOptions};

use crate::harness::{exists, require_root, TestAgent};

/// The error code of a call that must fail.
fn code<T: std::fmt::Debug>(result: Result<T, AgentClientError>) -> Option<ErrorCode> {
    result.expect_err("the call must fail").code()
}

const ROOT_PASSWD_START: &[u8] = b"root:x:0:0:root:/root:/bin/sh\n";

#[tokio::test]
async fn write_read_stat_list_and_rename() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    let data: Vec<u8> = (0..3 * 1024 * 1024 + 17).map(|i| (i % 253) as u8).collect();
    let options = WriteOptions {
        mode: Some(0o640),
        user: Some("user".into()),
        ..WriteOptions::default()
    };
    assert_eq!(
        client
            .write_file("/tmp/big.bin", &data, &options)
            .await
            .expect("write"),
        data.len() as u64
    );
    let host = agent.host_path("/tmp/big.bin");
    assert_eq!(std::fs::read(&host).expect("host read"), data);
    let meta = std::fs::metadata(&host).expect("metadata");
    assert_eq!(
        (meta.uid(), meta.gid(), meta.permissions().mode() & 0o777),
        (1000, 1000, 0o640)
    );

    let first = client.read_file("/tmp/big.bin", 0, None).await.expect("read");
    assert_eq!(first.data.len(), 1024 * 1024, "reads are capped at 1 MiB");
    assert_eq!(first.size, data.len() as u64);
    assert!(!first.eof);
    let last = client
        .read_file("/tmp/big.bin", 3 * 1024 * 1024, Some(100))
        .await
        .expect("read tail");
    assert_eq!(last.data, &data[3 * 1024 * 1024..]);
    assert!(last.eof);
    assert_eq!(
        client
            .read_file_to_end("/tmp/big.bin", 10 << 20)
            .await
            .expect("read all"),
        data
    );

    // Partial write without truncation, then with.
    let patch = WriteOptions {
        offset: 2,
        truncate: false,
        ..WriteOptions::default()
    };
    client
        .write_file("/tmp/small", b"hello", &WriteOptions::default())
        .await
        .expect("write");
    client
        .write_file("/tmp/small", b"LL", &patch)
        .await
        .expect("patch");
    assert_eq!(
        std::fs::read(agent.host_path("/tmp/small")).expect("read"),
        b"heLLo"
    );
    assert_eq!(
        std::fs::metadata(agent.host_path("/tmp/small"))
            .expect("meta")
            .uid(),
        0,
        "default user is root here"
    );
    client
        .write_file(
            "/tmp/small",
            b"x",
            &WriteOptions {
                offset: 1,
                ..WriteOptions::default()
            },
        )
        .await
        .expect("w");
    assert_eq!(std::fs::read(agent.host_path("/tmp/small")).expect("read"), b"hx");

    let stat = client.stat("/tmp/big.bin").await.expect("stat");
    assert_eq!(
        (stat.kind, stat.size, stat.mode, stat.uid),
        (FileKind::File, data.len() as u64, 0o640, 1000)
    );
    symlink("/tmp/big.bin", agent.host_path("/tmp/link")).expect("symlink");
    let stat = client.stat("/tmp/link").await.expect("lstat");
    assert_eq!(stat.kind, FileKind::Symlink);
    assert_eq!(stat.symlink_target.as_deref(), Some("/tmp/big.bin"));

    let names: Vec<String> = client
        .list_dir("/tmp")
        .await
        .expect("list")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["big.bin", "link", "small"]);
    client.rename("/tmp/small", "/tmp/renamed").await.expect("rename");
    assert!(exists(&agent.host_path("/tmp/renamed")) && !exists(&agent.host_path("/tmp/small")));
    assert_eq!(client.stat("/").await.expect("stat root").kind, FileKind::Dir);
}

#[tokio::test]
async fn relative_paths_start_at_the_default_users_home() {
    require_root!();
    let (agent, client) = TestAgent::start_with_default_user("user").await;
    client
        .write_file("notes.txt", b"hi", &WriteOptions::default())
        .await
        .expect("write");
    let host = agent.host_path("/home/user/notes.txt");
    assert_eq!(std::fs::read(&host).expect("read"), b"hi");
    assert_eq!(
        std::fs::metadata(&host).expect("meta").uid(),
        1000,
        "new files belong to the default user"
    );
    client
        .mkdir(
            "a/b/c",
            &MkdirOptions {
                parents: true,
                mode: Some(0o700),
                user: None,
            },
        )
        .await
        .expect("mkdir -p");
    let meta = std::fs::metadata(agent.host_path("/home/user/a/b/c")).expect("meta");
    assert_eq!((meta.uid(), meta.permissions().mode() & 0o777), (1000, 0o700));
    assert_eq!(
        std::fs::metadata(agent.host_path("/home/user/a"))
            .expect("meta")
            .uid(),
        1000
    );
}

#[tokio::test]
async fn error_codes_name_the_problem() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    std::fs::create_dir_all(agent.host_path("/d/sub")).expect("mkdir");
    std::fs::write(agent.host_path("/d/file"), b"x").expect("write");

    let err = client.read_file("/missing", 0, None).await.expect_err("missing");
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    assert!(
        format!("{:?}", err).contains("/missing"),
        "message names the path: {err:?}"
    );
    assert_eq!(
        code(client.mkdir("/d", &MkdirOptions::default()).await),
        Some(ErrorCode::AlreadyExists)
    );
    client
        .mkdir(
            "/d",
            &MkdirOptions {
                parents: true,
                ..Default::default()
            },
        )
        .await
        .expect("mkdir -p of an existing dir");
    assert_eq!(
        code(client.mkdir("/d/file/x", &MkdirOptions::default()).await),
        Some(ErrorCode::NotADirectory)
    );
    assert_eq!(
        code(client.read_file("/d/file/x", 0, None).await),
        Some(ErrorCode::NotADirectory)
    );
    assert_eq!(
        code(client.read_file("/d", 0, None).await),
        Some(ErrorCode::IsADirectory)
    );
    assert_eq!(
        code(client.remove("/d", false).await),
        Some(ErrorCode::DirectoryNotEmpty)
    );
    assert_eq!(code(client.remove("/", true).await), Some(ErrorCode::InvalidPath));
    assert_eq!(
        code(client.remove("/d/..", true).await),
        Some(ErrorCode::InvalidPath)
    );
    assert_eq!(code(client.stat("").await), Some(ErrorCode::InvalidPath));
    assert_eq!(
        code(client.list_dir("/d/file").await),
        Some(ErrorCode::NotADirectory)
    );
    let write = WriteOptions {
        user: Some("ghost".into()),
        ..WriteOptions::default()
    };
    assert_eq!(
        code(client.write_file("/new", b"x", &write).await),
        Some(ErrorCode::UnknownUser)
    );
    client.remove("/d", true).await.expect("recursive remove");
    assert!(!exists(&agent.host_path("/d")));
}

#[tokio::test]
async fn paths_cannot_escape_the_root() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    let outside = tempfile::tempdir().expect("outside dir");
    std::fs::write(outside.path().join("precious"), b"keep me").expect("write");

    // `..` stops at the root: this is the root's own passwd, and a write lands inside.
    let passwd = client.read_file("../../etc/passwd", 0, None).await.expect("read");
    assert!(
        passwd.data.starts_with(ROOT_PASSWD_START),
        "read the sandbox passwd"
    );
    let name = format!("paddock-escape-{}", std::process::id());
    client
        .write_file(&format!("../../../etc/{name}"), b"x", &WriteOptions::default())
        .await
        .expect("write");
    assert!(
        exists(&agent.host_path(&format!("/etc/{name}"))),
        "write landed inside the root"
    );
    assert!(
        !exists(&Path::new("/etc").join(&name)),
        "write escaped to the host's /etc"
    );

    // An absolute symlink resolves inside the root.
    symlink("/etc", agent.host_path("/x")).expect("symlink");
    let via_link = client
        .read_file("/x/passwd", 0, None)
        .await
        .expect("read via symlink");
    assert!(via_link.data.starts_with(ROOT_PASSWD_START));
    client
        .write_file(&format!("/x/{name}-2"), b"x", &WriteOptions::default())
        .await
        .expect("write via symlink");
    assert!(exists(&agent.host_path(&format!("/etc/{name}-2"))));
    assert!(!exists(&Path::new("/etc").join(format!("{name}-2"))));

    // A `..` chain symlink, and one pointing at an absolute host directory.
    std::fs::create_dir_all(agent.host_path("/a/b")).expect("mkdir");
    symlink("../../../../../../../../..", agent.host_path("/a/b/up")).expect("symlink");
    let via_up = client
        .read_file("/a/b/up/etc/passwd", 0, None)
        .await
        .expect("read via .. chain");
    assert!(via_up.data.starts_with(ROOT_PASSWD_START));
    symlink(outside.path(), agent.host_path("/out")).expect("symlink");
    let err = client
        .read_file("/out/precious", 0, None)
        .await
        .expect_err("host dir is not inside the root");
    assert_eq!(err.code(), Some(ErrorCode::NotFound));

    // Magic links: /proc/self/root, directly and through a symlink.
    let err = client
        .read_file("/proc/self/root/etc/passwd", 0, None)
        .await
        .expect_err("no /proc in the root");
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    symlink("/proc/self/root", agent.host_path("/pr")).expect("symlink");
    let err = client
        .write_file("/pr/tmp/escape", b"x", &WriteOptions::default())
        .await
        .expect_err("magic link");
    assert!(
        matches!(err.code(), Some(ErrorCode::NotFound | ErrorCode::InvalidPath)),
        "{err:?}"
    );

    // Renames and mkdirs through symlinks also stay inside.
    client
        .rename(&format!("/x/{name}-2"), "/x/../moved")
        .await
        .expect("rename");
    assert!(exists(&agent.host_path("/moved")));
    client
        .mkdir("/x/newdir", &MkdirOptions::default())
        .await
        .expect("mkdir via symlink");
    assert!(exists(&agent.host_path("/etc/newdir")) && !exists(Path::new("/etc/newdir-should-not-exist")));

    // Recursive removal unlinks symlinks, never follows them.
    std::fs::create_dir_all(agent.host_path("/t/sub")).expect("mkdir");
    symlink(outside.path(), agent.host_path("/t/link")).expect("symlink");
    symlink(outside.path(), agent.host_path("/t/sub/link")).expect("symlink");
    client.remove("/t", true).await.expect("remove tree");
    assert!(!exists(&agent.host_path("/t")));
    assert!(
        outside.path().join("precious").exists(),
        "remove followed a symlink out of the root"
    );
    // Removing the symlink to outside removes the link only.
    client.remove("/out", true).await.expect("remove link");
    assert!(outside.path().join("precious").exists());
    assert!(std::fs::read_dir(outside.path()).expect("outside").count() == 1);
}

#[tokio::test]
async fn large_directories_are_listed_in_pages() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    let dir = agent.host_path("/many");
    std::fs::create_dir(&dir).expect("mkdir");
    let long = "n".repeat(150);
    for i in 0..1500 {
        std::fs::write(dir.join(format!("{i:05}-{long}")), b"").expect("create");
    }
    let entries = client.list_dir("/many").await.expect("list");
    assert_eq!(entries.len(), 1500);
    assert!(entries.windows(2).all(|w| w[0].name < w[1].name), "sorted");
    assert!(entries.iter().all(|e| e.kind == FileKind::File && e.size == 0));
}

//! `paddock sandbox cp SRC DST`, exactly one side being `ID:/path`. A file travels as its bytes
//! (`GET`/`PUT .../files`), a directory as a tar stream (`GET`/`PUT .../files/tar`) built or unpacked
//! here with the `tar` crate. Both are streamed: nothing holds a whole file in memory. As with cp(1),
//! copying to an existing directory puts the source inside it under its own name.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::task::{Context as TaskContext, Poll};

use anyhow::Context;
use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use paddock_types::api::{FileEntry, FileKindBody};
use reqwest::{Body, Method};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::io::{ReaderStream, StreamReader, SyncIoBridge};

use super::{ApiClient, ApiFailure};
use crate::cli::CpArgs;

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A path on this host.
    Local(PathBuf),
    /// `-`: stdin as a source, stdout as a destination (files only).
    Stdio,
    /// `ID:/path` inside a sandbox.
    Remote { id: String, path: String },
}

/// Parses a `cp` operand: `-`, `ID:/absolute/path`, or a local path. A sandbox id never contains `/`,
/// so a local path with a colon can always be written unambiguously (`./name:/x`).
pub fn parse_location(s: &str) -> Location {
    if s == "-" {
        return Location::Stdio;
    }
    if let Some((id, path)) = s.split_once(':') {
        if !id.is_empty() && !id.contains('/') && path.starts_with('/') {
            return Location::Remote {
                id: id.to_owned(),
                path: path.to_owned(),
            };
        }
    }
    Location::Local(PathBuf::from(s))
}

/// `dir/name` for a remote directory path.
fn remote_join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// The last component of a remote path (`""` for `/`).
fn remote_name(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

pub async fn copy(client: &ApiClient, args: CpArgs) -> anyhow::Result<ExitCode> {
    let src = parse_location(&args.src);
    let dst = parse_location(&args.dst);
    match (src, dst) {
        (Location::Remote { id, path }, local @ (Location::Local(_) | Location::Stdio)) => {
            download(client, &id, &path, &local).await?
        }
        (local @ (Location::Local(_) | Location::Stdio), Location::Remote { id, path }) => {
            upload(client, &local, &id, &path).await?
        }
        _ => {
            return Err(crate::UsageError::new(
                "exactly one of SRC and DST must be a sandbox path, written ID:/path",
            )
            .into())
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn stat(client: &ApiClient, id: &str, path: &str) -> anyhow::Result<Option<FileEntry>> {
    let request = client
        .request(Method::GET, &["v1", "sandboxes", id, "files", "stat"])
        .query(&[("path", path)]);
    match client.json::<FileEntry>(request).await {
        Ok(entry) => Ok(Some(entry)),
        Err(e)
            if e.downcast_ref::<ApiFailure>()
                .is_some_and(|f| f.code == "file_not_found") =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

async fn upload(client: &ApiClient, src: &Location, id: &str, dst: &str) -> anyhow::Result<()> {
    let Location::Local(src) = src else {
        // stdin: the bytes go to exactly the path given.
        let body = Body::wrap_stream(ReaderStream::with_capacity(tokio::io::stdin(), 64 * 1024));
        return put_file(client, id, dst, None, body).await;
    };
    let meta = tokio::fs::metadata(src)
        .await
        .with_context(|| format!("cannot read {}", src.display()))?;
    let remote = stat(client, id, dst).await?;
    let into_dir = dst.ends_with('/') || remote.as_ref().is_some_and(|e| e.kind == FileKindBody::Dir);
    let target = match (into_dir, src.file_name()) {
        (true, Some(name)) => remote_join(dst, &name.to_string_lossy()),
        _ => dst.to_owned(),
    };
    if meta.is_dir() {
        let progress = Progress::new(None);
        let body = tar_stream(src.to_owned(), progress.clone());
        client
            .send(
                client
                    .request(Method::PUT, &["v1", "sandboxes", id, "files", "tar"])
                    .query(&[("path", target.as_str())])
                    .header(reqwest::header::CONTENT_TYPE, "application/x-tar")
                    .body(body),
            )
            .await?;
        progress.finish();
        Ok(())
    } else if meta.is_file() {
        let file = tokio::fs::File::open(src)
            .await
            .with_context(|| format!("cannot open {}", src.display()))?;
        let progress = Progress::new(Some(meta.len()));
        let counted = progress.clone();
        let stream =
            ReaderStream::with_capacity(file, 64 * 1024).inspect_ok(move |chunk| counted.inc(chunk.len()));
        let mode = format!("{:o}", meta.permissions().mode() & 0o7777);
        put_file(client, id, &target, Some(mode), Body::wrap_stream(stream)).await?;
        progress.finish();
        Ok(())
    } else {
        anyhow::bail!("{} is neither a file nor a directory", src.display())
    }
}

async fn put_file(
    client: &ApiClient,
    id: &str,
    path: &str,
    mode: Option<String>,
    body: Body,
) -> anyhow::Result<()> {
    let mut query = vec![("path", path.to_owned())];
    if let Some(mode) = mode {
        query.push(("mode", mode));
    }
    client
        .send(
            client
                .request(Method::PUT, &["v1", "sandboxes", id, "files"])
                .query(&query)
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .body(body),
        )
        .await?;
    Ok(())
}

async fn download(client: &ApiClient, id: &str, src: &str, dst: &Location) -> anyhow::Result<()> {
    let Some(entry) = stat(client, id, src).await? else {
        return Err(
            ApiFailure::new("file_not_found", format!("{src} does not exist in sandbox {id}")).into(),
        );
    };
    let local = match dst {
        Location::Local(p) => Some(p.as_path()),
        _ => None,
    };
    let target = local.map(|dst| {
        let name = remote_name(src);
        if dst.is_dir() && !name.is_empty() {
            dst.join(name)
        } else {
            dst.to_owned()
        }
    });
    if entry.kind == FileKindBody::Dir {
        let Some(target) = target else {
            return Err(crate::UsageError::new(format!(
                "{src} is a directory: copy it to a local directory, not -"
            ))
            .into());
        };
        return download_dir(client, id, src, &target).await;
    }
    let response = client
        .send(
            client
                .request(Method::GET, &["v1", "sandboxes", id, "files"])
                .query(&[("path", src)]),
        )
        .await?;
    let progress = Progress::new(Some(entry.size));
    let mut body = response.bytes_stream();
    let mut out: Pin<Box<dyn tokio::io::AsyncWrite + Send>> = match &target {
        Some(path) => Box::pin(
            tokio::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(entry.mode & 0o777)
                .open(path)
                .await
                .with_context(|| format!("cannot create {}", path.display()))?,
        ),
        None => Box::pin(tokio::io::stdout()),
    };
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("the download broke off")?;
        out.write_all(&chunk).await.context("failed to write the copy")?;
        progress.inc(chunk.len());
    }
    out.flush().await.context("failed to write the copy")?;
    progress.finish();
    Ok(())
}

async fn download_dir(client: &ApiClient, id: &str, src: &str, target: &Path) -> anyhow::Result<()> {
    match tokio::fs::create_dir(target).await {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && target.is_dir() => {}
        Err(e) => return Err(anyhow::Error::new(e).context(format!("cannot create {}", target.display()))),
    }
    let response = client
        .send(
            client
                .request(Method::GET, &["v1", "sandboxes", id, "files", "tar"])
                .query(&[("path", src)])
                .header(reqwest::header::ACCEPT, "application/x-tar"),
        )
        .await?;
    let progress = Progress::new(None);
    let counted = progress.clone();
    let stream = response
        .bytes_stream()
        .map_err(io::Error::other)
        .inspect_ok(move |chunk| counted.inc(chunk.len()));
    let reader = SyncIoBridge::new(StreamReader::new(stream));
    let target = target.to_owned();
    tokio::task::spawn_blocking(move || {
        // `unpack` refuses entries that would land outside `target` (`..`, absolute paths, symlinks
        // pointing out), so an archive from inside a sandbox cannot write elsewhere on this host.
        let mut archive = tar::Archive::new(reader);
        archive.set_overwrite(true);
        archive
            .unpack(&target)
            .with_context(|| format!("failed to unpack the archive into {}", target.display()))
    })
    .await
    .context("the unpacking task failed")??;
    progress.finish();
    Ok(())
}

/// A tar archive of `dir`'s contents, built on a blocking thread as the upload consumes it.
fn tar_stream(dir: PathBuf, progress: Progress) -> Body {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(4);
    tokio::task::spawn_blocking(move || {
        let writer = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK),
            progress,
        };
        let mut builder = tar::Builder::new(writer);
        builder.follow_symlinks(false);
        let result = builder
            .append_dir_all(".", &dir)
            .and_then(|()| builder.into_inner())
            .and_then(|mut w| w.flush_chunk());
        if let Err(e) = result {
            let e = io::Error::new(e.kind(), format!("cannot archive {}: {e}", dir.display()));
            let _ = tx.blocking_send(Err(e));
        }
    });
    Body::wrap_stream(ChannelBody(rx))
}

const CHUNK: usize = 64 * 1024;

/// Collects the archive into chunks and hands them to the upload.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
    progress: Progress,
}

impl ChannelWriter {
    fn flush_chunk(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.progress.inc(chunk.len());
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the upload stopped"))
    }
}

impl io::Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush_chunk()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The receiving end of a [`ChannelWriter`] as a request body.
struct ChannelBody(mpsc::Receiver<io::Result<Bytes>>);

impl Stream for ChannelBody {
    type Item = io::Result<Bytes>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// A progress bar on stderr, when stderr is a terminal; nothing otherwise.
#[derive(Debug, Clone)]
struct Progress(Option<ProgressBar>);

impl Progress {
    /// A bar for `total` bytes, or a byte counter when the total is unknown.
    fn new(total: Option<u64>) -> Self {
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            return Self(None);
        }
        let (bar, template) = match total {
            Some(n) => (
                ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
                "{wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} {eta}",
            ),
            None => (
                ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
                "{spinner} {bytes} {binary_bytes_per_sec}",
            ),
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        Self(Some(bar))
    }

    fn inc(&self, n: usize) {
        if let Some(bar) = &self.0 {
            bar.inc(n as u64);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(id: &str, path: &str) -> Location {
        Location::Remote {
            id: id.into(),
            path: path.into(),
        }
    }

    #[test]
    fn locations() {
        assert_eq!(
            parse_location("abc123:/home/user/x"),
            remote("abc123", "/home/user/x")
        );
        assert_eq!(parse_location("abc:/"), remote("abc", "/"));
        assert_eq!(parse_location("-"), Location::Stdio);
        assert_eq!(parse_location("./a:/b"), Location::Local("./a:/b".into()));
        assert_eq!(parse_location("a:b"), Location::Local("a:b".into()));
        assert_eq!(parse_location(":/x"), Location::Local(":/x".into()));
        assert_eq!(parse_location("/tmp/file"), Location::Local("/tmp/file".into()));
        assert_eq!(parse_location("dir/a:/b"), Location::Local("dir/a:/b".into()));
    }

    #[test]
    fn remote_paths() {
        assert_eq!(remote_join("/home/user", "f"), "/home/user/f");
        assert_eq!(remote_join("/home/user/", "f"), "/home/user/f");
        assert_eq!(remote_name("/home/user/dir/"), "dir");
        assert_eq!(remote_name("/etc/hosts"), "hosts");
        assert_eq!(remote_name("/"), "");
    }

    #[test]
    fn tar_stream_round_trips() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let src = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(src.path().join("sub")).expect("mkdir");
        std::fs::write(src.path().join("sub/a.txt"), "hello").expect("write");
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(src.path().join("big.bin"), &big).expect("write");
        std::os::unix::fs::symlink("sub/a.txt", src.path().join("link")).expect("symlink");
        let archive = rt.block_on(async {
            let (tx, rx) = mpsc::channel(4);
            let dir = src.path().to_owned();
            tokio::task::spawn_blocking(move || {
                let mut builder = tar::Builder::new(ChannelWriter {
                    tx,
                    buf: Vec::new(),
                    progress: Progress(None),
                });
                builder.follow_symlinks(false);
                builder.append_dir_all(".", &dir).expect("archive");
                builder
                    .into_inner()
                    .expect("finish")
                    .flush_chunk()
                    .expect("flush");
            });
            let chunks: Vec<_> = ChannelBody(rx).collect().await;
            chunks
                .into_iter()
                .flat_map(|c| c.expect("chunk").to_vec())
                .collect::<Vec<u8>>()
        });
        let dst = tempfile::tempdir().expect("tempdir");
        tar::Archive::new(&archive[..])
            .unpack(dst.path())
            .expect("unpack");
        assert_eq!(
            std::fs::read_to_string(dst.path().join("sub/a.txt")).expect("read"),
            "hello"
        );
        assert_eq!(std::fs::read(dst.path().join("big.bin")).expect("read"), big);
        assert_eq!(
            std::fs::read_link(dst.path().join("link")).expect("readlink"),
            PathBuf::from("sub/a.txt")
        );
    }
}

//! `Prefetch`: read files into the page cache before a sandbox is handed out. A sandbox's files
//! are its own copies of its template's (a btrfs snapshot shares extents, not cached pages), so
//! the first command of a fresh sandbox otherwise reads its program, loader and libraries from
//! disk. The host asks this of warm sandboxes, whose reads then cost a request nothing. It also
//! reads the agent's own state the first spawn needs (`paddock_sys::reap::prepare_spawns`).
//!
//! What it does not do: follow a path out of the sandbox root (paths resolve inside it, as every
//! file request's), open anything but regular files for reading (a FIFO is opened non-blocking and
//! skipped), or read without bounds: at most [`MAX_PATHS`] paths, [`MAX_FILE_BYTES`] of each and
//! [`MAX_TOTAL_BYTES`] in all (the protocol's `PREFETCH_*` bounds). The bytes read are charged to the sandbox's own memory cgroup.

use std::io::Read;
use std::path::Path;

use paddock_protocol::{ErrorCode, Reply};

use crate::agent::Agent;
use crate::error_code::agent_error;
use crate::outbound::Answer;

use paddock_protocol::{
    PREFETCH_MAX_FILE_BYTES as MAX_FILE_BYTES, PREFETCH_MAX_PATHS as MAX_PATHS,
    PREFETCH_MAX_TOTAL_BYTES as MAX_TOTAL_BYTES,
};

/// Answers `Prefetch { paths }`.
pub(crate) fn prefetch(agent: &Agent, paths: &[String]) -> Answer {
    if paths.len() > MAX_PATHS {
        return Err(agent_error(
            ErrorCode::BadRequest,
            format!("at most {MAX_PATHS} paths may be prefetched at once"),
        ));
    }
    // What the first spawn would otherwise read; a failure shows again at that spawn.
    let _ = paddock_sys::reap::prepare_spawns();
    let mut buf = vec![0u8; 128 << 10];
    let (mut files, mut total) = (0u32, 0u64);
    for path in paths {
        if total >= MAX_TOTAL_BYTES {
            break;
        }
        if !path.starts_with('/') || path.contains('\0') {
            continue;
        }
        let Ok(file) = agent.root.open_read(Path::new(path)) else {
            continue;
        };
        if !file.metadata().is_ok_and(|m| m.file_type().is_file()) {
            continue;
        }
        let limit = MAX_FILE_BYTES.min(MAX_TOTAL_BYTES - total);
        let mut reader = file.take(limit);
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        files += 1;
    }
    Ok((Reply::Prefetched { files, bytes: total }, Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_sys::fs_in_root::Root;

    fn agent_in(root: &Path) -> Agent {
        Agent::new(
            Root::open(root).expect("root"),
            root.to_path_buf(),
            "root".to_owned(),
        )
    }

    #[test]
    fn reads_regular_files_inside_the_root_and_skips_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("bin")).expect("bin");
        std::fs::write(root.join("bin/busybox"), vec![7u8; 300_000]).expect("busybox");
        std::os::unix::fs::symlink("busybox", root.join("bin/sh")).expect("sh");
        // A link out of the root resolves inside it (to the sandbox's own /etc/passwd).
        std::fs::create_dir_all(root.join("etc")).expect("etc");
        std::fs::write(root.join("etc/passwd"), b"root:x:0:0::/root:/bin/sh\n").expect("passwd");
        std::os::unix::fs::symlink("/../../../../etc/passwd", root.join("bin/escape")).expect("escape");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            root.join("fifo"),
            rustix::fs::Mode::from_raw_mode(0o644),
        )
        .expect("fifo");
        let agent = agent_in(root);
        let paths: Vec<String> = [
            "/bin/sh",
            "/bin/escape",
            "/fifo",
            "/bin",
            "/missing",
            "relative",
            "/bin/busybox",
        ]
        .iter()
        .map(|p| (*p).to_owned())
        .collect();
        let (reply, _) = prefetch(&agent, &paths).expect("prefetch");
        assert_eq!(
            reply,
            Reply::Prefetched {
                files: 3,
                bytes: 300_000 * 2 + 26
            }
        );
    }

    #[test]
    fn too_many_paths_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let agent = agent_in(dir.path());
        let paths = vec!["/x".to_owned(); MAX_PATHS + 1];
        let err = prefetch(&agent, &paths).expect_err("too many");
        assert_eq!(err.code, ErrorCode::BadRequest);
    }
}

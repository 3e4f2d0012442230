//! `tar` in the two forms the control plane runs inside a sandbox: `tar -C DIR -cf - .` (the
//! directory as an archive on stdout, for file downloads) and `tar -C DIR -xf - ...` (stdin
//! unpacked into the directory as the process's user, for uploads). The archive format is the fake's
//! snapshot export's (`transfer.rs`). Other options are ignored; other modes are refused.

use super::commands::os_text;
use super::{Io, Shell};
use crate::fake::transfer;
use crate::ImportLimits;

/// The largest archive `tar -x` takes (the fake holds it in memory while unpacking).
const MAX_ARCHIVE: u64 = 256 << 20;

/// `tar -C DIR -cf - .` (write DIR as an archive to stdout) and `tar -C DIR -xf - [...]` (unpack
/// stdin into DIR), over the sandbox's files; the archive format is the snapshot exports'.
pub(crate) async fn tar(shell: &mut Shell, args: &[String], io: &mut Io) -> i32 {
    let mut dir = shell.ctx().cwd.clone();
    let mut mode = None;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-C" => {
                dir = shell.absolute(args.get(i + 1).map_or("", String::as_str));
                i += 1;
            }
            "-cf" | "-xf" => {
                if args.get(i + 1).map(String::as_str) != Some("-") {
                    shell
                        .say(&io.err, "tar: only `-f -` is supported by the fake agent\n")
                        .await;
                    return 2;
                }
                mode = Some(args[i].clone());
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    match mode.as_deref() {
        Some("-cf") => {
            let tree = match shell.ctx().agent.read_fs(|fs| fs.subtree(&dir)) {
                Ok(tree) => tree,
                Err(e) => {
                    shell.say(&io.err, &format!("tar: {dir}: {}\n", os_text(e))).await;
                    return 2;
                }
            };
            let mut archive = Vec::new();
            if let Err(e) = transfer::write_tree(&tree, &Default::default(), &mut archive) {
                shell.say(&io.err, &format!("tar: {e}\n")).await;
                return 2;
            }
            for chunk in archive.chunks(64 * 1024) {
                if !shell.emit(&io.out, chunk).await {
                    return 2;
                }
            }
            0
        }
        Some("-xf") => {
            let mut archive = Vec::new();
            while let Some(chunk) = shell.read_input(&mut io.input).await {
                if archive.len() as u64 + chunk.len() as u64 > MAX_ARCHIVE {
                    let message =
                        format!("tar: the fake agent unpacks archives of at most {MAX_ARCHIVE} bytes\n");
                    shell.say(&io.err, &message).await;
                    return 2;
                }
                archive.extend_from_slice(&chunk);
            }
            let limits = ImportLimits {
                max_bytes: MAX_ARCHIVE,
                ..ImportLimits::default()
            };
            let tree = match transfer::read_tree(&mut archive.as_slice(), &limits, false) {
                Ok((tree, _)) => tree,
                Err(e) => {
                    shell.say(&io.err, &format!("tar: {e}\n")).await;
                    return 2;
                }
            };
            let (_, uid, gid) = shell.owner();
            let tree = transfer::owned_by(tree, uid, gid);
            match shell.ctx().agent.change_fs(|fs| fs.merge(&dir, tree)) {
                Ok(()) => 0,
                Err(e) => {
                    shell.say(&io.err, &format!("tar: {dir}: {}\n", os_text(e))).await;
                    2
                }
            }
        }
        _ => {
            shell
                .say(&io.err, "tar: the fake agent supports `-cf -` and `-xf -` only\n")
                .await;
            2
        }
    }
}

//! The file tools beyond reading and writing one file: a path's metadata, making a directory,
//! removing and moving a path, and the line ranges `file_read` returns of a long text file. Each
//! a thin translation onto the service, as in `tools.rs`.
//!
//! What it does not do: follow symlinks (`file_stat` describes the link itself), change owners or
//! permission bits, or scan more than [`MAX_LINE_SCAN`] bytes of a file for a line range (past
//! them, `run_command` with `sed -n` reads on).

use futures_util::StreamExt as _;
use paddock_control::Principal;
use paddock_types::api::{FileEntry, MkdirRequest, RenameRequest};
use paddock_types::SandboxId;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, Json, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tools::{complete_utf8_len, failure, sandbox_id, wire_name, FileContent, MAX_FILE_READ};
use crate::PaddockMcp;

/// Bytes of a file `file_read` reads through for a line range and its line count.
pub const MAX_LINE_SCAN: u64 = 64 << 20;

/// Arguments naming one path of a sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FilePathArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path inside the sandbox.
    pub path: String,
}

/// `file_mkdir`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileMkdirArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path of the directory to make.
    pub path: String,
    /// Make missing parent directories too, and succeed if it exists already (default true).
    #[serde(default = "yes")]
    pub parents: bool,
}

/// `file_remove`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileRemoveArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path of the file or directory to remove.
    pub path: String,
    /// Remove a directory with everything in it (default false: only an empty one).
    #[serde(default)]
    pub recursive: bool,
}

/// `file_move`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileMoveArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path of the file or directory to move.
    pub from: String,
    /// Its new absolute path; a file already there is replaced.
    pub to: String,
}

/// A path's metadata.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileInfo {
    /// Its absolute path.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its permission bits in octal, e.g. `0644`.
    pub mode: String,
    /// Its owner's uid inside the sandbox.
    pub uid: u32,
    /// Its group's gid inside the sandbox.
    pub gid: u32,
    /// When it was last modified (RFC 3339).
    pub modified_at: String,
    /// Where a symlink points.
    pub symlink_target: Option<String>,
}

/// `file_remove`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Removed {
    /// The path removed.
    pub path: String,
}

fn yes() -> bool {
    true
}

fn file_info(entry: FileEntry) -> FileInfo {
    FileInfo {
        path: entry.path,
        kind: wire_name(entry.kind),
        size: entry.size,
        mode: format!("{:04o}", entry.mode),
        uid: entry.uid,
        gid: entry.gid,
        modified_at: entry.modified_at,
        symlink_target: entry.symlink_target,
    }
}

/// The lines of a text in a range, taken as its bytes stream by: whole lines while they fit in
/// [`MAX_FILE_READ`] bytes (the start of the first one when it alone does not), and the count of
/// lines seen.
#[derive(Debug)]
pub(crate) struct LineSelection {
    first: u64,
    last: u64,
    /// The line the next byte belongs to (1-based).
    line: u64,
    /// Whether that line has bytes already.
    partial: bool,
    /// Where that line starts in `out`.
    line_start: usize,
    out: Vec<u8>,
    /// The last line (partly) in `out`; `first - 1` while none is.
    end: u64,
    /// Lines of the range did not fit.
    full: bool,
}

/// What a [`LineSelection`] took.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Selected {
    pub(crate) bytes: Vec<u8>,
    /// The last line among them (`first - 1`: none).
    pub(crate) end: u64,
    /// The text's number of lines, when all of it was seen.
    pub(crate) total: Option<u64>,
    /// Whether lines of the range were left out (or not reached).
    pub(crate) truncated: bool,
}

impl LineSelection {
    /// Lines `first..=last` (1-based, inclusive; `first` at least 1).
    pub(crate) fn new(first: u64, last: u64) -> Self {
        Self {
            first,
            last,
            line: 1,
            partial: false,
            line_start: 0,
            out: Vec::new(),
            end: first.saturating_sub(1),
            full: false,
        }
    }

    /// Takes the text's next bytes; false once no more fit.
    pub(crate) fn push(&mut self, data: &[u8]) -> bool {
        for piece in data.split_inclusive(|b| *b == b'\n') {
            if (self.first..=self.last).contains(&self.line) {
                let room = MAX_FILE_READ - self.out.len();
                if piece.len() > room {
                    self.full = true;
                    if self.line_start > 0 {
                        self.out.truncate(self.line_start);
                        self.end = self.line - 1;
                    } else {
                        self.out.extend_from_slice(&piece[..room]);
                        self.out.truncate(complete_utf8_len(&self.out));
                        self.end = self.line;
                    }
                    return false;
                }
                self.out.extend_from_slice(piece);
                self.end = self.line;
            }
            if piece.ends_with(b"\n") {
                self.line += 1;
                self.partial = false;
                self.line_start = self.out.len();
            } else {
                self.partial = true;
            }
        }
        true
    }

    /// What was taken; `complete`: every byte of the text was pushed.
    pub(crate) fn finish(self, complete: bool) -> Selected {
        Selected {
            truncated: self.full || (!complete && self.line <= self.last),
            total: complete.then(|| self.line - 1 + u64::from(self.partial)),
            end: self.end,
            bytes: self.out,
        }
    }
}

/// The number of lines of `text` (a last line without a newline counts).
pub(crate) fn count_lines(text: &[u8]) -> u64 {
    let newlines = text.iter().filter(|b| **b == b'\n').count() as u64;
    newlines + u64::from(!text.is_empty() && !text.ends_with(b"\n"))
}

impl PaddockMcp {
    /// Lines `start..=end` of a text file (`file_read` with a range), and its line count when the
    /// read reached its end.
    pub(crate) async fn read_lines(
        &self,
        p: &Principal,
        id: &SandboxId,
        path: &str,
        start: Option<u64>,
        end: Option<u64>,
    ) -> Result<FileContent, String> {
        let first = start.unwrap_or(1);
        let last = end.unwrap_or(u64::MAX);
        if first == 0 {
            return Err("invalid_request: start_line: lines count from 1".to_owned());
        }
        if last < first {
            return Err("invalid_request: end_line: before start_line".to_owned());
        }
        let mut download = self.service.read_file(p, id, path).await.map_err(failure)?;
        let mut lines = LineSelection::new(first, last);
        let mut scanned = 0u64;
        let mut complete = true;
        while let Some(chunk) = download.stream.next().await {
            let chunk = chunk.map_err(|e| format!("io: reading {path}: {e}"))?;
            scanned += chunk.len() as u64;
            if !lines.push(&chunk) || scanned >= MAX_LINE_SCAN {
                complete = false;
                break;
            }
        }
        let selected = lines.finish(complete);
        if selected.end < first && !complete {
            return Err(format!(
                "invalid_request: start_line: line {first} is past the first {MAX_LINE_SCAN} bytes of {path}; read it with run_command (sed -n)"
            ));
        }
        let content = String::from_utf8(selected.bytes).map_err(|_| {
            format!(
                "invalid_request: start_line: {path} is not UTF-8 text; read it whole (as base64) without start_line and end_line"
            )
        })?;
        Ok(FileContent {
            content,
            encoding: "utf-8".to_owned(),
            size: download.size,
            truncated: selected.truncated,
            start_line: Some(first),
            end_line: Some(selected.end),
            total_lines: selected.total,
        })
    }
}

#[tool_router(router = files_router, vis = "pub(crate)")]
impl PaddockMcp {
    #[tool(
        name = "file_stat",
        description = "Show a path's metadata in a sandbox: kind (file, dir, symlink), size, permission bits, owner, modification time. A symlink is described, not followed.",
        annotations(read_only_hint = true, idempotent_hint = true)
    )]
    async fn file_stat(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<FilePathArgs>,
    ) -> Result<Json<FileInfo>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let entry = self
            .service
            .stat_file(&p, &id, &args.path)
            .await
            .map_err(failure)?;
        Ok(Json(file_info(entry)))
    }

    #[tool(
        name = "file_mkdir",
        description = "Make a directory in a sandbox (with its missing parents unless parents is false).",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true)
    )]
    async fn file_mkdir(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<FileMkdirArgs>,
    ) -> Result<Json<FileInfo>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let request = MkdirRequest {
            path: args.path,
            parents: args.parents,
            mode: None,
            user: None,
            approval_id: None,
        };
        let entry = self.service.make_dir(&p, &id, request).await.map_err(failure)?;
        Ok(Json(file_info(entry)))
    }

    #[tool(
        name = "file_remove",
        description = "Remove a file or an empty directory of a sandbox; with recursive, a directory and everything in it.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn file_remove(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<FileRemoveArgs>,
    ) -> Result<Json<Removed>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        self.service
            .remove_file(&p, &id, &args.path, args.recursive, None)
            .await
            .map_err(failure)?;
        Ok(Json(Removed { path: args.path }))
    }

    #[tool(
        name = "file_move",
        description = "Move (rename) a file or directory of a sandbox; a file already at the destination is replaced.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn file_move(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<FileMoveArgs>,
    ) -> Result<Json<FileInfo>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let request = RenameRequest {
            from: args.from,
            to: args.to,
            approval_id: None,
        };
        let entry = self
            .service
            .rename_file(&p, &id, request)
            .await
            .map_err(failure)?;
        Ok(Json(file_info(entry)))
    }
}

#[cfg(test)]
mod tests {
    use super::{count_lines, LineSelection, Selected, MAX_FILE_READ};
    use crate::tools::complete_utf8_len;

    fn select(text: &[u8], chunk: usize, first: u64, last: u64) -> Selected {
        let mut lines = LineSelection::new(first, last);
        let complete = text.chunks(chunk).all(|c| lines.push(c));
        lines.finish(complete)
    }

    #[test]
    fn a_range_takes_whole_lines_across_chunks_and_counts_them_all() {
        let text = b"one\ntwo\nthree\nfour";
        for chunk in [1, 3, 100] {
            let got = select(text, chunk, 2, 3);
            assert_eq!(
                (got.bytes.as_slice(), got.end, got.total, got.truncated),
                (&b"two\nthree\n"[..], 3, Some(4), false),
                "chunks of {chunk}"
            );
        }
        let tail = select(text, 2, 3, u64::MAX);
        assert_eq!(
            (tail.bytes.as_slice(), tail.end, tail.total),
            (&b"three\nfour"[..], 4, Some(4))
        );
        let past = select(text, 2, 9, 12);
        assert_eq!((past.bytes.len(), past.end, past.total), (0, 8, Some(4)));
        assert_eq!(select(b"", 1, 1, 1).total, Some(0));
        assert_eq!(select(b"a\n\n", 1, 2, 2).bytes, b"\n");
    }

    #[test]
    fn a_range_past_the_cap_ends_at_a_whole_line_or_a_whole_character() {
        let line = "é".repeat(MAX_FILE_READ / 4);
        let text = format!("{line}\n{line}\n{line}\n");
        let got = select(text.as_bytes(), 4096, 1, 3);
        assert_eq!((got.end, got.total, got.truncated), (1, None, true));
        assert_eq!(got.bytes.len(), line.len() + 1);
        // One line longer than the cap: its start, cut between characters.
        let long = "é".repeat(MAX_FILE_READ);
        let got = select(long.as_bytes(), 4095, 1, 1);
        assert_eq!((got.end, got.truncated), (1, true));
        assert_eq!(got.bytes.len(), MAX_FILE_READ);
        assert!(std::str::from_utf8(&got.bytes).is_ok());
        let odd = format!("a{long}");
        let got = select(odd.as_bytes(), 4096, 1, 1);
        assert_eq!(got.bytes.len(), MAX_FILE_READ - 1);
    }

    #[test]
    fn lines_and_characters_are_counted_whole() {
        assert_eq!(count_lines(b""), 0);
        assert_eq!(count_lines(b"a"), 1);
        assert_eq!(count_lines(b"a\n"), 1);
        assert_eq!(count_lines(b"a\nb"), 2);
        assert_eq!(count_lines(b"\n\n"), 2);
        let text = "aé€😀".as_bytes();
        assert_eq!(complete_utf8_len(text), text.len());
        for cut in 1..=3 {
            assert_eq!(complete_utf8_len(&text[..text.len() - cut]), text.len() - 4);
        }
        assert_eq!(complete_utf8_len(&text[..2]), 1);
        assert_eq!(complete_utf8_len(b""), 0);
        assert_eq!(complete_utf8_len(&[0xff]), 1);
        assert_eq!(complete_utf8_len(&[b'a', 0xf0]), 1);
    }
}

//! `run_code`: one cell in a code-interpreter context of a sandbox (a kernel that keeps variables
//! and imports between cells), collected to its end and answered as text for a model: the
//! results' plain text, stdout, stderr, the exception (its traceback without colour codes), and
//! each PNG or JPEG figure as an image content block after the structured result.
//!
//! A cell that raises is data (`status: error`), like a command's non-zero exit; a sandbox without
//! a kernel for the language is a tool failure with the service's code (`kernel_unavailable`).
//!
//! What it does not do: manage contexts (create, restart, remove: the `/v1` API does), stream a
//! cell's output as it comes, or return HTML, SVG, PDF or chart data (`formats` names what a
//! result held).

use paddock_types::api::{CodeResult, CodeRunResult, RunCodeRequest};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tools::{failure, head, sandbox_id, time_limit, wire_name, MAX_OUTPUT};
use crate::PaddockMcp;

/// Bytes of the results' text `run_code` returns, all results together.
const MAX_RESULT_TEXT: usize = 64 * 1024;
/// The most images `run_code` returns.
const MAX_IMAGES: usize = 8;
/// Bytes of images (as base64) `run_code` returns, all together.
const MAX_IMAGE_BYTES: usize = 4 * 1024 * 1024;

/// `run_code`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// The sandbox (from a template with kernels, such as `code-interpreter`).
    pub sandbox_id: String,
    /// The code of the cell.
    pub code: String,
    /// `python` (the default), `javascript` or `bash`: runs in that language's default context,
    /// made at its first cell. Give this or `context`, not both.
    #[serde(default)]
    pub language: Option<String>,
    /// The id of an existing context to run in (its state is separate from the default one's).
    #[serde(default)]
    pub context: Option<String>,
    /// Seconds before the cell is interrupted (default 60, at most 3600); the context's state
    /// stays.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// A result or display of a cell (its value, a printed table, a figure).
#[derive(Debug, Serialize, JsonSchema)]
pub struct CellResult {
    /// Whether it is the cell's value (the last expression), not a display.
    pub is_main_result: bool,
    /// Its plain-text form, when it has one.
    pub text: Option<String>,
    /// The forms it came in (`text`, `html`, `markdown`, `png`, `jpeg`, `svg`, `pdf`, `latex`,
    /// `json`, `javascript`, `chart`, other MIME types); PNG and JPEG ones follow as images.
    pub formats: Vec<String>,
}

/// The exception a cell raised.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CellError {
    /// Its name (`ZeroDivisionError`).
    pub name: String,
    /// Its value (`division by zero`).
    pub value: String,
    /// The traceback, without colour codes.
    pub traceback: String,
}

/// `run_code`'s result. A cell that raised is a normal result (`status: error`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct CodeCell {
    /// The context it ran in (pass it as `context` to continue in the same state).
    pub context: String,
    /// `ok`, `error` (it raised), `timed_out` (interrupted at the time limit; the state stays),
    /// `interrupted`, or `kernel_died` (the context's state is gone).
    pub status: String,
    /// The cell's execution count in its context.
    pub execution_count: Option<u32>,
    /// Results and displays, in order.
    pub results: Vec<CellResult>,
    /// Standard output, at most 256 KiB.
    pub stdout: String,
    /// Standard error, at most 256 KiB.
    pub stderr: String,
    /// The exception, if it raised.
    pub error: Option<CellError>,
    /// How many images follow this result as image content (at most 8).
    pub images: u32,
    /// Whether output was left out: streams beyond 256 KiB, results' text beyond 64 KiB, images
    /// beyond 8 or 4 MiB, or what the server dropped.
    pub truncated: bool,
}

/// `pieces` joined, cut to at most `cap` bytes (at a character boundary); whether it was cut.
fn joined_capped(pieces: &[String], cap: usize) -> (String, bool) {
    let mut text = pieces.concat();
    if text.len() <= cap {
        return (text, false);
    }
    let end = head(&text, cap).len();
    text.truncate(end);
    (text, true)
}

/// `text` without ANSI escape sequences (a traceback's colours).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        // CSI: ESC [ parameters, then one final byte in '@'..='~'.
        if chars.next_if_eq(&'[').is_some() {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

/// The names of the forms `r` holds.
fn formats(r: &CodeResult) -> Vec<String> {
    let known = [
        ("text", r.text.is_some()),
        ("html", r.html.is_some()),
        ("markdown", r.markdown.is_some()),
        ("png", r.png.is_some()),
        ("jpeg", r.jpeg.is_some()),
        ("svg", r.svg.is_some()),
        ("pdf", r.pdf.is_some()),
        ("latex", r.latex.is_some()),
        ("json", r.json.is_some()),
        ("javascript", r.javascript.is_some()),
        ("chart", r.chart.is_some()),
    ];
    known
        .into_iter()
        .filter(|(_, present)| *present)
        .map(|(name, _)| name.to_owned())
        .chain(r.extra.keys().cloned())
        .collect()
}

/// A collected cell as the tool answers it: the structured result and the images.
fn cell_answer(doc: CodeRunResult) -> (CodeCell, Vec<ContentBlock>) {
    let (stdout, cut_out) = joined_capped(&doc.stdout, MAX_OUTPUT);
    let (stderr, cut_err) = joined_capped(&doc.stderr, MAX_OUTPUT);
    let mut truncated = cut_out || cut_err || doc.dropped_bytes > 0;
    let (mut text_room, mut image_room) = (MAX_RESULT_TEXT, MAX_IMAGE_BYTES);
    let mut images = Vec::new();
    let mut results = Vec::with_capacity(doc.results.len());
    for r in doc.results {
        truncated |= !r.cut.is_empty();
        let formats = formats(&r);
        let text = r.text.map(|t| {
            let (t, cut) = joined_capped(&[t], text_room);
            text_room -= t.len();
            truncated |= cut;
            t
        });
        for (data, mime) in [(r.png, "image/png"), (r.jpeg, "image/jpeg")] {
            let Some(mut data) = data else { continue };
            // Jupyter's base64 may be broken into lines; an MCP image's data is plain base64.
            data.retain(|c| !c.is_ascii_whitespace());
            if images.len() >= MAX_IMAGES || data.len() > image_room {
                truncated = true;
                continue;
            }
            image_room -= data.len();
            images.push(ContentBlock::image(data, mime));
        }
        results.push(CellResult {
            is_main_result: r.is_main_result,
            text,
            formats,
        });
    }
    let cell = CodeCell {
        context: doc.context,
        status: wire_name(doc.status),
        execution_count: doc.execution_count,
        results,
        stdout,
        stderr,
        error: doc.error.map(|e| CellError {
            name: e.name,
            value: strip_ansi(&e.value),
            traceback: strip_ansi(&e.traceback),
        }),
        // At most MAX_IMAGES.
        images: u32::try_from(images.len()).unwrap_or(u32::MAX),
        truncated,
    };
    (cell, images)
}

#[tool_router(router = code_router, vis = "pub(crate)")]
impl PaddockMcp {
    #[tool(
        name = "run_code",
        description = "Run a cell of Python (default), JavaScript or bash in a sandbox's code interpreter, like a Jupyter notebook: variables and imports persist between cells of the same context. Returns the results' text, stdout, stderr and any exception with its traceback; figures (matplotlib) follow as images. A cell that raises is a normal result with status error. Needs a sandbox from a template with kernels (e.g. code-interpreter).",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false),
        output_schema = rmcp::handler::server::tool::schema_for_output::<CodeCell>()
    )]
    async fn run_code(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<RunCodeArgs>,
    ) -> Result<CallToolResult, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let timeout = time_limit(args.timeout_secs)?;
        let request = RunCodeRequest {
            code: args.code,
            language: args.language,
            context: args.context,
            timeout_ms: Some(timeout * 1000),
            ..RunCodeRequest::default()
        };
        let stream = self.service.run_code(&p, &id, request).await.map_err(failure)?;
        // The collected document holds its bytes against the server's budget until dropped here.
        let (json, held) = stream.collect().await.into_json();
        let doc: CodeRunResult =
            serde_json::from_slice(&json).map_err(|e| format!("internal: reading a cell's result: {e}"))?;
        drop((json, held));
        let (cell, images) = cell_answer(doc);
        let value =
            serde_json::to_value(&cell).map_err(|e| format!("internal: encoding a cell's result: {e}"))?;
        let mut result = CallToolResult::structured(value);
        result.content.extend(images);
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_types::api::{CodeError, CodeStatus};

    fn doc() -> CodeRunResult {
        CodeRunResult {
            context: "python".into(),
            execution_count: Some(3),
            stdout: vec!["a\n".into(), "b\n".into()],
            stderr: Vec::new(),
            results: Vec::new(),
            error: None,
            status: CodeStatus::Ok,
            dropped_bytes: 0,
        }
    }

    #[test]
    fn a_cell_answers_text_and_its_figures_as_images() {
        let mut d = doc();
        d.results = vec![
            CodeResult {
                png: Some("iVB\nOR\n".into()),
                text: Some("<Figure size 640x480>".into()),
                ..CodeResult::default()
            },
            CodeResult {
                is_main_result: true,
                text: Some("42".into()),
                html: Some("<b>42</b>".into()),
                ..CodeResult::default()
            },
        ];
        let (cell, images) = cell_answer(d);
        assert_eq!((cell.stdout.as_str(), cell.status.as_str()), ("a\nb\n", "ok"));
        assert_eq!(cell.results[1].text.as_deref(), Some("42"));
        assert_eq!(cell.results[1].formats, ["text", "html"]);
        assert_eq!(cell.results[0].formats, ["text", "png"]);
        assert_eq!((cell.images, images.len(), cell.truncated), (1, 1, false));
        let image = images[0].as_image().expect("an image");
        assert_eq!(
            (image.data.as_str(), image.mime_type.as_str()),
            ("iVBOR", "image/png")
        );
    }

    #[test]
    fn an_exception_is_data_without_colour_codes() {
        let mut d = doc();
        d.status = CodeStatus::Error;
        d.error = Some(CodeError {
            name: "ZeroDivisionError".into(),
            value: "division by zero".into(),
            traceback: "\u{1b}[0;31mZeroDivisionError\u{1b}[0m: division by zero".into(),
        });
        let (cell, _) = cell_answer(d);
        assert_eq!(cell.status, "error");
        let error = cell.error.expect("the exception");
        assert_eq!(error.traceback, "ZeroDivisionError: division by zero");
        assert_eq!(strip_ansi("é\u{1b}[1;32mok\u{1b}[0m"), "éok");
    }

    #[test]
    fn what_does_not_fit_is_cut_and_said() {
        let mut d = doc();
        d.stdout = vec!["é".repeat(MAX_OUTPUT)];
        d.results = (0..MAX_IMAGES + 2)
            .map(|_| CodeResult {
                png: Some("x".into()),
                ..CodeResult::default()
            })
            .collect();
        let (cell, images) = cell_answer(d);
        assert!(cell.truncated);
        assert!(cell.stdout.len() <= MAX_OUTPUT && cell.stdout.len() > MAX_OUTPUT - 2);
        assert_eq!((cell.images as usize, images.len()), (MAX_IMAGES, MAX_IMAGES));
        let mut dropped = doc();
        dropped.dropped_bytes = 10;
        assert!(cell_answer(dropped).0.truncated);
        assert!(!cell_answer(doc()).0.truncated);
    }
}

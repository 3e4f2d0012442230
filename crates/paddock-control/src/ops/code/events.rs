//! A cell's events in their API form: the agent's `CellEvent`s (a kernel's MIME bundles) mapped to
//! `CodeEvent`s with E2B's names for the representations, and a cell collected into one document
//! under a byte bound. Pure functions.
//!
//! What it does not do: talk to the agent or bound what the agent already bounded (each event is
//! at most one frame); it bounds only what a collected document holds.

use std::collections::BTreeMap;

use paddock_protocol::kernel::{CellEvent, CellStatus, CellStream};
use paddock_types::api::{CodeError, CodeEvent, CodeResult, CodeRunResult, CodeStatus};

use crate::core::output::collect::Held;

/// The MIME type the Python setup (`plan/kernels/python_setup.py`) gives a figure's chart data.
pub(crate) const CHART_MIME: &str = "application/vnd.paddock.chart+json";

/// The event in API form.
pub(crate) fn code_event(event: CellEvent) -> CodeEvent {
    match event {
        CellEvent::Stream { name, text } => match name {
            CellStream::Stdout => CodeEvent::Stdout { text },
            CellStream::Stderr => CodeEvent::Stderr { text },
        },
        CellEvent::Result { main, data, cut, .. } => {
            CodeEvent::Result(Box::new(code_result(main, data, cut)))
        }
        CellEvent::Error {
            name,
            value,
            traceback,
        } => CodeEvent::Error(CodeError {
            name,
            value,
            traceback: traceback.join("\n"),
        }),
        CellEvent::ExecutionCount { count } => CodeEvent::ExecutionCount {
            execution_count: count,
        },
        CellEvent::End {
            status,
            dropped_bytes,
            ..
        } => CodeEvent::End {
            status: code_status(status),
            dropped_bytes,
        },
    }
}

pub(crate) fn code_status(status: CellStatus) -> CodeStatus {
    match status {
        CellStatus::Ok => CodeStatus::Ok,
        CellStatus::Error => CodeStatus::Error,
        CellStatus::TimedOut => CodeStatus::TimedOut,
        CellStatus::Interrupted => CodeStatus::Interrupted,
        CellStatus::KernelDied => CodeStatus::KernelDied,
    }
}

/// A MIME bundle as a result: the known types in their fields (text ones as strings; a value of
/// another JSON type there goes to `extra`), the rest in `extra`.
pub(crate) fn code_result(
    main: bool,
    data: BTreeMap<String, serde_json::Value>,
    cut: Vec<String>,
) -> CodeResult {
    let mut result = CodeResult {
        is_main_result: main,
        cut,
        ..CodeResult::default()
    };
    for (mime, value) in data {
        if mime == "application/json" {
            result.json = Some(value);
            continue;
        }
        if mime == CHART_MIME {
            if value.is_object() {
                result.chart = Some(value);
            } else {
                result.extra.insert(mime, value);
            }
            continue;
        }
        let slot = match mime.as_str() {
            "text/plain" => &mut result.text,
            "text/html" => &mut result.html,
            "text/markdown" => &mut result.markdown,
            "image/svg+xml" => &mut result.svg,
            "image/png" => &mut result.png,
            "image/jpeg" => &mut result.jpeg,
            "application/pdf" => &mut result.pdf,
            "text/latex" => &mut result.latex,
            "application/javascript" => &mut result.javascript,
            _ => {
                result.extra.insert(mime, value);
                continue;
            }
        };
        match value {
            serde_json::Value::String(text) => *slot = Some(text),
            // Jupyter allows a text representation as a list of lines.
            serde_json::Value::Array(lines) if lines.iter().all(serde_json::Value::is_string) => {
                *slot = Some(lines.iter().filter_map(serde_json::Value::as_str).collect());
            }
            other => {
                result.extra.insert(mime, other);
            }
        }
    }
    result
}

/// A cell collected into one document, holding at most `limit` bytes of output (counted as the
/// JSON of each event) and only what the server's collected-output budget gives it (`held`, kept
/// until the document is sent); what does not fit is counted in `dropped_bytes`.
#[derive(Debug)]
pub(crate) struct Collector {
    doc: CodeRunResult,
    kept: usize,
    limit: usize,
    held: Held,
}

impl Collector {
    pub(crate) fn new(context: String, limit: usize, held: Held) -> Self {
        Self {
            doc: CodeRunResult {
                context,
                execution_count: None,
                stdout: Vec::new(),
                stderr: Vec::new(),
                results: Vec::new(),
                error: None,
                status: CodeStatus::KernelDied,
                dropped_bytes: 0,
            },
            kept: 0,
            limit,
            held,
        }
    }

    /// Adds an event; true once the cell has ended.
    pub(crate) fn add(&mut self, event: CodeEvent) -> bool {
        let size = serde_json::to_vec(&event).map_or(0, |v| v.len());
        let fits = match event {
            CodeEvent::Stdout { .. }
            | CodeEvent::Stderr { .. }
            | CodeEvent::Result(_)
            | CodeEvent::Error(_) => self.kept + size <= self.limit && self.held.grow(size as u64),
            _ => true,
        };
        match event {
            CodeEvent::Started { .. } => {}
            CodeEvent::ExecutionCount { execution_count } => self.doc.execution_count = Some(execution_count),
            CodeEvent::End {
                status,
                dropped_bytes,
            } => {
                self.doc.status = status;
                self.doc.dropped_bytes += dropped_bytes;
                return true;
            }
            CodeEvent::Failed { .. } => return true,
            other if !fits => {
                let _ = other;
                self.doc.dropped_bytes += size as u64;
            }
            CodeEvent::Stdout { text } => self.doc.stdout.push(text),
            CodeEvent::Stderr { text } => self.doc.stderr.push(text),
            CodeEvent::Result(result) => self.doc.results.push(*result),
            CodeEvent::Error(error) => self.doc.error = Some(error),
        }
        if fits {
            self.kept += size;
        }
        false
    }

    /// The document, and the budget it holds (drop it once the document is sent).
    pub(crate) fn finish(self) -> (CodeRunResult, Held) {
        (self.doc, self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::output::collect::OutputBudget;
    use serde_json::json;

    #[test]
    fn bundles_map_to_e2bs_fields() {
        let data = BTreeMap::from([
            ("text/plain".to_owned(), json!("   a\n0  1")),
            ("text/html".to_owned(), json!(["<table>", "</table>"])),
            ("image/png".to_owned(), json!("iVBOR")),
            ("application/json".to_owned(), json!({"a": 1})),
            ("application/vnd.custom".to_owned(), json!({"x": true})),
            (CHART_MIME.to_owned(), json!({"type": "line", "elements": []})),
            ("text/latex".to_owned(), json!(3)),
        ]);
        let r = code_result(true, data, vec!["image/svg+xml".into()]);
        assert!(r.is_main_result);
        assert_eq!(r.text.as_deref(), Some("   a\n0  1"));
        assert_eq!(r.html.as_deref(), Some("<table></table>"));
        assert_eq!(r.png.as_deref(), Some("iVBOR"));
        assert_eq!(r.json, Some(json!({"a": 1})));
        assert_eq!(r.latex, None);
        assert_eq!(r.extra.len(), 2);
        assert_eq!(r.chart, Some(json!({"type": "line", "elements": []})));
        assert_eq!(r.cut, ["image/svg+xml"]);
    }

    #[test]
    fn errors_join_their_traceback_and_statuses_map() {
        let e = code_event(CellEvent::Error {
            name: "ValueError".into(),
            value: "bad".into(),
            traceback: vec!["a".into(), "b".into()],
        });
        assert_eq!(
            e,
            CodeEvent::Error(CodeError {
                name: "ValueError".into(),
                value: "bad".into(),
                traceback: "a\nb".into()
            })
        );
        assert_eq!(code_status(CellStatus::TimedOut), CodeStatus::TimedOut);
    }

    #[test]
    fn a_collected_cell_is_bounded_and_says_what_it_dropped() {
        let budget = OutputBudget::new(1 << 20);
        let mut c = Collector::new("python".into(), 150, budget.claim("t"));
        assert!(!c.add(CodeEvent::ExecutionCount { execution_count: 2 }));
        assert!(!c.add(CodeEvent::Stdout { text: "a".repeat(40) }));
        assert!(!c.add(CodeEvent::Stdout { text: "b".repeat(80) }));
        assert!(!c.add(CodeEvent::Stderr { text: "c".into() }));
        assert!(c.add(CodeEvent::End {
            status: CodeStatus::Ok,
            dropped_bytes: 5
        }));
        let (doc, held) = c.finish();
        assert_eq!(doc.execution_count, Some(2));
        assert_eq!(doc.stdout, ["a".repeat(40)]);
        assert_eq!(doc.stderr, ["c"]);
        assert_eq!(doc.status, CodeStatus::Ok);
        assert!(doc.dropped_bytes > 80 + 5, "{}", doc.dropped_bytes);
        let kept = serde_json::to_vec(&CodeEvent::Stdout { text: "a".repeat(40) })
            .expect("json")
            .len()
            + serde_json::to_vec(&CodeEvent::Stderr { text: "c".into() })
                .expect("json")
                .len();
        assert_eq!(budget.held(), kept as u64);
        drop(held);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn a_collected_cell_keeps_only_what_the_servers_budget_gives_it() {
        // A budget of 400 bytes: one tenant may hold 100 of them.
        let budget = OutputBudget::new(400);
        let other = {
            let mut c = Collector::new("python".into(), 1 << 20, budget.claim("other"));
            assert!(!c.add(CodeEvent::Stdout { text: "x".repeat(60) }));
            c
        };
        let mut c = Collector::new("python".into(), 1 << 20, budget.claim("t"));
        assert!(!c.add(CodeEvent::Stdout { text: "a".repeat(60) }));
        assert!(!c.add(CodeEvent::Stdout { text: "b".repeat(60) }));
        assert!(c.add(CodeEvent::End {
            status: CodeStatus::Ok,
            dropped_bytes: 0
        }));
        let (doc, held) = c.finish();
        assert_eq!(doc.stdout, ["a".repeat(60)], "the tenant's share held one event");
        assert!(doc.dropped_bytes >= 60);
        drop((held, other));
        assert_eq!(budget.held(), 0);
    }
}

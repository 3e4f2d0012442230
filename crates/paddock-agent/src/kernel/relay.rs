//! Turning a cell's Jupyter messages into bounded [`CellEvent`]s and relaying them to the
//! requesting connection.
//!
//! Bounds: every event's JSON stays within [`MAX_CELL_EVENT_LEN`] (stream text is split over
//! several events; a result bundle loses its largest representations, named in `cut`, and keeps
//! `text/plain`, truncated if need be; an error's traceback is shortened), and a cell relays at most
//! [`CELL_BUDGET`] bytes: beyond it events are dropped and counted in the end's `dropped_bytes`.
//! Relaying waits for room in the connection's bounded queue, so a slow host slows the cell's reader
//! (and through TCP the kernel), never grows the agent's memory.
//!
//! What it does not do: decide which messages belong to the cell, or when it ends (`cell.rs`).

use std::collections::BTreeMap;

use jupyter_protocol::{JupyterMessageContent, Media, Stdio};
use paddock_protocol::kernel::{CellEvent, CellStatus, CellStream, MAX_CELL_EVENT_LEN};
use paddock_protocol::AgentMessage;
use serde_json::Value;

use crate::outbound::Outbound;

/// Bytes of events one cell may relay.
pub(crate) const CELL_BUDGET: u64 = 64 << 20;
/// Room left in an event for everything around its text (kind, name, escapes are counted exactly).
const EVENT_OVERHEAD: usize = 1024;
/// Marker appended to text cut short.
const TRUNCATED: &str = "\n[truncated by the agent]";

/// The relay of one cell's events.
#[derive(Debug)]
pub(crate) struct Relay {
    cell_id: u64,
    /// `None` once the connection is gone (the cell runs on; its events are dropped).
    out: Option<Outbound>,
    relayed: u64,
    dropped: u64,
}

impl Relay {
    pub(crate) fn new(cell_id: u64, out: Outbound) -> Self {
        Self {
            cell_id,
            out: Some(out),
            relayed: 0,
            dropped: 0,
        }
    }

    /// Counts bytes dropped before they became events (an oversized message).
    pub(crate) fn count_dropped(&mut self, bytes: usize) {
        self.dropped += bytes as u64;
    }

    /// Relays the events of one iopub message of the cell. With `interrupted`, a `KeyboardInterrupt`
    /// error is not relayed (the end says `interrupted` or `timed_out` instead).
    pub(crate) async fn relay_message(&mut self, content: JupyterMessageContent, interrupted: bool) {
        for event in cell_events(content, interrupted) {
            self.send(&event, false).await;
        }
    }

    /// Sends the cell's last event.
    pub(crate) async fn end(mut self, status: CellStatus, kernel_dead: bool) {
        let end = CellEvent::End {
            status,
            dropped_bytes: self.dropped,
            kernel_dead: kernel_dead && status != CellStatus::KernelDied,
        };
        self.send(&end, true).await;
    }

    async fn send(&mut self, event: &CellEvent, last: bool) {
        let json = match serde_json::to_vec(event) {
            Ok(json) if json.len() <= MAX_CELL_EVENT_LEN => json,
            Ok(json) => {
                // The mapping keeps events under the bound; count rather than break the frame.
                self.dropped += json.len() as u64;
                return;
            }
            Err(_) => return,
        };
        if !last && self.relayed + json.len() as u64 > CELL_BUDGET {
            self.dropped += json.len() as u64;
            return;
        }
        self.relayed += json.len() as u64;
        let Some(out) = &self.out else {
            return;
        };
        let message = AgentMessage::Cell {
            cell_id: self.cell_id,
        };
        if out.send(&message, &json).await.is_err() {
            self.out = None;
        }
    }
}

/// The events one iopub message becomes (none for messages a cell does not show).
pub(crate) fn cell_events(content: JupyterMessageContent, interrupted: bool) -> Vec<CellEvent> {
    match content {
        JupyterMessageContent::StreamContent(stream) => {
            let name = match stream.name {
                Stdio::Stdout => CellStream::Stdout,
                Stdio::Stderr => CellStream::Stderr,
            };
            split_stream(name, &stream.text)
        }
        JupyterMessageContent::ExecuteInput(input) => vec![CellEvent::ExecutionCount {
            count: u32::try_from(input.execution_count.0).unwrap_or(u32::MAX),
        }],
        JupyterMessageContent::ExecuteResult(result) => {
            vec![fit_result(
                true,
                media_map(&result.data),
                result.metadata.into_iter().collect(),
            )]
        }
        JupyterMessageContent::DisplayData(display) => {
            vec![fit_result(
                false,
                media_map(&display.data),
                display.metadata.into_iter().collect(),
            )]
        }
        JupyterMessageContent::UpdateDisplayData(display) => {
            vec![fit_result(
                false,
                media_map(&display.data),
                display.metadata.into_iter().collect(),
            )]
        }
        JupyterMessageContent::ErrorOutput(error) if interrupted && error.ename == "KeyboardInterrupt" => {
            Vec::new()
        }
        JupyterMessageContent::ErrorOutput(error) => {
            vec![fit_error(error.ename, error.evalue, error.traceback)]
        }
        _ => Vec::new(),
    }
}

/// A MIME bundle as the kernel sent it (MIME type to representation).
fn media_map(media: &Media) -> BTreeMap<String, Value> {
    match serde_json::to_value(media) {
        Ok(Value::Object(map)) => map.into_iter().collect(),
        _ => BTreeMap::new(),
    }
}

/// Splits `text` into stream events whose JSON each fits [`MAX_CELL_EVENT_LEN`] (at character
/// boundaries, counting JSON escapes).
pub(crate) fn split_stream(name: CellStream, text: &str) -> Vec<CellEvent> {
    let limit = MAX_CELL_EVENT_LEN - EVENT_OVERHEAD;
    let mut events = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (index, ch) in text.char_indices() {
        let cost = escaped_len(ch);
        if size + cost > limit {
            events.push(stream_event(name, &text[start..index]));
            (start, size) = (index, 0);
        }
        size += cost;
    }
    if start < text.len() || events.is_empty() {
        events.push(stream_event(name, &text[start..]));
    }
    events
}

fn stream_event(name: CellStream, text: &str) -> CellEvent {
    CellEvent::Stream {
        name,
        text: text.to_owned(),
    }
}

/// Bytes `ch` takes inside a JSON string (as `serde_json` writes it).
fn escaped_len(ch: char) -> usize {
    match ch {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

fn json_len(value: &impl serde::Serialize) -> usize {
    serde_json::to_vec(value).map_or(usize::MAX, |v| v.len())
}

/// A result event that fits: the largest representations other than `text/plain` go first (named
/// in `cut`), then the metadata, then `text/plain` is truncated.
pub(crate) fn fit_result(
    main: bool,
    mut data: BTreeMap<String, Value>,
    mut metadata: BTreeMap<String, Value>,
) -> CellEvent {
    let limit = MAX_CELL_EVENT_LEN - EVENT_OVERHEAD;
    let mut cut = Vec::new();
    let size = |data: &BTreeMap<String, Value>, metadata: &BTreeMap<String, Value>| {
        json_len(data) + json_len(metadata)
    };
    if size(&data, &metadata) > limit {
        let mut by_size: Vec<(usize, String)> = data
            .iter()
            .filter(|(mime, _)| mime.as_str() != "text/plain")
            .map(|(mime, value)| (json_len(value), mime.clone()))
            .collect();
        by_size.sort_by(|a, b| b.cmp(a));
        for (_, mime) in by_size {
            if size(&data, &metadata) <= limit {
                break;
            }
            data.remove(&mime);
            cut.push(mime);
        }
    }
    if size(&data, &metadata) > limit {
        metadata.clear();
    }
    if size(&data, &metadata) > limit {
        let text = match data.remove("text/plain") {
            Some(Value::String(text)) => text,
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let room = limit.saturating_sub(size(&data, &metadata) + 64);
        data.insert("text/plain".to_owned(), Value::String(truncate_text(&text, room)));
    }
    CellEvent::Result {
        main,
        data,
        metadata,
        cut,
    }
}

/// An error event that fits: the value and each traceback line are shortened, then the oldest
/// frames of the traceback are dropped.
pub(crate) fn fit_error(name: String, value: String, mut traceback: Vec<String>) -> CellEvent {
    let limit = MAX_CELL_EVENT_LEN - EVENT_OVERHEAD;
    let line_limit = limit / 8;
    let name = truncate_text(&name, 1024);
    let value = truncate_text(&value, line_limit);
    for line in &mut traceback {
        if line.len() > line_limit {
            *line = truncate_text(line, line_limit);
        }
    }
    while json_len(&traceback) + json_len(&value) > limit && !traceback.is_empty() {
        traceback.remove(0);
    }
    CellEvent::Error {
        name,
        value,
        traceback,
    }
}

/// `text` cut so its JSON form takes at most about `max` bytes, with a marker when cut.
fn truncate_text(text: &str, max: usize) -> String {
    let mut size = 0;
    for (index, ch) in text.char_indices() {
        size += escaped_len(ch);
        if size + TRUNCATED.len() > max {
            return format!("{}{TRUNCATED}", &text[..index]);
        }
    }
    text.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event_len(event: &CellEvent) -> usize {
        serde_json::to_vec(event).expect("json").len()
    }

    #[test]
    fn long_streams_are_split_under_the_bound_without_losing_text() {
        let text = format!("{}{}", "\u{1}\"é".repeat(300_000), "x".repeat(2_000_000));
        let events = split_stream(CellStream::Stdout, &text);
        assert!(events.len() > 3, "{} events", events.len());
        let mut joined = String::new();
        for event in &events {
            assert!(event_len(event) <= MAX_CELL_EVENT_LEN);
            let CellEvent::Stream { text, .. } = event else {
                panic!("not a stream")
            };
            joined.push_str(text);
        }
        assert_eq!(joined, text);
        assert_eq!(split_stream(CellStream::Stderr, "").len(), 1);
    }

    #[test]
    fn large_bundles_lose_their_largest_representations_first() {
        let data = BTreeMap::from([
            ("text/plain".to_owned(), Value::String("<Figure>".into())),
            ("image/png".to_owned(), Value::String("A".repeat(2 << 20))),
            ("text/html".to_owned(), Value::String("<b>x</b>".into())),
        ]);
        let event = fit_result(false, data, BTreeMap::new());
        assert!(event_len(&event) <= MAX_CELL_EVENT_LEN);
        let CellEvent::Result { data, cut, .. } = event else {
            panic!("not a result")
        };
        assert_eq!(cut, vec!["image/png".to_owned()]);
        assert_eq!(data.len(), 2, "the small ones stay");

        let huge_text = BTreeMap::from([("text/plain".to_owned(), Value::String("y".repeat(3 << 20)))]);
        let event = fit_result(true, huge_text, BTreeMap::new());
        assert!(event_len(&event) <= MAX_CELL_EVENT_LEN);
        let CellEvent::Result { data, .. } = event else {
            panic!("not a result")
        };
        assert!(data["text/plain"]
            .as_str()
            .is_some_and(|t| t.ends_with(TRUNCATED)));
    }

    #[test]
    fn huge_errors_fit() {
        let event = fit_error(
            "E".into(),
            "v".repeat(3 << 20),
            vec!["frame\n".repeat(50_000); 100],
        );
        assert!(event_len(&event) <= MAX_CELL_EVENT_LEN);
        assert!(matches!(event, CellEvent::Error { ref traceback, .. } if !traceback.is_empty()));
    }

    #[test]
    fn keyboard_interrupts_are_hidden_only_after_an_interrupt() {
        let error = || {
            JupyterMessageContent::ErrorOutput(jupyter_protocol::ErrorOutput {
                ename: "KeyboardInterrupt".into(),
                evalue: String::new(),
                traceback: vec![],
            })
        };
        assert!(cell_events(error(), true).is_empty());
        assert_eq!(cell_events(error(), false).len(), 1);
    }
}

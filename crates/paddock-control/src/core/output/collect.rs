//! A foreground process's output collected for one JSON document (`Accept: application/json`),
//! bounded by the bytes the server actually holds.
//!
//! Each stream is kept as the *content of a JSON string literal* (lossy UTF-8, escaped as serde_json
//! escapes), never as raw bytes plus a copy plus an encoding: a NUL costs six bytes (`\u0000`), and
//! those six bytes are what count against [`COLLECT_LIMIT`] per stream and against the server-wide
//! [`OutputBudget`] shared by every collecting request (one tenant at most a quarter of it). What does not fit is dropped and the answer
//! says so (`stdout_truncated`, `stderr_truncated`); the process runs to its end either way. The
//! document is then written around the two buffers without copying them ([`CollectedOutput::into_json`]).
//!
//! It does not bound streamed answers (NDJSON, SSE, WebSocket): those hold one event at a time and
//! are bounded by their queues.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use paddock_types::api::ExitInfo;

/// The most JSON-encoded text kept per stream (stdout, stderr) of one collected answer.
pub const COLLECT_LIMIT: usize = 16 * 1024 * 1024;

/// The first allocation of a stream's buffer; it then doubles (the budget is charged for capacity).
const FIRST_CAPACITY: usize = 64 * 1024;

/// Bytes of collected output the whole server may hold at once, and one tenant at most a
/// [`TENANT_SHARE`]th of it (a tenant whose clients never read their answers cannot take the budget
/// from the others); requests that find their share used up get truncated answers.
#[derive(Debug, Clone)]
pub(crate) struct OutputBudget {
    inner: Arc<BudgetInner>,
}

/// One tenant may hold at most `1 / TENANT_SHARE` of the budget.
pub const TENANT_SHARE: u64 = 4;

#[derive(Debug)]
struct BudgetInner {
    limit: u64,
    tenant_limit: u64,
    held: Mutex<BudgetHeld>,
}

#[derive(Debug, Default)]
struct BudgetHeld {
    total: u64,
    by_tenant: HashMap<String, u64>,
}

impl OutputBudget {
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            inner: Arc::new(BudgetInner {
                limit,
                tenant_limit: limit / TENANT_SHARE,
                held: Mutex::new(BudgetHeld::default()),
            }),
        }
    }

    /// An empty claim on the budget for `tenant`, grown with [`Held::grow`].
    pub(crate) fn claim(&self, tenant: &str) -> Held {
        Held {
            budget: self.inner.clone(),
            tenant: tenant.to_owned(),
            bytes: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn held(&self) -> u64 {
        self.inner.lock().total
    }
}

impl BudgetInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, BudgetHeld> {
        // Each critical section is a few additions; a panic cannot leave it half-done.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Bytes held against an [`OutputBudget`] for one tenant, given back on drop.
#[derive(Debug)]
pub(crate) struct Held {
    budget: Arc<BudgetInner>,
    tenant: String,
    bytes: u64,
}

impl Held {
    /// Takes `n` more bytes if the budget and the tenant's share have them.
    pub(crate) fn grow(&mut self, n: u64) -> bool {
        let mut held = self.budget.lock();
        let total = held.total.saturating_add(n);
        let tenant = held
            .by_tenant
            .get(&self.tenant)
            .copied()
            .unwrap_or(0)
            .saturating_add(n);
        if total > self.budget.limit || tenant > self.budget.tenant_limit {
            return false;
        }
        held.total = total;
        held.by_tenant.insert(self.tenant.clone(), tenant);
        self.bytes += n;
        true
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut held = self.budget.lock();
        held.total = held.total.saturating_sub(self.bytes);
        if let Some(t) = held.by_tenant.get_mut(&self.tenant) {
            *t = t.saturating_sub(self.bytes);
            if *t == 0 {
                held.by_tenant.remove(&self.tenant);
            }
        }
    }
}

/// One stream's text as the content of a JSON string literal, decoded as lossy UTF-8 across chunk
/// boundaries.
#[derive(Debug, Default)]
pub(crate) struct JsonText {
    json: Vec<u8>,
    /// The start of a UTF-8 sequence whose end has not arrived yet.
    pending: [u8; 4],
    pending_len: usize,
    truncated: bool,
}

impl JsonText {
    /// Appends `data`'s text, as far as `cap` and the budget allow.
    pub(crate) fn push(&mut self, mut data: &[u8], cap: usize, held: &mut Held) {
        if self.truncated {
            return;
        }
        // Complete a sequence begun in an earlier chunk.
        while self.pending_len > 0 {
            let Some(&b) = data.first() else { return };
            let mut seq = self.pending;
            seq[self.pending_len] = b;
            match std::str::from_utf8(&seq[..=self.pending_len]) {
                Ok(s) => {
                    self.pending_len = 0;
                    data = &data[1..];
                    if !self.write_str(s, cap, held) {
                        return;
                    }
                }
                Err(e) if e.error_len().is_none() => {
                    self.pending = seq;
                    self.pending_len += 1;
                    data = &data[1..];
                }
                Err(_) => {
                    // `b` does not continue the sequence: the sequence is one U+FFFD, and `b` is
                    // read again below as the start of what follows.
                    self.pending_len = 0;
                    if !self.write_str("\u{FFFD}", cap, held) {
                        return;
                    }
                }
            }
        }
        while !data.is_empty() {
            match std::str::from_utf8(data) {
                Ok(s) => {
                    self.write_str(s, cap, held);
                    return;
                }
                Err(e) => {
                    let (valid, rest) = data.split_at(e.valid_up_to());
                    // The first `valid_up_to` bytes are valid UTF-8 by definition: never the default.
                    let valid = std::str::from_utf8(valid).unwrap_or_default();
                    if !self.write_str(valid, cap, held) {
                        return;
                    }
                    match e.error_len() {
                        Some(n) => {
                            if !self.write_str("\u{FFFD}", cap, held) {
                                return;
                            }
                            data = &rest[n..];
                        }
                        None => {
                            // At most 3 bytes: an incomplete sequence at the end of the chunk.
                            self.pending[..rest.len()].copy_from_slice(rest);
                            self.pending_len = rest.len();
                            return;
                        }
                    }
                }
            }
        }
    }

    /// The stream ended: an unfinished sequence is one U+FFFD (as `String::from_utf8_lossy` does).
    pub(crate) fn finish(&mut self, cap: usize, held: &mut Held) {
        if self.pending_len > 0 && !self.truncated {
            self.pending_len = 0;
            self.write_str("\u{FFFD}", cap, held);
        }
    }

    /// Appends `s` escaped; false (and truncated) once something did not fit.
    fn write_str(&mut self, s: &str, cap: usize, held: &mut Held) -> bool {
        let bytes = s.as_bytes();
        // Most often all of it fits: one look at the room, then a tight loop.
        let need = bytes.iter().map(|&b| escape_of(b).len().max(1)).sum::<usize>();
        if self.room(need, cap, held) == need {
            let mut start = 0;
            for (i, &b) in bytes.iter().enumerate() {
                let escape = escape_of(b);
                if !escape.is_empty() {
                    self.json.extend_from_slice(&bytes[start..i]);
                    self.json.extend_from_slice(escape);
                    start = i + 1;
                }
            }
            self.json.extend_from_slice(&bytes[start..]);
            return true;
        }
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            let escape = escape_of(b);
            if escape.is_empty() {
                continue;
            }
            if !self.write_plain(s, start, i, cap, held) || !self.write_raw(escape, cap, held) {
                return false;
            }
            start = i + 1;
        }
        self.write_plain(s, start, bytes.len(), cap, held)
    }

    /// Appends `s[from..to]` (no character needs escaping there), cut at a character boundary when it
    /// does not all fit.
    fn write_plain(&mut self, s: &str, from: usize, to: usize, cap: usize, held: &mut Held) -> bool {
        if from == to {
            return true;
        }
        let room = self.room(to - from, cap, held);
        if room == to - from {
            self.json.extend_from_slice(&s.as_bytes()[from..to]);
            return true;
        }
        let mut end = from + room;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.json.extend_from_slice(&s.as_bytes()[from..end]);
        self.truncated = true;
        false
    }

    /// Appends an escape sequence whole, or nothing.
    fn write_raw(&mut self, escape: &[u8], cap: usize, held: &mut Held) -> bool {
        if self.room(escape.len(), cap, held) < escape.len() {
            self.truncated = true;
            return false;
        }
        self.json.extend_from_slice(escape);
        true
    }

    /// How many of `wanted` more bytes fit (under `cap` and in capacity the budget paid for).
    fn room(&mut self, wanted: usize, cap: usize, held: &mut Held) -> usize {
        let len = self.json.len();
        let wanted = wanted.min(cap.saturating_sub(len));
        let capacity = self.json.capacity();
        if len + wanted <= capacity {
            return wanted;
        }
        let target = (len + wanted)
            .max(capacity.saturating_mul(2))
            .max(FIRST_CAPACITY)
            .min(cap);
        for new_capacity in [target, len + wanted] {
            if held.grow((new_capacity - capacity) as u64) {
                self.json.reserve_exact(new_capacity - len);
                return wanted;
            }
        }
        // The budget is spent: what capacity is left is all there is.
        capacity - len
    }

    #[cfg(test)]
    pub(crate) fn truncated(&self) -> bool {
        self.truncated
    }

    #[cfg(test)]
    pub(crate) fn as_json_content(&self) -> &[u8] {
        &self.json
    }
}

/// serde_json's escape of one byte of UTF-8 text, or empty when it stands for itself.
fn escape_of(b: u8) -> &'static [u8] {
    const CONTROL: [&[u8]; 32] = [
        b"\\u0000", b"\\u0001", b"\\u0002", b"\\u0003", b"\\u0004", b"\\u0005", b"\\u0006", b"\\u0007",
        b"\\b", b"\\t", b"\\n", b"\\u000b", b"\\f", b"\\r", b"\\u000e", b"\\u000f", b"\\u0010", b"\\u0011",
        b"\\u0012", b"\\u0013", b"\\u0014", b"\\u0015", b"\\u0016", b"\\u0017", b"\\u0018", b"\\u0019",
        b"\\u001a", b"\\u001b", b"\\u001c", b"\\u001d", b"\\u001e", b"\\u001f",
    ];
    match b {
        0..=0x1f => CONTROL[usize::from(b)],
        b'"' => b"\\\"",
        b'\\' => b"\\\\",
        _ => b"",
    }
}

/// A process's collected output, holding its bytes against the server's budget until dropped.
#[derive(Debug)]
pub struct CollectedOutput {
    pid: u32,
    /// `None` for a background process (nothing is collected).
    streams: Option<(JsonText, JsonText)>,
    exit: Option<ExitInfo>,
    held: Option<Held>,
}

impl CollectedOutput {
    pub(crate) fn background(pid: u32) -> Self {
        Self {
            pid,
            streams: None,
            exit: None,
            held: None,
        }
    }

    pub(crate) fn new(
        pid: u32,
        stdout: JsonText,
        stderr: JsonText,
        exit: Option<ExitInfo>,
        held: Held,
    ) -> Self {
        Self {
            pid,
            streams: Some((stdout, stderr)),
            exit,
            held: Some(held),
        }
    }

    /// The [`ExecResult`] document, in pieces that reference the collected buffers (no copy), in
    /// serde_json's field order and encoding; and what keeps the budget held until the pieces are
    /// sent (drop it with them).
    pub fn into_json(self) -> (Vec<Bytes>, impl Send + Sync + 'static) {
        let mut head = format!("{{\"pid\":{}", self.pid);
        let mut pieces = Vec::new();
        if let Some((stdout, stderr)) = self.streams {
            for (name, text) in [("stdout", stdout), ("stderr", stderr)] {
                head.push_str(&format!(",\"{name}\":\""));
                pieces.push(Bytes::from(std::mem::take(&mut head)));
                let truncated = text.truncated;
                pieces.push(Bytes::from(text.json));
                head.push('"');
                if truncated {
                    head.push_str(&format!(",\"{name}_truncated\":true"));
                }
            }
        }
        if let Some(exit) = &self.exit {
            // A handful of numbers: serializing them cannot fail.
            let exit = serde_json::to_string(exit).unwrap_or_else(|_| "null".to_owned());
            head.push_str(&format!(",\"exit\":{exit}"));
        }
        head.push('}');
        pieces.push(Bytes::from(head));
        (pieces, self.held)
    }

    /// The same document as an [`ExecResult`](paddock_types::api::ExecResult) (copies the text).
    #[cfg(test)]
    pub(crate) fn to_result(&self) -> paddock_types::api::ExecResult {
        let text = |t: &JsonText| -> String {
            let literal = [b"\"".as_slice(), &t.json, b"\""].concat();
            serde_json::from_slice(&literal).unwrap_or_default()
        };
        paddock_types::api::ExecResult {
            pid: self.pid,
            stdout: self.streams.as_ref().map(|(o, _)| text(o)),
            stdout_truncated: self.streams.as_ref().is_some_and(|(o, _)| o.truncated),
            stderr: self.streams.as_ref().map(|(_, e)| text(e)),
            stderr_truncated: self.streams.as_ref().is_some_and(|(_, e)| e.truncated),
            exit: self.exit,
        }
    }
}

#[cfg(test)]
mod tests;

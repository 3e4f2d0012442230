//! `paddock approvals ls | show | approve | reject`: the approvals queue (`/v1/approvals`), and
//! `ls --watch`, which follows its changes (`GET /v1/approvals/events`, Server-Sent Events).

use super::lines::Lines;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use paddock_types::api::{
    ApprovalEvent, ApprovalInfo, ApprovalList, ApprovalState, DecideApprovalRequest, ListApprovalsQuery,
};
use reqwest::header::ACCEPT;
use reqwest::{Method, Response};
use serde::Serialize;

use super::{print_json, ApiClient, Table};
use crate::cli::ApprovalsLsArgs;

/// The widest summary in the table (a whole command line can be long).
const SUMMARY_WIDTH: usize = 48;
/// The widest summary in a `--watch` line.
const WATCH_SUMMARY_WIDTH: usize = 100;

pub async fn list(client: &ApiClient, args: ApprovalsLsArgs) -> anyhow::Result<ExitCode> {
    // Listening before listing: a change in between is printed (perhaps twice), never missed.
    let events = if args.watch {
        let response = client
            .send(
                client
                    .request(Method::GET, &["v1", "approvals", "events"])
                    .header(ACCEPT, "text/event-stream"),
            )
            .await?;
        Some(SseStream::new(response))
    } else {
        None
    };
    let query = ListApprovalsQuery {
        state: args.state.map(|s| ApprovalState::from(s).as_str().to_owned()),
        sandbox_id: args.sandbox.clone(),
        limit: args.limit,
    };
    let list: ApprovalList = client
        .json(client.request(Method::GET, &["v1", "approvals"]).query(&query))
        .await?;
    match (events, args.json) {
        (None, true) => print_json(&list)?,
        (None, false) => print!("{}", table(&list.approvals, SystemTime::now())),
        (Some(events), json) => {
            if json {
                print_line(&list)?;
            } else {
                print!("{}", table(&list.approvals, SystemTime::now()));
            }
            return watch(client, events, &args, json).await;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints each change of the queue (of `--sandbox`'s only, if given), until the stream ends. The
/// `--state` filter is the list's alone: a change is mostly an approval leaving its state.
async fn watch(
    client: &ApiClient,
    mut events: SseStream,
    args: &ApprovalsLsArgs,
    json: bool,
) -> anyhow::Result<ExitCode> {
    loop {
        let data = events.next().await.map_err(|e| {
            e.context(format!(
                "the approval event stream from the paddock server at {} broke off",
                client.url(&[])
            ))
        })?;
        let Some(data) = data else {
            anyhow::bail!(
                "the paddock server ended the approval event stream (it does when a reader falls far \
                 behind, or when it shuts down); run `paddock approvals ls --watch` again"
            );
        };
        let event: ApprovalEvent = serde_json::from_str(&data)
            .context("the server sent an approval event this client does not understand")?;
        let a = &event.approval;
        if args
            .sandbox
            .as_deref()
            .is_some_and(|s| a.sandbox_id.as_deref() != Some(s))
        {
            continue;
        }
        if json {
            print_line(&event)?;
        } else {
            println!("{}", watch_line(&event));
        }
    }
}

pub async fn show(client: &ApiClient, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let info: ApprovalInfo = client
        .json(client.request(Method::GET, &["v1", "approvals", id]))
        .await?;
    if json {
        print_json(&info)?;
    } else {
        print!("{}", describe(&info)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// What `approve` and `reject` do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Reject,
}

pub async fn decide(
    client: &ApiClient,
    id: &str,
    decision: Decision,
    note: Option<String>,
) -> anyhow::Result<ExitCode> {
    let (verb, done) = match decision {
        Decision::Approve => ("approve", "approved"),
        Decision::Reject => ("reject", "rejected"),
    };
    let info: ApprovalInfo = client
        .json(
            client
                .request(Method::POST, &["v1", "approvals", id, verb])
                .json(&DecideApprovalRequest { note }),
        )
        .await?;
    println!("{done} {}", info.id);
    Ok(ExitCode::SUCCESS)
}

/// `value` as one line of compact JSON.
fn print_line<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string(value).context("failed to render JSON")?;
    println!("{text}");
    Ok(())
}

/// The list as a table; ages and expiries relative to `now`.
fn table(approvals: &[ApprovalInfo], now: SystemTime) -> String {
    let mut table = Table::new([
        "ID",
        "STATE",
        "KIND",
        "SANDBOX",
        "SUMMARY",
        "REQUESTED BY",
        "AGE",
        "EXPIRES",
    ]);
    for a in approvals {
        // Only what may still happen expires: a pending decision, an approval not yet used.
        let open =
            a.state == ApprovalState::Pending || (a.state == ApprovalState::Approved && a.used_at.is_none());
        table.row([
            a.id.clone(),
            a.state.as_str().to_owned(),
            a.kind.as_str().to_owned(),
            a.sandbox_id.clone().unwrap_or_else(|| "-".into()),
            one_line(&a.summary, SUMMARY_WIDTH),
            a.requested_by.clone(),
            since(&a.created_at, now),
            if open {
                until(&a.expires_at, now)
            } else {
                "-".to_owned()
            },
        ]);
    }
    table.render()
}

/// One `--watch` line: `requested apr_... touch /tmp/x`, a decision with who made it and the note.
fn watch_line(event: &ApprovalEvent) -> String {
    let a = &event.approval;
    let mut line = format!(
        "{} {} {}",
        event.event,
        a.id,
        one_line(&a.summary, WATCH_SUMMARY_WIDTH)
    );
    if matches!(event.event.as_str(), "approved" | "rejected") {
        if let Some(by) = &a.decided_by {
            line.push_str(&format!(" (by {by}"));
            if let Some(note) = a.note.as_deref().filter(|n| !n.is_empty()) {
                line.push_str(&format!(": {}", one_line(note, WATCH_SUMMARY_WIDTH)));
            }
            line.push(')');
        }
    }
    line
}

/// `key value` lines describing an approval, then its request as pretty JSON.
fn describe(a: &ApprovalInfo) -> anyhow::Result<String> {
    let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let lines = [
        ("id", a.id.clone()),
        ("state", a.state.as_str().to_owned()),
        ("kind", a.kind.as_str().to_owned()),
        ("sandbox", or_dash(&a.sandbox_id)),
        ("summary", a.summary.clone()),
        ("policy", a.policy.clone()),
        (
            "rule",
            a.rule
                .map_or_else(|| "- (the policy's default)".to_owned(), |r| r.to_string()),
        ),
        ("reason", or_dash(&a.reason)),
        ("requested by", a.requested_by.clone()),
        ("created", a.created_at.clone()),
        ("expires", a.expires_at.clone()),
        ("decided", or_dash(&a.decided_at)),
        ("decided by", or_dash(&a.decided_by)),
        ("note", or_dash(&a.note)),
        ("used", or_dash(&a.used_at)),
        ("request sha256", a.request_sha256.clone()),
    ];
    let mut out: String = lines.iter().map(|(k, v)| format!("{k:<14} {v}\n")).collect();
    let request = serde_json::to_string_pretty(&a.request).context("failed to render JSON")?;
    out.push_str("request:\n");
    for line in request.lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

/// `text` on one line (control characters as spaces), cut to `max` characters.
pub(super) fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let mut cut: String = flat.chars().take(max.saturating_sub(3)).collect();
    cut.push_str("...");
    cut
}

/// How long ago the RFC 3339 time `at` was (`12s`, `5m`, `3h`, `2d`); `?` if it does not parse.
pub(super) fn since(at: &str, now: SystemTime) -> String {
    match humantime::parse_rfc3339_weak(at) {
        Ok(t) => short(now.duration_since(t).unwrap_or_default()),
        Err(_) => "?".to_owned(),
    }
}

/// How long until the RFC 3339 time `at` (`in 59m`), or `due` once it has passed.
fn until(at: &str, now: SystemTime) -> String {
    match humantime::parse_rfc3339_weak(at) {
        Ok(t) => match t.duration_since(now) {
            Ok(left) if !left.is_zero() => format!("in {}", short(left)),
            _ => "due".to_owned(),
        },
        Err(_) => "?".to_owned(),
    }
}

/// A duration in its largest whole unit.
fn short(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m", s / 60)
    } else if s < 86_400 {
        format!("{}h", s / 3600)
    } else {
        format!("{}d", s / 86_400)
    }
}

/// The `data` of each Server-Sent Event of a response body, as the events arrive (comments, such
/// as the server's keep-alives, and other fields are skipped).
struct SseStream {
    lines: Lines,
    frame: SseFrame,
}

impl SseStream {
    fn new(response: Response) -> Self {
        Self {
            lines: Lines::new(response),
            frame: SseFrame::default(),
        }
    }

    /// The next event's data; `None` at the end of the body (an unfinished event is dropped, as
    /// the SSE specification says).
    async fn next(&mut self) -> anyhow::Result<Option<String>> {
        while let Some(line) = self.lines.next().await? {
            let line = std::str::from_utf8(&line).context("the server sent an event that is not UTF-8")?;
            if let Some(data) = self.frame.line(line.strip_suffix('\r').unwrap_or(line)) {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}

/// The `data` lines of the event being read.
#[derive(Debug, Default)]
struct SseFrame {
    data: Option<String>,
}

impl SseFrame {
    /// Takes one line (without its line break); at the blank line that ends an event with data,
    /// returns that data.
    fn line(&mut self, line: &str) -> Option<String> {
        if line.is_empty() {
            return self.data.take();
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use paddock_types::api::ApprovalKind;

    use super::*;

    fn approval(state: ApprovalState) -> ApprovalInfo {
        ApprovalInfo {
            id: "apr_1".into(),
            state,
            kind: ApprovalKind::Exec,
            sandbox_id: Some("sb-1".into()),
            summary: "sh -c echo a\necho b".into(),
            request: serde_json::json!({"argv": ["touch", "/tmp/x"]}),
            request_sha256: "ab".into(),
            policy: "tenant".into(),
            rule: Some(0),
            reason: None,
            requested_by: "key1".into(),
            created_at: "2025-01-01T00:00:00.000Z".into(),
            expires_at: "2025-01-01T01:00:00.000Z".into(),
            decided_at: None,
            decided_by: None,
            note: None,
            used_at: None,
        }
    }

    #[test]
    fn sse_frames() {
        let mut f = SseFrame::default();
        let mut out = Vec::new();
        for line in [
            ": keep-alive",
            "",
            "event: requested",
            "data: {\"a\":1}",
            "",
            "data:x",
            "data: y",
            "",
            "event: nodata",
            "",
        ] {
            out.extend(f.line(line));
        }
        assert_eq!(out, ["{\"a\":1}", "x\ny"]);
    }

    #[test]
    fn table_rows() {
        let now = humantime::parse_rfc3339("2025-01-01T00:05:00Z").expect("time");
        let text = table(&[approval(ApprovalState::Pending)], now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("ID") && lines[0].ends_with("EXPIRES"),
            "{text}"
        );
        assert!(lines[1].starts_with("apr_1"), "{text}");
        assert!(
            lines[1].contains("sh -c echo a echo b") && lines[1].ends_with("5m   in 55m"),
            "{text}"
        );
        let done = table(&[approval(ApprovalState::Rejected)], now);
        assert!(done.lines().nth(1).expect("row").ends_with("5m   -"), "{done}");
    }

    #[test]
    fn summaries_are_one_short_line() {
        assert_eq!(one_line("a\tb\nc", 10), "a b c");
        assert_eq!(one_line("abcdefghij", 8), "abcde...");
        assert_eq!(one_line("ééééé", 5), "ééééé");
    }

    #[test]
    fn watch_lines() {
        let mut a = approval(ApprovalState::Approved);
        a.decided_by = Some("key2".into());
        a.note = Some("ok".into());
        let event = ApprovalEvent {
            event: "approved".into(),
            tenant: "t".into(),
            approval: a,
        };
        assert_eq!(
            watch_line(&event),
            "approved apr_1 sh -c echo a echo b (by key2: ok)"
        );
    }

    #[test]
    fn describes_every_field() {
        let text = describe(&approval(ApprovalState::Pending)).expect("describe");
        for needle in [
            "id             apr_1",
            "used           -",
            "request:\n  {\n",
            "\"touch\"",
        ] {
            assert!(text.contains(needle), "{needle:?} in {text}");
        }
    }
}

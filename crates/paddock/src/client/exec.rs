//! `paddock sandbox exec` (foreground over NDJSON, `--json`, `-d` background; `-i` goes through a
//! WebSocket, see `attach.rs`) and `paddock sandbox logs`.

use super::lines::Lines;
use std::process::ExitCode;

use anyhow::Context;
use paddock_types::api::{
    AttachQuery, ErrorCode, ExecEvent, ExecRequest, ExecResult, ExitInfo, PtySizeBody, StreamData,
};
use reqwest::header::ACCEPT;
use reqwest::{Method, Response};
use serde::de::DeserializeOwned;
use tokio::io::AsyncWriteExt;

use super::{print_json, ApiClient, ApiFailure, NDJSON};
use crate::cli::{ExecArgs, LogsArgs};

/// The exit status of a process killed by its `--timeout`, as timeout(1) uses.
pub const EXIT_TIMEOUT: u8 = 124;

/// paddock's exit status for a process that ended as `exit` says: its exit code (128+N for signal N),
/// or 124 when its timeout killed it.
pub fn exit_code(exit: &ExitInfo) -> u8 {
    if exit.timed_out {
        return EXIT_TIMEOUT;
    }
    match exit.signal {
        Some(sig) if exit.exit_code < 128 => (128 + sig).clamp(0, 255) as u8,
        _ if exit.exit_code < 0 => 1,
        _ => exit.exit_code.min(255) as u8,
    }
}

/// The request `exec` sends.
pub fn exec_request(args: &ExecArgs, pty: Option<PtySizeBody>) -> ExecRequest {
    ExecRequest {
        argv: (!args.command.is_empty()).then(|| args.command.clone()),
        shell: args.shell.clone(),
        env: args
            .env
            .iter()
            .map(|v| (v.key.clone(), v.value.clone()))
            .collect(),
        cwd: args.cwd.clone(),
        user: args.user.clone(),
        timeout_ms: args
            .timeout
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)),
        stdin: None,
        stdin_open: args.interactive,
        background: args.background,
        tag: args.tag.clone(),
        pty,
        approval_id: args.approval.clone(),
        approval_wait_ms: args
            .approval_wait
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    }
}

pub async fn exec(client: &ApiClient, args: ExecArgs) -> anyhow::Result<ExitCode> {
    run_exec(client, args).await.map_err(explain_pending)
}

/// An `approval_pending` answer said for this command line: which approval, how to approve it and
/// how to run the command under it.
fn explain_pending(e: anyhow::Error) -> anyhow::Error {
    let Some(failure) = e.downcast_ref::<ApiFailure>() else {
        return e;
    };
    match &failure.approval_id {
        Some(id) if failure.code == ErrorCode::ApprovalPending.as_str() => ApiFailure {
            message: format!(
                "approval {id} is pending: the approval policy asks a person first and nothing has run; \
                 once it is approved (`paddock approvals approve {id}`, with an approver key), run this \
                 command again with `--approval {id}`"
            ),
            ..failure.clone()
        }
        .into(),
        _ => e,
    }
}

async fn run_exec(client: &ApiClient, args: ExecArgs) -> anyhow::Result<ExitCode> {
    if args.interactive {
        return super::attach::exec_interactive(client, &args).await;
    }
    let pty = args.tty.then(super::attach::terminal_size);
    let request = exec_request(&args, pty);
    let endpoint = ["v1", "sandboxes", args.id.as_str(), "exec"];
    if args.background || args.json {
        let result: ExecResult = client
            .json(client.request(Method::POST, &endpoint).json(&request))
            .await?;
        if args.json {
            print_json(&result)?;
        } else {
            println!("{}", result.pid);
        }
        return Ok(ExitCode::from(result.exit.as_ref().map_or(0, exit_code)));
    }
    let response = client
        .send(
            client
                .request(Method::POST, &endpoint)
                .header(ACCEPT, NDJSON)
                .json(&request),
        )
        .await?;
    match print_events(client, response).await? {
        Some(exit) => Ok(ExitCode::from(exit_code(&exit))),
        None => anyhow::bail!("the paddock server ended the stream before the process exited"),
    }
}

pub async fn logs(client: &ApiClient, args: LogsArgs) -> anyhow::Result<ExitCode> {
    let pid = args.pid.to_string();
    let query = AttachQuery {
        stdout_from: args.stdout_from,
        stderr_from: args.stderr_from,
        follow: Some(args.follow),
    };
    let response = client
        .send(
            client
                .request(
                    Method::GET,
                    &["v1", "sandboxes", &args.id, "processes", &pid, "output"],
                )
                .header(ACCEPT, NDJSON)
                .query(&query),
        )
        .await?;
    print_events(client, response).await?;
    Ok(ExitCode::SUCCESS)
}

/// Copies a stream of exec events to stdout and stderr; returns how the process ended, if the stream
/// said so. An `error` event is returned as an [`ApiFailure`].
async fn print_events(client: &ApiClient, response: Response) -> anyhow::Result<Option<ExitInfo>> {
    let mut events = NdjsonStream::new(response);
    let mut out = Output::new();
    while let Some(event) = events.next::<ExecEvent>().await.map_err(|e| {
        e.context(format!(
            "the stream from the paddock server at {} broke off",
            client.url(&[])
        ))
    })? {
        match event {
            ExecEvent::Started { .. } => {}
            ExecEvent::Stdout(d) | ExecEvent::Pty(d) => out.stdout(&d).await?,
            ExecEvent::Stderr(d) => out.stderr(&d).await?,
            ExecEvent::Exit(info) => return Ok(Some(info)),
            ExecEvent::Error { code, message } => return Err(ApiFailure::new(code.as_str(), message).into()),
        }
    }
    Ok(None)
}

/// The bytes a [`StreamData`] carries; output that does not decode is an error, never written.
fn output_bytes(d: &StreamData) -> anyhow::Result<Vec<u8>> {
    d.bytes()
        .context("the paddock server sent output this client cannot decode")
}

/// This process's stdout and stderr, written as output arrives. A closed stdout (`| head`) is ignored:
/// the rest of the stream is still read to its end.
#[derive(Debug)]
pub struct Output {
    stdout: tokio::io::Stdout,
    stderr: tokio::io::Stderr,
}

impl Output {
    pub fn new() -> Self {
        Self {
            stdout: tokio::io::stdout(),
            stderr: tokio::io::stderr(),
        }
    }

    pub async fn stdout(&mut self, d: &StreamData) -> anyhow::Result<()> {
        self.stdout_bytes(&output_bytes(d)?).await;
        Ok(())
    }

    pub async fn stderr(&mut self, d: &StreamData) -> anyhow::Result<()> {
        let bytes = output_bytes(d)?;
        if self.stderr.write_all(&bytes).await.is_ok() {
            let _ = self.stderr.flush().await;
        }
        Ok(())
    }

    pub async fn stdout_bytes(&mut self, bytes: &[u8]) {
        if self.stdout.write_all(bytes).await.is_ok() {
            let _ = self.stdout.flush().await;
        }
    }
}

/// Newline-delimited JSON values read from a response body as they arrive.
#[derive(Debug)]
pub struct NdjsonStream(Lines);

impl NdjsonStream {
    pub fn new(response: Response) -> Self {
        Self(Lines::new(response))
    }

    /// The next value; `None` at the end of the body (blank lines are skipped).
    pub async fn next<T: DeserializeOwned>(&mut self) -> anyhow::Result<Option<T>> {
        while let Some(line) = self.0.next().await? {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return serde_json::from_slice(&line)
                .map(Some)
                .context("the server sent a line this client does not understand");
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: i32, signal: Option<i32>, timed_out: bool) -> ExitInfo {
        ExitInfo {
            exit_code: code,
            signal,
            timed_out,
            duration_ms: 1,
            cpu_time_us: 1,
            max_rss_kib: 1,
        }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(&exit(0, None, false)), 0);
        assert_eq!(exit_code(&exit(3, None, false)), 3);
        assert_eq!(exit_code(&exit(137, Some(9), false)), 137);
        assert_eq!(
            exit_code(&exit(9, Some(9), false)),
            137,
            "a bare signal number becomes 128+N"
        );
        assert_eq!(exit_code(&exit(137, Some(9), true)), 124, "a timeout wins");
        assert_eq!(exit_code(&exit(300, None, false)), 255);
        assert_eq!(exit_code(&exit(-1, None, false)), 1);
    }

    #[test]
    fn a_pending_approval_says_how_to_run_it() {
        let body = br#"{"code":"approval_pending","message":"held","approval_id":"apr_x"}"#;
        let e = explain_pending(ApiFailure::from_answer(reqwest::StatusCode::CONFLICT, body).into());
        let text = e.to_string();
        assert!(
            text.contains("paddock approvals approve apr_x")
                && text.contains("--approval apr_x")
                && text.ends_with("(approval_pending)"),
            "{text}"
        );
        let body = br#"{"code":"approval_expired","message":"approval apr_x expired","approval_id":"apr_x"}"#;
        let e = explain_pending(ApiFailure::from_answer(reqwest::StatusCode::GONE, body).into());
        assert_eq!(e.to_string(), "approval apr_x expired (approval_expired)");
    }

    #[test]
    fn stream_data_decodes() {
        let text = StreamData {
            offset: 0,
            data: Some("hi".into()),
            data_b64: None,
        };
        assert_eq!(output_bytes(&text).expect("text"), b"hi");
        let b64 = StreamData {
            offset: 0,
            data: None,
            data_b64: Some("/wA=".into()),
        };
        assert_eq!(output_bytes(&b64).expect("base64"), [0xff, 0x00]);
        let bad = StreamData {
            offset: 0,
            data: None,
            data_b64: Some("!!".into()),
        };
        let e = output_bytes(&bad).expect_err("invalid base64");
        assert!(format!("{e:#}").contains("cannot decode"), "{e:#}");
    }
}

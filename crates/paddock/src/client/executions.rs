//! `paddock execution propose | ls | show | cancel`: approved executions (`/v1/executions`).
//! `propose --wait` reads the execution every [`POLL_INTERVAL`] until it has ended, however long
//! the person takes to decide (the execution's own timeout bounds the run), then prints its logs
//! and exits with its exit code.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use paddock_types::api::{
    CreateExecutionRequest, ErrorCode, ExecutionInfo, ExecutionList, ExecutionState, ListExecutionsQuery,
};
use reqwest::Method;

use super::approvals::{one_line, since};
use super::exec::EXIT_TIMEOUT;
use super::{print_json, ApiClient, ApiFailure, Table};
use crate::cli::ProposeArgs;
use crate::EXIT_REQUEST_FAILED;

/// How often `--wait` reads the execution.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Reads in a row that may fail to reach the server (a restart, a network blip) before `--wait`
/// gives up: 30 seconds' worth.
const MAX_UNREACHABLE_READS: u32 = 120;
/// The widest command in the table.
const COMMAND_WIDTH: usize = 48;
/// The width of `show`'s keys.
const KEY_WIDTH: usize = 14;

/// The request `propose` sends: the whole command line as `command`, the timeout in whole
/// seconds (rounded up).
pub fn propose_request(args: &ProposeArgs) -> CreateExecutionRequest {
    CreateExecutionRequest {
        id: args.id.clone(),
        session_id: args.session_id.clone(),
        task_id: args.task_id.clone(),
        template: args.template.clone(),
        image: args.image.clone(),
        command: args.command.clone(),
        args: Vec::new(),
        env: args
            .env
            .iter()
            .map(|v| (v.key.clone(), v.value.clone()))
            .collect(),
        timeout_secs: args
            .timeout
            .map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0)),
        description: args.description.clone(),
    }
}

pub async fn propose(client: &ApiClient, args: ProposeArgs) -> anyhow::Result<ExitCode> {
    let info: ExecutionInfo = client
        .json(
            client
                .request(Method::POST, &["v1", "executions"])
                .json(&propose_request(&args)),
        )
        .await?;
    if !args.wait {
        if args.json {
            print_json(&info)?;
        } else {
            println!("{}", proposed_line(&info));
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Stdout is for the command's logs (or the ended execution's JSON) alone.
    eprintln!("{}", proposed_line(&info));
    let info = wait_until_ended(client, info).await?;
    if args.json {
        print_json(&info)?;
    } else if let Some(logs) = &info.logs {
        let mut stdout = std::io::stdout().lock();
        // A closed stdout (`| head`) does not change the exit status.
        let _ = stdout.write_all(logs.as_bytes()).and_then(|()| stdout.flush());
        if info.logs_truncated {
            eprintln!("paddock: {}", cut_line(&info.id));
        }
    }
    let (code, line) = ending(&info);
    if let Some(line) = line {
        eprintln!("paddock: {line}");
    }
    Ok(ExitCode::from(code))
}

/// What `propose` says of the execution it asked for.
fn proposed_line(info: &ExecutionInfo) -> String {
    if info.state == ExecutionState::PendingApproval {
        format!(
            "execution {} is pending approval {}: an approver key approves it with `paddock approvals \
             approve {}`",
            info.id, info.approval_id, info.approval_id
        )
    } else {
        // A repeated `--id`: the execution it made before.
        format!(
            "execution {} (approval {}) is already {}",
            info.id,
            info.approval_id,
            info.state.as_str()
        )
    }
}

/// Reads the execution until it has ended.
async fn wait_until_ended(client: &ApiClient, mut info: ExecutionInfo) -> anyhow::Result<ExecutionInfo> {
    let mut unreachable = 0;
    while !info.state.is_final() {
        tokio::time::sleep(POLL_INTERVAL).await;
        match client
            .json(client.request(Method::GET, &["v1", "executions", &info.id]))
            .await
        {
            Ok(now) => {
                info = now;
                unreachable = 0;
            }
            Err(e) if passing(&e) && unreachable < MAX_UNREACHABLE_READS => unreachable += 1,
            Err(e) => {
                return Err(e.context(format!(
                    "cannot read execution {} (it goes on; read it with `paddock execution show {}`)",
                    info.id, info.id
                )))
            }
        }
    }
    Ok(info)
}

/// Whether a failed read may be a moment's trouble: the server not reached, or busy.
fn passing(e: &anyhow::Error) -> bool {
    match e.downcast_ref::<ApiFailure>() {
        Some(f) => f.code == ErrorCode::Unavailable.as_str() || f.code.starts_with("http_5"),
        None => e.chain().any(|c| c.is::<reqwest::Error>()),
    }
}

/// The exit status of an ended execution, and the line saying why it did not run to an exit code
/// (rejected, cancelled, timed out, failed without one).
fn ending(info: &ExecutionInfo) -> (u8, Option<String>) {
    let said = |what: &str| {
        let mut line = format!("execution {} {what}", info.id);
        if let Some(message) = info.message.as_deref().filter(|m| !m.trim().is_empty()) {
            line.push_str(": ");
            line.push_str(&one_line(message, 400));
        }
        line
    };
    match (info.state, info.exit_code) {
        (ExecutionState::Succeeded, _) => (0, None),
        (ExecutionState::Failed, Some(code)) => (exit_status(code), None),
        (ExecutionState::Failed, None) => (EXIT_REQUEST_FAILED, Some(said("failed"))),
        (ExecutionState::TimedOut, _) => (EXIT_TIMEOUT, Some(said("timed out"))),
        (ExecutionState::Rejected, _) => (EXIT_REQUEST_FAILED, Some(said("was rejected"))),
        (ExecutionState::Cancelled, _) => (EXIT_REQUEST_FAILED, Some(said("was cancelled"))),
        (ExecutionState::PendingApproval | ExecutionState::Running, _) => (
            EXIT_REQUEST_FAILED,
            Some(format!("execution {} has not ended", info.id)),
        ),
    }
}

/// A failed command's exit code as an exit status: never 0 (it failed), at most 255.
fn exit_status(code: i64) -> u8 {
    match u8::try_from(code) {
        Ok(0) => 1,
        Ok(code) => code,
        Err(_) if code > 255 => 255,
        Err(_) => 1,
    }
}

/// The note that the server kept only the start of the output.
fn cut_line(id: &str) -> String {
    format!("the logs of execution {id} were cut: its output was longer than the server keeps")
}

pub async fn list(client: &ApiClient, limit: Option<u32>, json: bool) -> anyhow::Result<ExitCode> {
    let list: ExecutionList = client
        .json(
            client
                .request(Method::GET, &["v1", "executions"])
                .query(&ListExecutionsQuery { limit }),
        )
        .await?;
    if json {
        print_json(&list)?;
    } else {
        print!("{}", table(&list.executions, SystemTime::now()));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn show(client: &ApiClient, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let info: ExecutionInfo = client
        .json(client.request(Method::GET, &["v1", "executions", id]))
        .await?;
    if json {
        print_json(&info)?;
    } else {
        print!("{}", describe(&info));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn cancel(client: &ApiClient, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let info: ExecutionInfo = client
        .json(client.request(Method::POST, &["v1", "executions", id, "cancel"]))
        .await?;
    if json {
        print_json(&info)?;
    } else if info.state == ExecutionState::Cancelled {
        println!("cancelled {}", info.id);
    } else {
        println!("execution {} had already ended: {}", info.id, info.state.as_str());
    }
    Ok(ExitCode::SUCCESS)
}

/// The list as a table; ages relative to `now`.
fn table(executions: &[ExecutionInfo], now: SystemTime) -> String {
    let mut table = Table::new([
        "ID",
        "STATE",
        "EXECUTOR",
        "COMMAND",
        "REQUESTED BY",
        "APPROVED BY",
        "AGE",
    ]);
    for e in executions {
        table.row([
            e.id.clone(),
            e.state.as_str().to_owned(),
            e.executor.clone(),
            one_line(&command_line(&e.request), COMMAND_WIDTH),
            e.requested_by.clone(),
            e.approved_by.clone().unwrap_or_else(|| "-".into()),
            since(&e.created_at, now),
        ]);
    }
    table.render()
}

/// `key value` lines describing every field of an execution; its logs last.
fn describe(e: &ExecutionInfo) -> String {
    let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let r = &e.request;
    let env = r
        .env
        .iter()
        .map(|(k, v)| quote(&format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(" ");
    let lines = [
        ("id", e.id.clone()),
        ("state", e.state.as_str().to_owned()),
        ("description", e.description.clone()),
        ("command", command_line(r)),
        ("env", if env.is_empty() { "-".to_owned() } else { env }),
        ("template", or_dash(&r.template)),
        ("image", or_dash(&r.image)),
        (
            "timeout",
            r.timeout_secs
                .map_or_else(|| "- (the server's default)".to_owned(), |s| format!("{s}s")),
        ),
        ("executor", e.executor.clone()),
        ("object", or_dash(&e.object)),
        ("approval", e.approval_id.clone()),
        ("requested by", e.requested_by.clone()),
        ("approved by", or_dash(&e.approved_by)),
        ("client id", or_dash(&e.client_id)),
        ("session", or_dash(&e.session_id)),
        ("task", or_dash(&e.task_id)),
        (
            "exit code",
            e.exit_code.map_or_else(|| "-".to_owned(), |c| c.to_string()),
        ),
        ("message", or_dash(&e.message)),
        ("created", e.created_at.clone()),
        ("started", or_dash(&e.started_at)),
        ("finished", or_dash(&e.finished_at)),
    ];
    let mut out = String::new();
    for (key, value) in lines {
        // A value of several lines (a description) stays under its column.
        let value = value.replace('\n', &format!("\n{:KEY_WIDTH$} ", ""));
        let _ = writeln!(out, "{key:<KEY_WIDTH$} {value}");
    }
    match &e.logs {
        None => {
            let _ = writeln!(out, "{:<KEY_WIDTH$} -", "logs");
        }
        Some(logs) => {
            out.push_str("logs:\n");
            out.push_str(logs);
            if !logs.is_empty() && !logs.ends_with('\n') {
                out.push('\n');
            }
        }
    }
    if e.logs_truncated {
        let _ = writeln!(out, "({})", cut_line(&e.id));
    }
    out
}

/// The command line a request runs, each argument quoted as a POSIX shell would need.
fn command_line(r: &CreateExecutionRequest) -> String {
    r.command
        .iter()
        .chain(&r.args)
        .map(|a| quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `arg` as one shell word: as it is when it needs no quoting, else in single quotes.
fn quote(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-+=@%:,./".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        return arg.to_owned();
    }
    format!("'{}'", arg.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn execution(state: ExecutionState) -> ExecutionInfo {
        ExecutionInfo {
            id: "ex-1".into(),
            client_id: Some("inc-7".into()),
            session_id: None,
            task_id: Some("inc".into()),
            state,
            description: "restart the worker\nafter the deploy".into(),
            request: CreateExecutionRequest {
                command: vec!["sh".into(), "-c".into(), "echo hello; exit 4".into()],
                env: [("A".to_owned(), "1 2".to_owned())].into(),
                timeout_secs: Some(60),
                description: "restart the worker".into(),
                ..CreateExecutionRequest::default()
            },
            executor: "sandbox".into(),
            object: Some("sb-1".into()),
            approval_id: "apr_1".into(),
            requested_by: "key1".into(),
            approved_by: Some("key2".into()),
            exit_code: Some(4),
            logs: Some("hello".into()),
            logs_truncated: true,
            message: None,
            created_at: "2025-01-01T00:00:00.000Z".into(),
            started_at: Some("2025-01-01T00:01:00.000Z".into()),
            finished_at: None,
        }
    }

    #[test]
    fn the_request_carries_every_flag() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "paddock",
            "execution",
            "propose",
            "-d",
            "why",
            "--session",
            "s",
            "--timeout",
            "1500ms",
            "-e",
            "K=V",
            "--",
            "sh",
            "-c",
            "true",
        ])
        .expect("parses");
        let crate::cli::Command::Execution {
            command: crate::cli::ExecutionCommand::Propose(args),
        } = cli.command
        else {
            panic!("not propose");
        };
        let req = propose_request(&args);
        assert_eq!(
            serde_json::to_value(&req).expect("JSON"),
            serde_json::json!({
                "id": null, "session_id": "s", "task_id": null, "template": null, "image": null,
                "command": ["sh", "-c", "true"], "args": [], "env": {"K": "V"},
                "timeout_secs": 2, "description": "why"
            })
        );
    }

    #[test]
    fn endings_say_why_and_exit_as_the_command_did() {
        let mut e = execution(ExecutionState::Failed);
        assert_eq!(ending(&e), (4, None));
        e.exit_code = Some(300);
        assert_eq!(ending(&e).0, 255);
        e.exit_code = None;
        e.message = Some("no such template".into());
        assert_eq!(
            ending(&e),
            (1, Some("execution ex-1 failed: no such template".to_owned()))
        );
        e.state = ExecutionState::TimedOut;
        assert_eq!(ending(&e).0, 124);
        e.state = ExecutionState::Rejected;
        e.message = Some("its approval was rejected: nothing ran".into());
        assert_eq!(
            ending(&e),
            (
                1,
                Some("execution ex-1 was rejected: its approval was rejected: nothing ran".to_owned())
            )
        );
        e.state = ExecutionState::Cancelled;
        e.message = None;
        assert_eq!(ending(&e), (1, Some("execution ex-1 was cancelled".to_owned())));
        assert_eq!(ending(&execution(ExecutionState::Succeeded)), (0, None));
    }

    #[test]
    fn commands_are_quoted_for_a_shell() {
        assert_eq!(quote("a/b-c.d=e"), "a/b-c.d=e");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(
            command_line(&execution(ExecutionState::Running).request),
            "sh -c 'echo hello; exit 4'"
        );
    }

    #[test]
    fn table_rows() {
        let now = humantime::parse_rfc3339("2025-01-01T00:05:00Z").expect("time");
        let text = table(&[execution(ExecutionState::Failed)], now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ID") && lines[0].ends_with("AGE"), "{text}");
        for column in ["STATE", "EXECUTOR", "COMMAND", "REQUESTED BY", "APPROVED BY"] {
            assert!(lines[0].contains(column), "{text}");
        }
        assert!(
            lines[1].starts_with("ex-1")
                && lines[1].contains("failed")
                && lines[1].contains("sh -c 'echo hello; exit 4'")
                && lines[1].contains("key2")
                && lines[1].ends_with("5m"),
            "{text}"
        );
        let mut pending = execution(ExecutionState::PendingApproval);
        pending.approved_by = None;
        pending.request.command = vec!["x".repeat(100)];
        let text = table(&[pending], now);
        let row = text.lines().nth(1).expect("row");
        assert!(row.contains("...") && row.contains("  -  "), "{text}");
    }

    #[test]
    fn describes_every_field_logs_last() {
        let text = describe(&execution(ExecutionState::Failed));
        for needle in [
            "id             ex-1\n",
            "description    restart the worker\n               after the deploy\n",
            "command        sh -c 'echo hello; exit 4'\n",
            "env            'A=1 2'\n",
            "timeout        60s\n",
            "approved by    key2\n",
            "client id      inc-7\n",
            "session        -\n",
            "exit code      4\n",
            "finished       -\n",
        ] {
            assert!(text.contains(needle), "{needle:?} in {text}");
        }
        assert!(
            text.ends_with(
                "logs:\nhello\n(the logs of execution ex-1 were cut: its output was longer than the \
                 server keeps)\n"
            ),
            "{text}"
        );
        let mut pending = execution(ExecutionState::PendingApproval);
        pending.logs = None;
        pending.logs_truncated = false;
        assert!(
            describe(&pending).ends_with("logs           -\n"),
            "{}",
            describe(&pending)
        );
    }

    #[test]
    fn the_proposal_names_both_ids() {
        let line = proposed_line(&execution(ExecutionState::PendingApproval));
        assert!(
            line.starts_with("execution ex-1 is pending approval apr_1")
                && line.contains("paddock approvals approve apr_1"),
            "{line}"
        );
        assert_eq!(
            proposed_line(&execution(ExecutionState::Succeeded)),
            "execution ex-1 (approval apr_1) is already succeeded"
        );
    }
}

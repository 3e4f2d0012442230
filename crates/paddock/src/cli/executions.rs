//! Syntax of `paddock execution ...`: approved executions (`/v1/executions`), commands proposed for
//! a person to approve, then run once on the server's executor.

use std::time::Duration;

use clap::{Args, Subcommand};
use paddock_types::EnvVar;

use super::server::parse_human_duration;

/// `paddock execution ...`.
#[derive(Debug, Subcommand)]
pub enum ExecutionCommand {
    /// Propose a command: it waits in the approvals queue and runs once, on the server's executor,
    /// after an approver key approves it (`paddock approvals approve ID`); prints the execution's
    /// and the approval's ids.
    Propose(ProposeArgs),
    /// List executions, newest first.
    #[command(alias = "list")]
    Ls {
        /// At most this many [default: the server's, 100].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: Option<u32>,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one execution: what it runs, where it stands, who asked and approved, its exit code
    /// and logs.
    #[command(alias = "get")]
    Show {
        /// Execution id (ex-...).
        id: String,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel an execution: a pending one never runs, a running one is ended; an ended one is left
    /// as it is.
    Cancel {
        /// Execution id (ex-...).
        id: String,
        /// Print the API's JSON (the execution after the cancel).
        #[arg(long)]
        json: bool,
    },
}

/// `paddock execution propose`.
#[derive(Debug, Args)]
pub struct ProposeArgs {
    /// What it is for, for the person approving it.
    #[arg(long, short = 'd')]
    pub description: String,
    /// Your own id for it: proposing the same id again answers the first execution.
    #[arg(long)]
    pub id: Option<String>,
    /// Your session (an agent's conversation), kept and shown.
    #[arg(long = "session", value_name = "ID")]
    pub session_id: Option<String>,
    /// Your task, kept and shown.
    #[arg(long = "task", value_name = "ID")]
    pub task_id: Option<String>,
    /// The template of the sandbox it runs in (`sandbox` executor) [default: default].
    #[arg(long)]
    pub template: Option<String>,
    /// The container image it runs in (`kubernetes-job` executor) [default: the operator's].
    #[arg(long)]
    pub image: Option<String>,
    /// Environment variable (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<EnvVar>,
    /// The longest it may run, e.g. 30s, 10m (whole seconds, rounded up) [default and at most:
    /// the server's].
    #[arg(long, value_name = "DURATION", value_parser = parse_human_duration)]
    pub timeout: Option<Duration>,
    /// Then wait until it has ended (however long the approval takes), print its logs and exit
    /// with its exit code (124 when it timed out; 1 when rejected or cancelled). Interrupting the
    /// wait leaves the execution as it is.
    #[arg(long, short = 'w')]
    pub wait: bool,
    /// Print the API's JSON (with --wait: the ended execution, instead of its logs).
    #[arg(long)]
    pub json: bool,
    /// The program and its arguments.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command;

    /// The command `paddock <args>` parses to.
    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        use clap::Parser;
        crate::cli::Cli::try_parse_from([&["paddock"][..], args].concat()).map(|c| c.command)
    }

    fn propose(args: &[&str]) -> ProposeArgs {
        match parse(&[&["execution", "propose"][..], args].concat()) {
            Ok(Command::Execution {
                command: ExecutionCommand::Propose(a),
            }) => a,
            other => panic!("not execution propose: {other:?}"),
        }
    }

    #[test]
    fn propose_takes_every_field_and_the_command_after_dashes() {
        let a = propose(&[
            "--description",
            "restart the worker",
            "--id",
            "inc-7",
            "--session",
            "chat-1",
            "--task",
            "inc",
            "--template",
            "tools",
            "--image",
            "busybox",
            "--env",
            "A=1",
            "-e",
            "B=x=y",
            "--timeout",
            "2m",
            "--wait",
            "--json",
            "--",
            "sh",
            "-c",
            "echo hello; exit 4",
        ]);
        assert_eq!(
            (
                a.description.as_str(),
                a.id.as_deref(),
                a.session_id.as_deref(),
                a.task_id.as_deref(),
                a.template.as_deref(),
                a.image.as_deref(),
            ),
            (
                "restart the worker",
                Some("inc-7"),
                Some("chat-1"),
                Some("inc"),
                Some("tools"),
                Some("busybox")
            )
        );
        let env: Vec<(&str, &str)> = a.env.iter().map(|v| (v.key.as_str(), v.value.as_str())).collect();
        assert_eq!(env, [("A", "1"), ("B", "x=y")]);
        assert_eq!(a.timeout, Some(Duration::from_secs(120)));
        assert!(a.wait && a.json);
        assert_eq!(a.command, ["sh", "-c", "echo hello; exit 4"]);

        let a = propose(&["-d", "x", "--", "true", "--json"]);
        assert_eq!(
            (a.command, a.wait, a.json, a.timeout),
            (vec!["true".to_owned(), "--json".to_owned()], false, false, None),
            "flags after -- belong to the command"
        );
    }

    #[test]
    fn propose_refuses_what_is_missing_or_malformed() {
        for bad in [
            &["execution", "propose", "--", "true"][..],
            &["execution", "propose", "-d", "x"],
            &["execution", "propose", "-d", "x", "true"],
            &["execution", "propose", "-d", "x", "--env", "=1", "--", "true"],
            &["execution", "propose", "-d", "x", "--timeout", "0s", "--", "true"],
            &[
                "execution",
                "propose",
                "-d",
                "x",
                "--timeout",
                "soon",
                "--",
                "true",
            ],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ls_show_and_cancel() {
        assert!(matches!(
            parse(&["execution", "ls", "--limit", "5", "--json"]),
            Ok(Command::Execution {
                command: ExecutionCommand::Ls {
                    limit: Some(5),
                    json: true
                }
            })
        ));
        assert!(matches!(
            parse(&["executions", "list"]),
            Ok(Command::Execution {
                command: ExecutionCommand::Ls {
                    limit: None,
                    json: false
                }
            })
        ));
        match parse(&["execution", "show", "ex-1", "--json"]) {
            Ok(Command::Execution {
                command: ExecutionCommand::Show { id, json },
            }) => assert_eq!((id.as_str(), json), ("ex-1", true)),
            other => panic!("not execution show: {other:?}"),
        }
        match parse(&["execution", "cancel", "ex-1"]) {
            Ok(Command::Execution {
                command: ExecutionCommand::Cancel { id, json },
            }) => assert_eq!((id.as_str(), json), ("ex-1", false)),
            other => panic!("not execution cancel: {other:?}"),
        }
        for bad in [
            &["execution", "ls", "--limit", "0"][..],
            &["execution", "ls", "--limit", "1001"],
            &["execution", "show"],
            &["execution", "cancel"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}

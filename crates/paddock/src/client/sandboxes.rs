//! `paddock sandbox create | ls | get | rm | timeout`.

use std::process::ExitCode;
use std::time::Duration;

use paddock_types::api::{
    CreateSandboxRequest, LimitsRequest, ListSandboxesQuery, SandboxInfo, SandboxList, SandboxStateBody,
    SetTimeoutRequest,
};
use reqwest::Method;

use super::{print_json, ApiClient, Table};
use crate::cli::{CreateArgs, LsArgs};

/// Page size when listing.
const PAGE: u32 = 500;

pub async fn create(client: &ApiClient, args: CreateArgs) -> anyhow::Result<ExitCode> {
    let request = CreateSandboxRequest {
        template: args.template,
        limits: LimitsRequest {
            memory: args.memory,
            cpus: args.cpus,
            pids: args.pids,
            disk: args.disk,
        },
        env: args.env.into_iter().map(|v| (v.key, v.value)).collect(),
        workdir: args.workdir,
        user: args.user,
        labels: args.labels.into_iter().collect(),
        timeout_secs: args.timeout.map(|d| d.as_secs().max(1)),
        snapshot: args.snapshot,
        on_timeout: args.on_timeout.map(Into::into),
        audit_exec_diff: args.audit_exec_diff,
        volumes: args.volumes,
        network: args.net.policy()?,
        secrets: args.secrets,
        public_ports: args.public_ports,
    };
    let info: SandboxInfo = client
        .json(client.request(Method::POST, &["v1", "sandboxes"]).json(&request))
        .await?;
    if args.json {
        print_json(&info)?;
    } else {
        println!("{}", info.id);
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn list(client: &ApiClient, args: LsArgs) -> anyhow::Result<ExitCode> {
    let label = (!args.labels.is_empty()).then(|| {
        args.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    });
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let query = ListSandboxesQuery {
            state: args.state.clone(),
            label: label.clone(),
            limit: Some(PAGE),
            cursor: cursor.take(),
        };
        let page: SandboxList = client
            .json(client.request(Method::GET, &["v1", "sandboxes"]).query(&query))
            .await?;
        all.extend(page.sandboxes);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if args.json {
        print_json(&SandboxList {
            sandboxes: all,
            next_cursor: None,
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(["ID", "STATE", "TEMPLATE", "CREATED", "EXPIRES", "LABELS"]);
    for s in &all {
        table.row([
            s.id.clone(),
            state_name(s.state).to_owned(),
            s.template.clone(),
            s.created_at.clone(),
            s.expires_at.clone().unwrap_or_else(|| "-".into()),
            s.labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(","),
        ]);
    }
    table.print();
    Ok(ExitCode::SUCCESS)
}

pub async fn get(client: &ApiClient, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let info: SandboxInfo = client
        .json(client.request(Method::GET, &["v1", "sandboxes", id]))
        .await?;
    if json {
        print_json(&info)?;
    } else {
        print!("{}", describe(&info));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn remove(client: &ApiClient, ids: &[String]) -> anyhow::Result<ExitCode> {
    let mut failed = 0usize;
    for id in ids {
        match client
            .send(client.request(Method::DELETE, &["v1", "sandboxes", id]))
            .await
        {
            Ok(_) => println!("{id}"),
            Err(e) if ids.len() > 1 => {
                eprintln!("paddock: {}", crate::render_chain(&e));
                failed += 1;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub async fn set_timeout(
    client: &ApiClient,
    id: &str,
    duration: Duration,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let body = SetTimeoutRequest {
        timeout_secs: duration.as_secs().max(1),
    };
    let info: SandboxInfo = client
        .json(
            client
                .request(Method::POST, &["v1", "sandboxes", id, "timeout"])
                .json(&body),
        )
        .await?;
    if json {
        print_json(&info)?;
    } else {
        match &info.expires_at {
            Some(at) => println!("{id} expires at {at}"),
            None => println!("{id} never expires"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn state_name(state: SandboxStateBody) -> &'static str {
    match state {
        SandboxStateBody::Creating => "creating",
        SandboxStateBody::Running => "running",
        SandboxStateBody::Stopped => "stopped",
        SandboxStateBody::Killed => "killed",
        SandboxStateBody::Expired => "expired",
        SandboxStateBody::Failed => "failed",
    }
}

/// `key: value` lines describing a sandbox.
fn describe(s: &SandboxInfo) -> String {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let limit = |v: Option<String>| v.unwrap_or_else(|| "unlimited".into());
    let lines = [
        ("id", s.id.clone()),
        ("tenant", s.tenant.clone()),
        ("state", state_name(s.state).to_owned()),
        ("template", s.template.clone()),
        ("memory", limit(s.limits.memory.map(|m| m.to_string()))),
        ("cpus", limit(s.limits.cpus.map(|c| c.to_string()))),
        ("pids", limit(s.limits.pids.map(|p| p.to_string()))),
        ("disk", limit(s.limits.disk.map(|d| d.to_string()))),
        ("user", s.user.clone()),
        ("workdir", or_dash(s.workdir.clone())),
        (
            "env",
            or_dash((!s.env_keys.is_empty()).then(|| s.env_keys.join(","))),
        ),
        (
            "labels",
            or_dash((!s.labels.is_empty()).then(|| {
                s.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })),
        ),
        ("created", s.created_at.clone()),
        ("expires", or_dash(s.expires_at.clone())),
        ("ended", or_dash(s.ended_at.clone())),
        ("end reason", or_dash(s.end_reason.clone())),
    ];
    lines.iter().map(|(k, v)| format!("{k:<11} {v}\n")).collect()
}

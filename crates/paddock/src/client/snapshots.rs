//! `paddock sandbox snapshot|fork|checkpoint|rollback|commit|pause|stop|resume` and `paddock snapshot ...`.

use std::process::ExitCode;

use paddock_types::api::{
    CreateSnapshotRequest, ForkRequest, ForkResult, ListSnapshotsQuery, RollbackRequest, SandboxInfo,
    SnapshotInfo, SnapshotKindBody, SnapshotList,
};
use reqwest::Method;

use super::{print_json, ApiClient, Table};

const PAGE: u32 = 500;

pub async fn create(
    client: &ApiClient,
    id: &str,
    name: Option<String>,
    labels: Vec<(String, String)>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let request = CreateSnapshotRequest {
        name,
        labels: labels.into_iter().collect(),
    };
    let info: SnapshotInfo = client
        .json(
            client
                .request(Method::POST, &["v1", "sandboxes", id, "snapshots"])
                .json(&request),
        )
        .await?;
    print_snapshot(&info, json)
}

pub async fn fork(client: &ApiClient, id: &str, count: u32, json: bool) -> anyhow::Result<ExitCode> {
    let request = ForkRequest {
        count,
        labels: None,
        timeout_secs: None,
    };
    let result: ForkResult = client
        .json(
            client
                .request(Method::POST, &["v1", "sandboxes", id, "fork"])
                .json(&request),
        )
        .await?;
    if json {
        print_json(&result)?;
    } else {
        for sandbox in &result.sandboxes {
            println!("{}", sandbox.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn checkpoint(client: &ApiClient, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let info: SnapshotInfo = client
        .json(client.request(Method::POST, &["v1", "sandboxes", id, "checkpoint"]))
        .await?;
    print_snapshot(&info, json)
}

pub async fn rollback(
    client: &ApiClient,
    id: &str,
    snapshot: Option<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let info: SandboxInfo = client
        .json(
            client
                .request(Method::POST, &["v1", "sandboxes", id, "rollback"])
                .json(&RollbackRequest { snapshot }),
        )
        .await?;
    if json {
        print_json(&info)?;
    } else {
        println!("{}", info.id);
    }
    Ok(ExitCode::SUCCESS)
}

/// `commit`, `pause` or `resume`: a POST without a body; prints the sandbox id.
pub async fn step(client: &ApiClient, id: &str, operation: &str) -> anyhow::Result<ExitCode> {
    client
        .send(client.request(Method::POST, &["v1", "sandboxes", id, operation]))
        .await?;
    println!("{id}");
    Ok(ExitCode::SUCCESS)
}

pub async fn list(client: &ApiClient, sandbox: Option<String>, json: bool) -> anyhow::Result<ExitCode> {
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let query = ListSnapshotsQuery {
            sandbox: sandbox.clone(),
            kind: None,
            limit: Some(PAGE),
            cursor: cursor.take(),
        };
        let page: SnapshotList = client
            .json(client.request(Method::GET, &["v1", "snapshots"]).query(&query))
            .await?;
        all.extend(page.snapshots);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if json {
        return print_json(&SnapshotList {
            snapshots: all,
            next_cursor: None,
        })
        .map(|()| ExitCode::SUCCESS);
    }
    let mut table = Table::new(["ID", "KIND", "SANDBOX", "NAME", "CREATED"]);
    for s in &all {
        table.row([
            s.id.clone(),
            kind_name(s.kind).to_owned(),
            s.sandbox_id.clone().unwrap_or_else(|| "(imported)".into()),
            s.name.clone().unwrap_or_else(|| "-".into()),
            s.created_at.clone(),
        ]);
    }
    table.print();
    Ok(ExitCode::SUCCESS)
}

pub async fn get(client: &ApiClient, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let info: SnapshotInfo = client
        .json(client.request(Method::GET, &["v1", "snapshots", id]))
        .await?;
    if json {
        print_json(&info)?;
        return Ok(ExitCode::SUCCESS);
    }
    let bytes = |b: Option<u64>| {
        b.map_or_else(
            || "-".to_owned(),
            |b| paddock_types::ByteSize::bytes(b).to_string(),
        )
    };
    println!("id:         {}", info.id);
    println!("kind:       {}", kind_name(info.kind));
    println!(
        "sandbox:    {}",
        info.sandbox_id.as_deref().unwrap_or("(imported)")
    );
    println!("name:       {}", info.name.as_deref().unwrap_or("-"));
    println!("created:    {}", info.created_at);
    println!("referenced: {}", bytes(info.referenced_bytes));
    println!("exclusive:  {}", bytes(info.exclusive_bytes));
    Ok(ExitCode::SUCCESS)
}

pub async fn remove(client: &ApiClient, ids: &[String]) -> anyhow::Result<ExitCode> {
    for id in ids {
        client
            .send(client.request(Method::DELETE, &["v1", "snapshots", id]))
            .await?;
        println!("{id}");
    }
    Ok(ExitCode::SUCCESS)
}

fn print_snapshot(info: &SnapshotInfo, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        print_json(info)?;
    } else {
        println!("{}", info.id);
    }
    Ok(ExitCode::SUCCESS)
}

fn kind_name(kind: SnapshotKindBody) -> &'static str {
    match kind {
        SnapshotKindBody::Snapshot => "snapshot",
        SnapshotKindBody::Checkpoint => "checkpoint",
    }
}

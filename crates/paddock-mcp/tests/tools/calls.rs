//! What every tool call gets beside its result: one `mcp.call` audit row (tool, arguments or their
//! hash, outcome), progress notifications while a command runs, and cancellation that stops the
//! command's process.

use std::time::Duration;

use paddock_control::{Principal, SandboxService};
use paddock_mcp::{McpSettings, PaddockMcp};
use paddock_types::api::AuditQuery;
use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest, ProgressNotificationParam};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt as _};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::support::{call, failed, service, structured};

/// A client that passes on the progress notifications it gets.
#[derive(Clone)]
struct Progressed(mpsc::UnboundedSender<ProgressNotificationParam>);

impl ClientHandler for Progressed {
    async fn on_progress(&self, params: ProgressNotificationParam, _: NotificationContext<RoleClient>) {
        let _ = self.0.send(params);
    }
}

async fn connect_with(
    service: &SandboxService,
    principal: Principal,
    handler: Progressed,
) -> RunningService<RoleClient, Progressed> {
    let (server_end, client_end) = tokio::io::duplex(1 << 20);
    let server = PaddockMcp::new(service.clone(), principal, McpSettings::default());
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_end).await {
            let _ = running.waiting().await;
        }
    });
    handler.serve(client_end).await.expect("the client connects")
}

/// The tenant's `mcp.call` rows, oldest first.
async fn call_rows(service: &SandboxService, p: &Principal) -> Vec<(String, String, Value)> {
    let query = AuditQuery {
        action: Some("mcp.call".to_owned()),
        limit: Some(1000),
        ..AuditQuery::default()
    };
    let page = service.query_audit(p, query).await.expect("the audit log");
    page.records
        .into_iter()
        .map(|row| {
            let tool = row.detail["tool"].as_str().unwrap_or_default().to_owned();
            (tool, row.outcome, row.detail)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_reports_progress_and_a_cancelled_call_kills_it_and_every_call_is_a_row() {
    let (service, a, _) = service().await;
    let (tx, mut progress) = mpsc::unbounded_channel();
    let client = connect_with(&service, a.clone(), Progressed(tx)).await;
    let created = structured(&call(&client, "sandbox_create", json!({"timeout_secs": 300})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();
    let bad = failed(
        &call(
            &client,
            "run_command",
            json!({"sandbox_id": id, "command": "true", "timeout_secs": 0}),
        )
        .await,
    );
    assert!(bad.starts_with("invalid_request:"), "{bad}");
    let unknown = client.call_tool(CallToolRequestParams::new("no_such_tool")).await;
    assert!(unknown.is_err(), "{unknown:?}");
    let big = "x".repeat(4096);
    structured(
        &call(
            &client,
            "file_write",
            json!({"sandbox_id": id, "path": "/home/user/big.txt", "content": big}),
        )
        .await,
    );

    // A long command: its first output comes at once as progress (the time limit as the total).
    let arguments = json!({"sandbox_id": id, "command": "echo started; sleep 600", "timeout_secs": 900});
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(
        CallToolRequestParams::new("run_command")
            .with_arguments(arguments.as_object().cloned().unwrap_or_default()),
    ));
    let handle = client
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .expect("sent");
    let first = tokio::time::timeout(Duration::from_secs(60), progress.recv())
        .await
        .expect("progress within a minute")
        .expect("a notification");
    assert_eq!(
        (first.message.as_deref(), first.total),
        (Some("started"), Some(900.0)),
        "{first:?}"
    );
    let sid = id.parse().expect("a sandbox id");
    let running = service.list_processes(&a, &sid).await.expect("processes");
    assert!(
        running.processes.iter().any(|p| p.running),
        "the command runs: {running:?}"
    );

    // Cancelled: the call ends, and its process with it; the row says so.
    handle.cancel(Some("enough".to_owned())).await.expect("cancelled");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed = service.list_processes(&a, &sid).await.expect("processes");
        let rows = call_rows(&service, &a).await;
        if listed.processes.iter().all(|p| !p.running)
            && rows.iter().any(|(_, outcome, _)| outcome == "cancelled")
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cancelled command still runs: {listed:?} {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // One row per call: small arguments as given, large ones by size and hash.
    let rows = call_rows(&service, &a).await;
    let summary: Vec<(&str, &str)> = rows.iter().map(|(t, o, _)| (t.as_str(), o.as_str())).collect();
    assert_eq!(
        summary,
        [
            ("sandbox_create", "ok"),
            ("run_command", "invalid_request"),
            ("no_such_tool", "invalid_request"),
            ("file_write", "ok"),
            ("run_command", "cancelled"),
        ]
    );
    assert_eq!(
        rows[0].2["arguments"],
        json!({"timeout_secs": 300}),
        "{:?}",
        rows[0]
    );
    let write = &rows[3].2;
    assert!(write.get("arguments").is_none(), "{write}");
    assert!(
        write["arguments_bytes"].as_u64().is_some_and(|n| n > 4096),
        "{write}"
    );
    assert_eq!(
        write["arguments_sha256"].as_str().map(str::len),
        Some(64),
        "{write}"
    );
    let page = service
        .query_audit(
            &a,
            AuditQuery {
                action: Some("mcp.call".to_owned()),
                sandbox: Some(id.clone()),
                ..AuditQuery::default()
            },
        )
        .await
        .expect("rows of the sandbox");
    assert_eq!(page.records.len(), 3, "the rows naming the sandbox: {page:?}");

    client.cancel().await.expect("closed");
    service.shutdown().await;
}

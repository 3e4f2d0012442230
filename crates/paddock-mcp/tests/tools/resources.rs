//! A sandbox's files as resources (`paddock://sandbox/{id}/file/{+path}`): the template, reads as
//! text or blob, refusals (a malformed URI, a missing file, another tenant's sandbox), and a
//! subscription that hears the file change; and the `sandbox_rules` prompt.

use std::time::Duration;

use paddock_mcp::resources::{file_uri, FILE_TEMPLATE};
use paddock_mcp::{McpSettings, PaddockMcp};
use rmcp::model::ProtocolVersion;
use rmcp::model::{
    GetPromptRequestParams, ReadResourceRequestParams, ResourceContents, ResourceUpdatedNotificationParam,
    ServerNotification, SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
};
use rmcp::service::{serve_client_with_lifecycle, ClientLifecycleMode, NotificationContext};
use rmcp::{ClientHandler, RoleClient, ServiceExt as _};
use serde_json::json;
use tokio::sync::mpsc;

use crate::support::{call, connect, service, structured};

/// A client that passes on the resource updates it hears.
#[derive(Clone)]
struct Updates(mpsc::UnboundedSender<String>);

impl ClientHandler for Updates {
    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(params.uri);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    deprecated,
    reason = "resources/subscribe is the initialize-based generation's, tested here"
)]
async fn files_are_resources_that_can_be_read_and_watched() {
    let (service, a, b) = service().await;
    let (tx, mut updates) = mpsc::unbounded_channel();
    let (server_end, client_end) = tokio::io::duplex(1 << 20);
    let server = PaddockMcp::new(service.clone(), a.clone(), McpSettings::default());
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_end).await {
            let _ = running.waiting().await;
        }
    });
    let client = Updates(tx).serve(client_end).await.expect("connects");
    let info = client.peer_info().expect("server info");
    let resources = info.capabilities.resources.clone().expect("resources");
    assert_eq!(resources.subscribe, Some(true));

    let templates = client.list_all_resource_templates().await.expect("templates");
    assert_eq!(
        templates
            .iter()
            .map(|t| t.uri_template.as_str())
            .collect::<Vec<_>>(),
        [FILE_TEMPLATE]
    );
    let created = structured(&call(&client, "sandbox_create", json!({})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();
    structured(
        &call(
            &client,
            "file_write",
            json!({"sandbox_id": id, "path": "/home/user/notes/to do.txt", "content": "one\n"}),
        )
        .await,
    );
    let uri = file_uri(&id, "/home/user/notes/to do.txt");
    assert!(uri.ends_with("/file/home/user/notes/to%20do.txt"), "{uri}");
    let read = client
        .read_resource(ReadResourceRequestParams::new(uri.clone()))
        .await
        .expect("read");
    match &read.contents[..] {
        [ResourceContents::TextResourceContents {
            text, uri: read_uri, ..
        }] => {
            assert_eq!((text.as_str(), read_uri.as_str()), ("one\n", uri.as_str()));
        }
        other => panic!("not one text: {other:?}"),
    }
    for bad in [
        "file:///etc/passwd".to_owned(),
        file_uri(&id, "/home/user/absent.txt"),
        format!("paddock://sandbox/{id}/dir/x"),
    ] {
        let refused = client
            .read_resource(ReadResourceRequestParams::new(bad.clone()))
            .await;
        assert!(refused.is_err(), "{bad}: {refused:?}");
    }

    // Subscribed: a write of the file is heard, with its URI; unsubscribed, no more.
    client
        .subscribe(SubscribeRequestParams::new(uri.clone()))
        .await
        .expect("subscribed");
    structured(
        &call(
            &client,
            "file_write",
            json!({"sandbox_id": id, "path": "/home/user/notes/to do.txt", "content": "two\n"}),
        )
        .await,
    );
    let heard = tokio::time::timeout(Duration::from_secs(60), updates.recv())
        .await
        .expect("an update within a minute")
        .expect("an update");
    assert_eq!(heard, uri);
    client
        .unsubscribe(UnsubscribeRequestParams::new(uri.clone()))
        .await
        .expect("unsubscribed");

    // The stateless generation's subscriptions/listen: the same watch, for as long as it lasts.
    let (server_end, client_end) = tokio::io::duplex(1 << 20);
    let server = PaddockMcp::new(service.clone(), a, McpSettings::default());
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_end).await {
            let _ = running.waiting().await;
        }
    });
    let modern = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let stateless = serve_client_with_lifecycle((), client_end, modern)
        .await
        .expect("connects statelessly");
    let mut filter = SubscriptionFilter::new();
    filter.resource_subscriptions = Some(vec![uri.clone(), "file:///etc/passwd".to_owned()]);
    let mut listening = stateless.listen(filter).await.expect("listening");
    assert_eq!(
        listening.acknowledged().resource_subscriptions,
        Some(vec![uri.clone()]),
        "only a sandbox file is accepted"
    );
    // Once its watch is in place, the file gets one update ("read it now"): the acknowledgement
    // comes before the watch, so a change in between is not lost. After it, writes are heard.
    let live = tokio::time::timeout(Duration::from_secs(60), listening.next())
        .await
        .expect("the watch in place within a minute")
        .expect("the subscription lives");
    match live {
        Some(ServerNotification::ResourceUpdatedNotification(n)) => assert_eq!(n.params.uri, uri),
        other => panic!("not a resource update: {other:?}"),
    }
    structured(
        &call(
            &client,
            "file_write",
            json!({"sandbox_id": id, "path": "/home/user/notes/to do.txt", "content": "three\n"}),
        )
        .await,
    );
    let heard = tokio::time::timeout(Duration::from_secs(60), listening.next())
        .await
        .expect("an update within a minute")
        .expect("the subscription lives");
    match heard {
        Some(ServerNotification::ResourceUpdatedNotification(n)) => assert_eq!(n.params.uri, uri),
        other => panic!("not a resource update: {other:?}"),
    }
    drop(listening);
    stateless.cancel().await.expect("closed");

    // The prompt: the rules, and with a sandbox its particulars; another tenant's is not found.
    let prompts = client.list_all_prompts().await.expect("prompts");
    assert_eq!(
        prompts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["sandbox_rules"]
    );
    let mut request = GetPromptRequestParams::new("sandbox_rules");
    request.arguments = json!({"sandbox_id": id}).as_object().cloned();
    let rules = client.get_prompt(request).await.expect("the prompt");
    let text = serde_json::to_string(&rules.messages).expect("json");
    assert!(text.contains("checkpoint") && text.contains(&id), "{text}");

    let other = connect(&service, b).await;
    let theirs = other
        .read_resource(ReadResourceRequestParams::new(uri.clone()))
        .await;
    assert!(
        theirs
            .as_ref()
            .is_err_and(|e| e.to_string().contains("sandbox_not_found")),
        "{theirs:?}"
    );
    let mut request = GetPromptRequestParams::new("sandbox_rules");
    request.arguments = json!({"sandbox_id": id}).as_object().cloned();
    assert!(other.get_prompt(request).await.is_err());

    client.cancel().await.expect("closed");
    other.cancel().await.expect("closed");
    service.shutdown().await;
}

//! `run_code` against the fake backend, whose agent runs no kernels: the missing kernel as a tool
//! failure with the service's code, arguments refused (time limit, language, language with
//! context), another tenant's sandbox missing, and the output schema a client reads. (Cells that
//! run: the end-to-end tests.)

use serde_json::json;

use crate::support::{call, connect, failed, service, structured};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_code_refuses_with_the_services_codes() {
    let (service, a, b) = service().await;
    let client = connect(&service, a).await;
    let tools = client.list_all_tools().await.expect("tools");
    let tool = tools.iter().find(|t| t.name == "run_code").expect("run_code");
    let schema = serde_json::Value::Object((*tool.output_schema.clone().expect("a schema")).clone());
    for field in [
        "context",
        "status",
        "results",
        "stdout",
        "stderr",
        "error",
        "images",
        "truncated",
    ] {
        assert!(schema["properties"].get(field).is_some(), "{field}: {schema}");
    }

    let created = structured(&call(&client, "sandbox_create", json!({})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();
    let cell = |extra: serde_json::Value| {
        let mut args = json!({"sandbox_id": id, "code": "1 + 1"});
        if let (Some(args), Some(extra)) = (args.as_object_mut(), extra.as_object()) {
            args.extend(extra.clone());
        }
        args
    };

    let no_kernel = failed(&call(&client, "run_code", cell(json!({}))).await);
    assert!(no_kernel.starts_with("kernel_unavailable:"), "{no_kernel}");
    let no_kernel = failed(&call(&client, "run_code", cell(json!({"language": "bash"}))).await);
    assert!(no_kernel.starts_with("kernel_unavailable:"), "{no_kernel}");
    for bad in [
        json!({"timeout_secs": 0}),
        json!({"timeout_secs": 3601}),
        json!({"language": "cobol"}),
        json!({"language": "python", "context": "python"}),
    ] {
        let refused = failed(&call(&client, "run_code", cell(bad.clone())).await);
        assert!(refused.starts_with("invalid_request:"), "{bad}: {refused}");
    }
    let unknown = failed(&call(&client, "run_code", cell(json!({"context": "ctx-nope"}))).await);
    assert!(unknown.starts_with("context_not_found:"), "{unknown}");

    let other = connect(&service, b).await;
    let refused = failed(&call(&other, "run_code", cell(json!({}))).await);
    assert!(refused.starts_with("sandbox_not_found:"), "{refused}");

    structured(&call(&client, "sandbox_kill", json!({"sandbox_id": id})).await);
    let gone = failed(&call(&client, "run_code", cell(json!({}))).await);
    assert!(
        gone.starts_with("sandbox_not_found:") || gone.starts_with("sandbox_not_running:"),
        "{gone}"
    );
    client.cancel().await.expect("closed");
    other.cancel().await.expect("closed");
    service.shutdown().await;
}

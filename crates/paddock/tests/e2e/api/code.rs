//! Code contexts against real kernels: the default template's Python (the host's `/usr`, with
//! `python3-ipykernel`, matplotlib and pandas installed by `scripts/install-deps.sh`) started by the
//! agent and driven over the Jupyter protocol. State per context, results, errors, streaming,
//! timeouts, a dead kernel, the contexts API, audit rows, and the sandbox's network boundary.

use reqwest::Method;
use serde_json::{json, Value};
use sha2::Digest as _;

use crate::support::harness::{Client, Harness, Lines};

use super::{JSON, NDJSON, SOON};

/// Runs a cell answered as one JSON document; asserts 200.
async fn cell(a: &Client, id: &str, body: Value) -> Value {
    let r = Client::send(
        a.request(Method::POST, &format!("/v1/sandboxes/{id}/code"))
            .header("accept", JSON)
            .json(&body),
    )
    .await;
    r.ok(200)
}

/// The main result's text of a collected cell.
#[track_caller]
fn main_text(doc: &Value) -> String {
    let main = doc["results"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["is_main_result"] == true))
        .unwrap_or_else(|| panic!("no main result: {doc:#}"));
    main["text"].as_str().expect("text").to_owned()
}

#[test]
fn cells_keep_state_per_context_with_results_errors_streams_and_timeouts() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("code").await;
        let id = a.create_sandbox(json!({})).await;

        // State survives between cells of the default Python context, made at the first cell.
        let first = cell(&a, &id, json!({"code": "x = 1"})).await;
        assert_eq!((first["status"].as_str(), first["context"].as_str()), (Some("ok"), Some("python")), "{first:#}");
        let second = cell(&a, &id, json!({"code": "x + 1"})).await;
        assert_eq!(main_text(&second), "2", "{second:#}");
        assert_eq!(second["execution_count"], 2, "{second:#}");

        // Another context has its own state.
        let ctx = a.post(&format!("/v1/sandboxes/{id}/contexts"), json!({"language": "python"})).await.ok(201);
        let ctx_id = ctx["id"].as_str().expect("id").to_owned();
        assert_eq!((ctx["language"].as_str(), ctx["state"].as_str()), (Some("python"), Some("ready")), "{ctx:#}");
        let other = cell(&a, &id, json!({"code": "x", "context": ctx_id})).await;
        assert_eq!(other["status"], "error", "{other:#}");
        assert_eq!(other["error"]["name"], "NameError", "{other:#}");

        // An exception: its name, value and traceback; the context still works.
        let raised = cell(&a, &id, json!({"code": "1 / 0"})).await;
        assert_eq!(
            (raised["status"].as_str(), raised["error"]["name"].as_str(), raised["error"]["value"].as_str()),
            (Some("error"), Some("ZeroDivisionError"), Some("division by zero")),
            "{raised:#}"
        );
        assert!(raised["error"]["traceback"].as_str().is_some_and(|t| t.contains("ZeroDivisionError")), "{raised:#}");
        assert_eq!(main_text(&cell(&a, &id, json!({"code": "x"})).await), "1");

        // Output streams while the cell runs: the cell waits for a file the test makes only after
        // it has seen the first line.
        let resp = a
            .request(Method::POST, &format!("/v1/sandboxes/{id}/code"))
            .header("accept", NDJSON)
            .json(&json!({"code": "import os, time\nprint('first', flush=True)\nwhile not os.path.exists('/tmp/go'):\n    time.sleep(0.02)\nprint('second')"}))
            .send()
            .await
            .expect("answered");
        assert_eq!(resp.status(), 200);
        let mut lines = Lines::new(resp);
        let started = lines.next_within(SOON).await.expect("started");
        assert_eq!((started["type"].as_str(), started["context"].as_str()), (Some("started"), Some("python")), "{started}");
        loop {
            let event = lines.next_within(SOON).await.expect("an event before the end");
            assert_ne!(event["type"], "end", "the cell ended before the test let it: {event}");
            if event["type"] == "stdout" {
                assert_eq!(event["text"], "first\n", "{event}");
                break;
            }
        }
        a.sh(&id, "touch /tmp/go").await;
        let rest = lines.rest(SOON).await;
        let out: String = rest.iter().filter(|e| e["type"] == "stdout").filter_map(|e| e["text"].as_str()).collect();
        assert_eq!(out, "second\n", "{rest:?}");
        assert_eq!(rest.last().map(|e| (e["type"].clone(), e["status"].clone())), Some((json!("end"), json!("ok"))), "{rest:?}");

        // A runaway cell is interrupted at its time limit; the kernel and its state live on.
        let spun = cell(&a, &id, json!({"code": "while True: pass", "timeout_ms": 500})).await;
        assert_eq!(spun["status"], "timed_out", "{spun:#}");
        assert_eq!(main_text(&cell(&a, &id, json!({"code": "x + 41"})).await), "42");

        // Rich results: a DataFrame as HTML and text, a matplotlib figure as PNG without show().
        let frame = cell(&a, &id, json!({"code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"})).await;
        let main = frame["results"].as_array().and_then(|r| r.iter().find(|r| r["is_main_result"] == true)).cloned().expect("main");
        assert!(main["html"].as_str().is_some_and(|h| h.contains("<table")), "{frame:#}");
        assert!(main["text"].as_str().is_some_and(|t| t.contains('a') && t.contains('4')), "{frame:#}");
        let plot = cell(&a, &id, json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.title('t')"})).await;
        let png = plot["results"]
            .as_array()
            .and_then(|r| r.iter().find_map(|r| r["png"].as_str()))
            .unwrap_or_else(|| panic!("no PNG: {plot:#}"));
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD.decode(png.trim()).expect("base64");
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // ...with its data beside it: a line chart of the points drawn.
        let chart = plot["results"]
            .as_array()
            .and_then(|r| r.iter().find_map(|r| r.get("chart").cloned()))
            .unwrap_or_else(|| panic!("no chart: {plot:#}"));
        assert_eq!((chart["type"].as_str(), chart["title"].as_str()), (Some("line"), Some("t")), "{chart:#}");
        assert_eq!(chart["elements"][0]["points"], json!([[1.0, 4.0], [2.0, 1.0], [3.0, 9.0]]), "{chart:#}");
        let bars = cell(&a, &id, json!({"code": "plt.figure()\nplt.bar(['a', 'b'], [3, 5])"})).await;
        let chart = bars["results"]
            .as_array()
            .and_then(|r| r.iter().find_map(|r| r.get("chart").cloned()))
            .unwrap_or_else(|| panic!("no chart: {bars:#}"));
        assert_eq!(chart["type"], "bar", "{chart:#}");
        let values: Vec<(String, f64)> = chart["elements"]
            .as_array()
            .expect("elements")
            .iter()
            .map(|e| (e["label"].as_str().unwrap_or_default().to_owned(), e["value"].as_f64().unwrap_or_default()))
            .collect();
        assert_eq!(values, [("a".to_owned(), 3.0), ("b".to_owned(), 5.0)], "{chart:#}");
        // A box plot: each box's quartiles, whiskers and outliers.
        let boxes = cell(&a, &id, json!({"code": "plt.figure()\nplt.boxplot([[1, 2, 3, 4, 5, 20]], vert=False)"})).await;
        let chart = boxes["results"]
            .as_array()
            .and_then(|r| r.iter().find_map(|r| r.get("chart").cloned()))
            .unwrap_or_else(|| panic!("no chart: {boxes:#}"));
        assert_eq!(chart["type"], "box_and_whisker", "{chart:#}");
        assert_eq!(
            chart["elements"][0],
            json!({"label": "1", "min": 1.0, "first_quartile": 2.25, "median": 3.5, "third_quartile": 4.75, "max": 5.0, "outliers": [20.0]}),
            "{chart:#}"
        );
        // The setup that adds charts is not a cell: the first user cell was execution 1.
        assert_eq!(first["execution_count"], 1, "{first:#}");

        // A kernel cannot reach what a shell in the sandbox cannot: the server's own loopback port.
        let port = a.base.rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse::<u16>().ok()).expect("the server's port");
        let refused = cell(&a, &id, json!({"code": format!("import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)")})).await;
        assert_eq!(refused["error"]["name"], "ConnectionRefusedError", "{refused:#}");
        let shell = a.exec_json(&id, json!({"shell": format!("exec 3<>/dev/tcp/127.0.0.1/{port}")})).await;
        assert_ne!(shell["exit"]["exit_code"], 0, "{shell:#}");

        // A killed kernel: the context is dead until restarted; a restart loses its state.
        let pid = a.get(&format!("/v1/sandboxes/{id}/contexts")).await.ok(200)["contexts"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["id"] == "python"))
            .and_then(|c| c["pid"].as_u64())
            .expect("the python context's pid");
        a.sh(&id, &format!("kill -9 {pid}")).await;
        let after = Client::send(
            a.request(Method::POST, &format!("/v1/sandboxes/{id}/code"))
                .header("accept", JSON)
                .json(&json!({"code": "x"})),
        )
        .await;
        if after.status == 200 {
            assert_eq!(after.json()["status"], "kernel_died", "{after:?}");
            let list = a.get(&format!("/v1/sandboxes/{id}/contexts")).await.ok(200);
            assert!(list["contexts"].as_array().expect("contexts").iter().any(|c| c["id"] == "python" && c["state"] == "dead"), "{list:#}");
        } else {
            after.err(422, "kernel_unavailable");
        }
        let restarted = a.post(&format!("/v1/sandboxes/{id}/contexts/python/restart"), json!({})).await.ok(200);
        assert_eq!(restarted["state"], "ready", "{restarted:#}");
        assert_ne!(restarted["pid"].as_u64(), Some(pid));
        assert_eq!(cell(&a, &id, json!({"code": "x"})).await["error"]["name"], "NameError");
        assert_eq!(main_text(&cell(&a, &id, json!({"code": "1 + 1"})).await), "2");

        // Bash keeps its state too (bash_kernel, in its own default context).
        let set = cell(&a, &id, json!({"code": "X=5; cd /tmp", "language": "bash"})).await;
        assert_eq!((set["status"].as_str(), set["context"].as_str()), (Some("ok"), Some("bash")), "{set:#}");
        let got = cell(&a, &id, json!({"code": "echo $((X + 1)) $(pwd)", "language": "bash"})).await;
        assert_eq!(got["stdout"].as_array().map(|s| s.iter().filter_map(|t| t.as_str()).collect::<String>()), Some("6 /tmp\n".to_owned()), "{got:#}");
        // A cell's own variables, in Python and Bash: set for it (child processes see them),
        // restored after it (X keeps its value, CELL_VAR is unset again).
        let py = cell(&a, &id, json!({"code": "import os, subprocess\nprint(os.environ['CELL_VAR'], subprocess.run(['sh', '-c', 'echo $CELL_VAR'], capture_output=True, text=True).stdout, end='')", "env": {"CELL_VAR": "a b'c"}})).await;
        assert_eq!(stdout(&py), "a b'c a b'c\n", "{py:#}");
        assert_eq!(main_text(&cell(&a, &id, json!({"code": "'CELL_VAR' in os.environ"})).await), "False");
        let sh = cell(&a, &id, json!({"code": "echo \"$X $CELL_VAR\"", "language": "bash", "env": {"CELL_VAR": "$(id)", "X": "7"}})).await;
        assert_eq!(stdout(&sh), "7 $(id)\n", "{sh:#}");
        let sh = cell(&a, &id, json!({"code": "echo \"$X ${CELL_VAR-unset}\"", "language": "bash"})).await;
        assert_eq!(stdout(&sh), "5 unset\n", "{sh:#}");
        let bad = a.post(&format!("/v1/sandboxes/{id}/code"), json!({"code": "1", "env": {"1A": "x"}})).await.err(400, "invalid_request");
        assert_eq!(bad["field"], "env.1A", "{bad}");

        // Contexts: listed, removed, then unknown.
        let list = a.get(&format!("/v1/sandboxes/{id}/contexts")).await.ok(200);
        let ids: Vec<&str> = list["contexts"].as_array().expect("contexts").iter().filter_map(|c| c["id"].as_str()).collect();
        assert_eq!(ids, ["python", ctx_id.as_str(), "bash"], "{list:#}");
        a.delete(&format!("/v1/sandboxes/{id}/contexts/{ctx_id}")).await.ok(204);
        a.post(&format!("/v1/sandboxes/{id}/code"), json!({"code": "1", "context": ctx_id}))
            .await
            .err(404, "context_not_found");
        a.delete(&format!("/v1/sandboxes/{id}/contexts/{ctx_id}")).await.err(404, "context_not_found");

        // Bad input.
        let bad = a.post(&format!("/v1/sandboxes/{id}/code"), json!({"code": "1", "language": "cobol"})).await.err(400, "invalid_request");
        assert_eq!(bad["field"], "language", "{bad}");
        let bad = a
            .post(&format!("/v1/sandboxes/{id}/code"), json!({"code": "1", "language": "python", "context": "python"}))
            .await
            .err(400, "invalid_request");
        assert_eq!(bad["field"], "context", "{bad}");
        a.post(&format!("/v1/sandboxes/{id}/code"), json!({"code": "1", "timeout_ms": 0})).await.err(400, "invalid_request");

        // Another tenant sees nothing.
        let b = h.admin.new_tenant("code-other").await;
        b.get(&format!("/v1/sandboxes/{id}/contexts")).await.err(404, "sandbox_not_found");
        b.post(&format!("/v1/sandboxes/{id}/code"), json!({"code": "1"})).await.err(404, "sandbox_not_found");

        // Every cell is an audit row with its context and the code's hash.
        let rows = a.audit_rows(&[("action", "code.run")]).await;
        let sha = hex::encode(sha2::Sha256::digest(b"x = 1"));
        assert!(
            rows.iter().any(|r| r["detail"]["code_sha256"] == sha.as_str() && r["detail"]["context"] == "python"),
            "{rows:#?}"
        );
        assert!(rows.len() >= 14, "{} rows", rows.len());
        let contexts = a.audit_rows(&[("action", "code.context")]).await;
        let ops: Vec<&str> = contexts.iter().filter_map(|r| r["detail"]["op"].as_str()).collect();
        assert_eq!(ops, ["create", "create", "restart", "create", "delete"], "{contexts:#?}");
    });
}

/// The stdout of a collected cell, joined.
fn stdout(doc: &Value) -> String {
    doc["stdout"]
        .as_array()
        .map(|s| s.iter().filter_map(|t| t.as_str()).collect())
        .unwrap_or_default()
}

#[test]
fn javascript_contexts_keep_state_stream_raise_time_out_and_stay_inside_the_sandbox() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("code-js").await;
        let id = a.create_sandbox(json!({})).await;

        // Deno's kernel: state between cells, plain text results (no colour codes), TypeScript,
        // top-level await, console output.
        // The first cell names the default context by its id: it is made then, as by language.
        let first = cell(&a, &id, json!({"code": "let x = 1; console.log('hi'); x", "context": "javascript"})).await;
        assert_eq!((first["status"].as_str(), first["context"].as_str()), (Some("ok"), Some("javascript")), "{first:#}");
        assert_eq!(stdout(&first), "hi\n", "{first:#}");
        assert_eq!(main_text(&first), "1", "{first:#}");
        let second = cell(&a, &id, json!({"code": "x + 1", "language": "js"})).await;
        assert_eq!((main_text(&second), second["execution_count"].as_u64()), ("2".to_owned(), Some(2)), "{second:#}");
        // A kernel is its user's session: HOME is the user's home (Deno keeps its cache there).
        let home = cell(&a, &id, json!({"code": "[Deno.env.get('HOME'), Deno.env.get('USER')].join(' ')", "language": "javascript"})).await;
        assert_eq!(main_text(&home), r#""/home/user user""#, "{home:#}");
        let typed = cell(&a, &id, json!({"code": "const n: number = await Promise.resolve(41); n + x", "language": "typescript"})).await;
        assert_eq!(main_text(&typed), "42", "{typed:#}");
        // A cell's own variables: set for it, gone after it.
        let with_env = cell(&a, &id, json!({"code": "Deno.env.get('CELL_VAR')", "language": "javascript", "env": {"CELL_VAR": "it's \"v\""}})).await;
        assert_eq!(main_text(&with_env), r#"`it's "v"`"#, "{with_env:#}");
        let without = cell(&a, &id, json!({"code": "Deno.env.get('CELL_VAR') ?? 'unset'", "language": "javascript"})).await;
        assert_eq!(main_text(&without), r#""unset""#, "{without:#}");
        let html = cell(&a, &id, json!({"code": "Deno.jupyter.html`<b>bold</b>`", "language": "javascript"})).await;
        assert!(html["results"].as_array().is_some_and(|r| r.iter().any(|r| r["html"] == "<b>bold</b>")), "{html:#}");

        // An exception: its name and value; the context still works.
        let raised = cell(&a, &id, json!({"code": "throw new TypeError('bad thing')", "language": "javascript"})).await;
        assert_eq!(
            (raised["status"].as_str(), raised["error"]["name"].as_str(), raised["error"]["value"].as_str()),
            (Some("error"), Some("TypeError"), Some("bad thing")),
            "{raised:#}"
        );
        assert_eq!(main_text(&cell(&a, &id, json!({"code": "x", "language": "javascript"})).await), "1");

        // A runaway loop is interrupted at its time limit (by an interrupt_request: SIGINT would
        // end Deno's process); the kernel and its state live on.
        let pid = |list: &Value| {
            list["contexts"].as_array().and_then(|c| c.iter().find(|c| c["id"] == "javascript")).and_then(|c| c["pid"].as_u64())
        };
        let before = pid(&a.get(&format!("/v1/sandboxes/{id}/contexts")).await.ok(200));
        let spun = cell(&a, &id, json!({"code": "while (true) {}", "language": "javascript", "timeout_ms": 500})).await;
        assert_eq!(spun["status"], "timed_out", "{spun:#}");
        assert_eq!(main_text(&cell(&a, &id, json!({"code": "x + 41", "language": "javascript"})).await), "42");
        assert_eq!(pid(&a.get(&format!("/v1/sandboxes/{id}/contexts")).await.ok(200)), before);

        // A kernel cannot reach what a shell in the sandbox cannot: the server's own loopback port.
        let port = a.base.rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse::<u16>().ok()).expect("the server's port");
        let refused = cell(
            &a,
            &id,
            json!({"code": format!("await fetch('http://127.0.0.1:{port}/v1/sandboxes').then(() => 'reached', (e) => 'refused: ' + e)"), "language": "javascript"}),
        )
        .await;
        assert!(main_text(&refused).contains("refused"), "{refused:#}");

        // A cell that awaits what never settles cannot be interrupted: at its time limit, after
        // the grace, the kernel is given up (killed, the context dead) and a restart brings it back.
        let stuck = cell(&a, &id, json!({"code": "await new Promise(() => {})", "language": "javascript", "timeout_ms": 300})).await;
        assert_eq!(stuck["status"], "timed_out", "{stuck:#}");
        let list = a.get(&format!("/v1/sandboxes/{id}/contexts")).await.ok(200);
        assert!(list["contexts"].as_array().expect("contexts").iter().any(|c| c["id"] == "javascript" && c["state"] == "dead"), "{list:#}");
        // Killed: it is gone once the agent reaped it (the wait is bounded; it fails if it stays).
        let gone = before.expect("the javascript context's pid");
        a.sh(&id, &format!("timeout 20 sh -c 'while kill -0 {gone} 2>/dev/null; do sleep 0.05; done'")).await;
        a.post(&format!("/v1/sandboxes/{id}/contexts/javascript/restart"), json!({})).await.ok(200);
        let fresh = cell(&a, &id, json!({"code": "typeof x", "language": "javascript"})).await;
        assert_eq!(main_text(&fresh), "\"undefined\"", "{fresh:#}");
    });
}

#[test]
fn a_warm_pool_starts_kernels_ahead_and_a_claim_with_other_settings_drops_them() {
    let opts = crate::support::harness::Options {
        templates: vec![(
            "notebook".to_owned(),
            paddock_control::TemplateConfig {
                rootfs: paddock_types::RootfsSpec::Host,
                warm_pool_size: 2,
                image: None,
                recipe: None,
                debian: None,
                kernels: vec!["python".to_owned()],
                build: Default::default(),
            },
        )],
        ..Default::default()
    };
    let h = Harness::with(opts);
    h.block_on(async {
        let a = h.admin.new_tenant("code-warm").await;
        crate::support::harness::poll(SOON * 3, "the notebook pool with its kernels", || async {
            let metrics = h.admin.get("/metrics").await.text();
            (super::templates::warm_gauge(&metrics, "notebook") == Some(2)).then_some(())
        })
        .await;
        // Claimed with the pool's settings: its python context is running before any cell.
        let id = a.create_sandbox(json!({"template": "notebook"})).await;
        let list = a.get(&format!("/v1/sandboxes/{id}/contexts")).await.ok(200);
        let contexts = list["contexts"].as_array().expect("contexts");
        assert_eq!(contexts.len(), 1, "{list:#}");
        assert_eq!(
            (contexts[0]["id"].as_str(), contexts[0]["state"].as_str()),
            (Some("python"), Some("ready")),
            "{list:#}"
        );
        let first = cell(&a, &id, json!({"code": "import os; os.getuid()"})).await;
        assert_eq!(first["execution_count"], 1, "{first:#}");
        assert_eq!(main_text(&first), "1000", "{first:#}");
        // Claimed with its own environment: the kernels started ahead are dropped, and the first
        // cell starts one with the request's settings.
        let id = a
            .create_sandbox(json!({"template": "notebook", "env": {"GREETING": "hi"}}))
            .await;
        let list = a.get(&format!("/v1/sandboxes/{id}/contexts")).await.ok(200);
        assert_eq!(list["contexts"].as_array().map(Vec::len), Some(0), "{list:#}");
        let greeting = cell(&a, &id, json!({"code": "import os; os.environ['GREETING']"})).await;
        assert_eq!(main_text(&greeting), "'hi'", "{greeting:#}");
        let claims = a
            .audit_rows(&[("action", "sandbox.create")])
            .await
            .into_iter()
            .filter(|r| r["detail"]["source"] == "pool")
            .count();
        assert_eq!(claims, 2, "both creates were claims from the pool");
        // The context handed over with the first claim is in its tenant's audit log (op warm,
        // with the kernel's pid); the dropped ones are not.
        let rows = a.audit_rows(&[("action", "code.context")]).await;
        let ops: Vec<(&str, &str)> = rows
            .iter()
            .filter_map(|r| Some((r["detail"]["op"].as_str()?, r["detail"]["context"].as_str()?)))
            .collect();
        assert_eq!(ops, [("warm", "python"), ("create", "python")], "{rows:#?}");
        assert_eq!(rows[0]["detail"]["pid"], contexts[0]["pid"], "{rows:#?}");
    });
}

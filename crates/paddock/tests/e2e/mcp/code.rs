//! MCP's `run_code` on a real sandbox with the host's kernels (`python3-ipykernel`, matplotlib,
//! `bash_kernel`, installed by `scripts/install-deps.sh`): state between cells, streams, an
//! exception as data, a figure as a PNG image block beside the structured result, a time limit
//! that interrupts the cell and keeps the state, Bash, and a cut stated.

use base64::Engine as _;
use serde_json::json;

use crate::support::harness::Harness;
use crate::support::mcp::{call, connect, ok};

#[test]
fn cells_keep_state_stream_raise_as_data_draw_time_out_and_cut() {
    let h = Harness::start();
    h.block_on(async {
        let tenant = h.admin.new_tenant("mcpcode").await;
        let id = tenant.create_sandbox(json!({})).await;
        let service = h.service.clone().expect("the service");
        let client = connect(&service, tenant.key.as_deref().expect("a key")).await;
        let cell = |code: &str| json!({"sandbox_id": id, "code": code});

        let first = ok(&call(&client, "run_code", cell("x = 41")).await);
        assert_eq!(
            (first["status"].as_str(), first["context"].as_str()),
            (Some("ok"), Some("python")),
            "{first}"
        );
        let second = ok(&call(&client, "run_code", cell("x + 1")).await);
        let main = &second["results"][0];
        assert_eq!(
            (main["is_main_result"].as_bool(), main["text"].as_str()),
            (Some(true), Some("42")),
            "{second}"
        );
        assert!(
            second["execution_count"].as_u64() > first["execution_count"].as_u64(),
            "{second}"
        );

        let printed = ok(&call(
            &client,
            "run_code",
            cell("import sys\nprint('hi')\nprint('e', file=sys.stderr)"),
        )
        .await);
        assert_eq!(
            (printed["stdout"].as_str(), printed["stderr"].as_str()),
            (Some("hi\n"), Some("e\n")),
            "{printed}"
        );

        // An exception is the cell's answer, not a tool failure.
        let raised = call(&client, "run_code", cell("1 / 0")).await;
        let raised_doc = ok(&raised);
        assert_eq!(
            (
                raised_doc["status"].as_str(),
                raised_doc["error"]["name"].as_str(),
                raised_doc["error"]["value"].as_str()
            ),
            (Some("error"), Some("ZeroDivisionError"), Some("division by zero")),
            "{raised_doc}"
        );
        let traceback = raised_doc["error"]["traceback"].as_str().expect("a traceback");
        assert!(
            traceback.contains("ZeroDivisionError") && !traceback.contains('\u{1b}'),
            "{traceback}"
        );

        // A figure: a PNG image block after the structured result's text.
        let plot = call(
            &client,
            "run_code",
            cell("import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])"),
        )
        .await;
        let plot_doc = ok(&plot);
        assert_eq!(plot_doc["images"], 1, "{plot_doc}");
        let text = plot.content[0].as_text().expect("the text mirror");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text.text).ok(),
            Some(plot_doc.clone())
        );
        let image = plot.content[1].as_image().expect("an image block");
        assert_eq!(image.mime_type, "image/png");
        let png = base64::engine::general_purpose::STANDARD
            .decode(&image.data)
            .expect("base64");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");

        // A time limit interrupts the cell; the state stays.
        let slow = ok(&call(
            &client,
            "run_code",
            json!({"sandbox_id": id, "code": "import time\ntime.sleep(600)", "timeout_secs": 1}),
        )
        .await);
        assert_eq!(slow["status"], "timed_out", "{slow}");
        let after = ok(&call(&client, "run_code", cell("x")).await);
        assert_eq!(after["results"][0]["text"], "41", "{after}");

        // Bash, and output past the cap is cut and says so.
        let bash = ok(&call(
            &client,
            "run_code",
            json!({"sandbox_id": id, "language": "bash", "code": "echo $((1 + 2))"}),
        )
        .await);
        assert_eq!(
            (bash["context"].as_str(), bash["stdout"].as_str().map(str::trim)),
            (Some("bash"), Some("3")),
            "{bash}"
        );
        let long = ok(&call(&client, "run_code", cell("print('x' * (300 * 1024))")).await);
        assert_eq!(long["truncated"], true, "{}", long["truncated"]);
        assert!(long["stdout"].as_str().is_some_and(|s| s.len() <= 256 * 1024));

        ok(&call(&client, "sandbox_kill", json!({"sandbox_id": id})).await);
        client.cancel().await.expect("closed");
    });
}

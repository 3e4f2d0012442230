//! `paddock sandbox code`: one cell in a code context, its output printed as it arrives (stdout
//! and stderr to this process's), text results on stdout, images saved when asked, the exception
//! on stderr. Exit status: 0, 1 when the cell raised (or its kernel died), 124 when it timed out,
//! 130 when it was interrupted.

use std::io::Read as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use base64::Engine as _;
use paddock_types::api::{CodeEvent, CodeResult, CodeRunResult, CodeStatus, RunCodeRequest};
use reqwest::header::ACCEPT;
use reqwest::Method;

use super::exec::{NdjsonStream, Output, EXIT_TIMEOUT};
use super::{print_json, ApiClient, NDJSON};
use crate::cli::CodeArgs;

pub async fn code(client: &ApiClient, args: CodeArgs) -> anyhow::Result<ExitCode> {
    let code = match (&args.code, &args.file) {
        (Some(code), _) if code != "-" => code.clone(),
        (_, Some(file)) => {
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
        }
        _ => {
            let mut code = String::new();
            std::io::stdin()
                .read_to_string(&mut code)
                .context("reading the code from stdin")?;
            code
        }
    };
    let request = RunCodeRequest {
        code,
        language: args.language.clone(),
        context: args.context.clone(),
        timeout_ms: args
            .timeout
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)),
        env: args
            .env
            .iter()
            .map(|v| (v.key.clone(), v.value.clone()))
            .collect(),
    };
    let endpoint = ["v1", "sandboxes", args.id.as_str(), "code"];
    if args.json {
        let result: CodeRunResult = client
            .json(
                client
                    .request(Method::POST, &endpoint)
                    .header(ACCEPT, "application/json")
                    .json(&request),
            )
            .await?;
        print_json(&result)?;
        return Ok(status_code(result.status));
    }
    let response = client
        .send(
            client
                .request(Method::POST, &endpoint)
                .header(ACCEPT, NDJSON)
                .json(&request),
        )
        .await?;
    let mut events = NdjsonStream::new(response);
    let mut out = Output::new();
    let mut images = 0usize;
    while let Some(event) = events.next::<CodeEvent>().await? {
        match event {
            CodeEvent::Started { .. } | CodeEvent::ExecutionCount { .. } => {}
            CodeEvent::Stdout { text } => out.stdout_bytes(text.as_bytes()).await,
            CodeEvent::Stderr { text } => eprint!("{text}"),
            CodeEvent::Result(result) => {
                if let Some(dir) = &args.save_images {
                    images += save_images(dir, &result, images)?;
                }
                if let Some(text) = &result.text {
                    out.stdout_bytes(format!("{text}\n").as_bytes()).await;
                }
            }
            CodeEvent::Error(error) => eprintln!(
                "{}",
                if error.traceback.is_empty() {
                    format!("{}: {}", error.name, error.value)
                } else {
                    error.traceback
                }
            ),
            CodeEvent::End { status, .. } => return Ok(status_code(status)),
            CodeEvent::Failed { message, .. } => anyhow::bail!("the cell did not finish: {message}"),
        }
    }
    anyhow::bail!("the paddock server ended the stream before the cell ended")
}

fn status_code(status: CodeStatus) -> ExitCode {
    ExitCode::from(match status {
        CodeStatus::Ok => 0,
        CodeStatus::Error | CodeStatus::KernelDied => 1,
        CodeStatus::TimedOut => EXIT_TIMEOUT,
        CodeStatus::Interrupted => 130,
    })
}

/// Writes the result's images as `result-N.png|jpeg|svg` in `dir`; how many it wrote.
fn save_images(dir: &Path, result: &CodeResult, first: usize) -> anyhow::Result<usize> {
    let mut n = 0;
    let b64 = base64::engine::general_purpose::STANDARD;
    let images = [
        ("png", result.png.as_ref().map(|d| b64.decode(d.trim()))),
        ("jpeg", result.jpeg.as_ref().map(|d| b64.decode(d.trim()))),
        ("svg", result.svg.as_ref().map(|s| Ok(s.clone().into_bytes()))),
    ];
    for (ext, data) in images {
        let Some(data) = data else { continue };
        let data = data.with_context(|| format!("the cell's {ext} image is not valid base64"))?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("result-{}.{ext}", first + n + 1));
        std::fs::write(&path, data).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("saved {}", path.display());
        n += 1;
    }
    Ok(n)
}

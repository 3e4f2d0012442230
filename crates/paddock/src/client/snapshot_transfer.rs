//! `paddock snapshot export ID [-o FILE]` and `paddock snapshot import FILE|-`: a snapshot as a tar
//! stream, both ways streamed (neither holds the archive in memory).

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use futures_util::StreamExt;
use paddock_types::api::{ExportSnapshotQuery, ImportSnapshotQuery, SnapshotInfo};
use reqwest::{Body, Method};
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio_util::io::ReaderStream;

use super::{print_json, ApiClient};

pub async fn export(
    client: &ApiClient,
    id: &str,
    output: Option<&Path>,
    keep_setid: bool,
) -> anyhow::Result<ExitCode> {
    if output.is_none() && std::io::stdout().is_terminal() {
        return Err(crate::UsageError::new(
            "refusing to write a tar archive to a terminal: use -o FILE or redirect stdout",
        )
        .into());
    }
    let response = client
        .send(
            client
                .request(Method::GET, &["v1", "snapshots", id, "export"])
                .query(&ExportSnapshotQuery {
                    keep_setid: keep_setid.then_some(true),
                })
                .header(reqwest::header::ACCEPT, "application/x-tar"),
        )
        .await?;
    let written = match output {
        Some(path) => {
            let file = tokio::fs::File::create(path)
                .await
                .with_context(|| format!("cannot create {}", path.display()))?;
            let copied = copy_body(response, file).await;
            if copied.is_err() {
                // A partial archive is worse than none.
                let _ = tokio::fs::remove_file(path).await;
            }
            copied
        }
        None => copy_body(response, tokio::io::stdout()).await,
    };
    written.map(|_| ExitCode::SUCCESS)
}

async fn copy_body(
    response: reqwest::Response,
    mut out: impl tokio::io::AsyncWrite + Unpin,
) -> anyhow::Result<u64> {
    let mut body = response.bytes_stream();
    let mut total = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("the export broke off")?;
        out.write_all(&chunk)
            .await
            .context("failed to write the archive")?;
        total += chunk.len() as u64;
    }
    out.flush().await.context("failed to write the archive")?;
    Ok(total)
}

pub async fn import(
    client: &ApiClient,
    file: &str,
    name: Option<String>,
    labels: Vec<(String, String)>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let input: Box<dyn AsyncRead + Send + Unpin> = if file == "-" {
        Box::new(tokio::io::stdin())
    } else {
        Box::new(
            tokio::fs::File::open(file)
                .await
                .with_context(|| format!("cannot open {file}"))?,
        )
    };
    let labels: std::collections::BTreeMap<String, String> = labels.into_iter().collect();
    let query = ImportSnapshotQuery {
        name,
        labels: if labels.is_empty() {
            None
        } else {
            Some(serde_json::to_string(&labels).context("failed to encode the labels")?)
        },
    };
    let body = Body::wrap_stream(ReaderStream::with_capacity(input, 64 * 1024));
    let info: SnapshotInfo = client
        .json(
            client
                .request(Method::POST, &["v1", "snapshots", "import"])
                .query(&query)
                .header(reqwest::header::CONTENT_TYPE, "application/x-tar")
                .body(body),
        )
        .await?;
    if json {
        print_json(&info)?;
    } else {
        println!("{}", info.id);
    }
    Ok(ExitCode::SUCCESS)
}

//! The HTTP client of `paddock sandbox ...` and `paddock audit`: one [`ApiClient`] per invocation
//! (`PADDOCK_URL`, `PADDOCK_API_KEY`, or the server host's `<state>/admin.key`), human output by default
//! and the API's exact JSON with `--json`. An error answer becomes an [`ApiFailure`], printed as
//! `paddock: <message> (<code>)` with exit status 1.

mod approvals;
mod attach;
mod code;
mod cp;
mod exec;
mod executions;
mod lines;
mod network;
mod policy;
mod port_forward;
mod sandboxes;
mod snapshot_transfer;
mod snapshots;
mod table;
mod template_upload;
mod templates;

pub(crate) use templates::read_recipe;
mod volumes;

use std::fmt;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use paddock_types::api::ApiErrorBody;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION};
use reqwest::{Method, RequestBuilder, Response, Url};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use table::Table;

use crate::cli::{
    ApprovalCommand, ExecutionCommand, PolicyCommand, SandboxCommand, SecretCommand, SnapshotCommand,
    TemplateCommand, VolumeCommand,
};

/// The server's address when `PADDOCK_URL` is not set.
pub const DEFAULT_URL: &str = "http://127.0.0.1:7420";
/// NDJSON, the streaming answer of exec, output and watch endpoints.
pub const NDJSON: &str = "application/x-ndjson";

/// An error answer of the API (or one that the client reports the same way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFailure {
    /// Machine-readable code (`sandbox_not_found`, ...).
    pub code: String,
    /// The message.
    pub message: String,
    /// The approval a held request waits on (`approval_pending`, `approval_rejected`,
    /// `approval_expired`).
    pub approval_id: Option<String>,
}

impl ApiFailure {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            approval_id: None,
        }
    }

    /// The failure an error answer describes: its JSON body when it has one, the status otherwise.
    pub fn from_answer(status: reqwest::StatusCode, body: &[u8]) -> Self {
        match serde_json::from_slice::<ApiErrorBody>(body) {
            Ok(b) => {
                let message = match b.field {
                    Some(field) => format!("{field}: {}", b.message),
                    None => b.message,
                };
                Self {
                    approval_id: b.approval_id,
                    ..Self::new(b.code.as_str(), message)
                }
            }
            Err(_) => {
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                let reason = status.canonical_reason().unwrap_or("error");
                let message = if text.is_empty() || text.len() > 200 || text.contains('\n') {
                    format!("the server answered {} {reason}", status.as_u16())
                } else {
                    format!("the server answered {} {reason}: {text}", status.as_u16())
                };
                Self::new(format!("http_{}", status.as_u16()), message)
            }
        }
    }
}

impl fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for ApiFailure {}

/// A client of one paddock server.
#[derive(Debug, Clone)]
pub struct ApiClient {
    http: reqwest::Client,
    base: Url,
    key: String,
}

impl ApiClient {
    /// A client of the server at `base` using `key`.
    pub fn new(base: &str, key: String) -> anyhow::Result<Self> {
        let mut base = Url::parse(base)
            .map_err(|e| crate::UsageError::new(format!("invalid PADDOCK_URL {base:?}: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(
                crate::UsageError::new(format!("invalid PADDOCK_URL {base}: use http://HOST:PORT")).into(),
            );
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .user_agent(concat!("paddock/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("failed to set up the HTTP client")?;
        Ok(Self { http, base, key })
    }

    /// The client the environment describes: `PADDOCK_URL` (default [`DEFAULT_URL`]) and
    /// `PADDOCK_API_KEY`, or, when that is unset, the admin key the server wrote into `state_dir`.
    pub fn from_environment(state_dir: &Path) -> anyhow::Result<Self> {
        let url = std::env::var("PADDOCK_URL")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_URL.to_owned());
        let key =
            match std::env::var("PADDOCK_API_KEY") {
                Ok(k) if !k.trim().is_empty() => k.trim().to_owned(),
                _ => match std::fs::read_to_string(state_dir.join("admin.key")) {
                    Ok(k) if !k.trim().is_empty() => k.trim().to_owned(),
                    _ => return Err(crate::UsageError::new(
                        "no API key: set PADDOCK_API_KEY (on the server host, root can use the admin key in \
                         the state directory)",
                    )
                    .into()),
                },
            };
        Self::new(url.trim(), key)
    }

    /// The API key it authenticates with.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The URL of the endpoint made of `segments` (each percent-encoded as one path segment).
    pub fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// A request to `segments`, authenticated. (No `Accept` header: each caller sets the one it wants,
    /// [`ApiClient::json`] JSON.)
    pub fn request(&self, method: Method, segments: &[&str]) -> RequestBuilder {
        self.http
            .request(method, self.url(segments))
            .header(AUTHORIZATION, format!("Bearer {}", self.key))
    }

    /// Sends a request; an error answer becomes an [`ApiFailure`].
    pub async fn send(&self, request: RequestBuilder) -> anyhow::Result<Response> {
        let response = request.send().await.map_err(|e| self.transport_error(e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.bytes().await.unwrap_or_default();
        Err(ApiFailure::from_answer(status, &body).into())
    }

    /// Sends a request and decodes its JSON answer.
    pub async fn json<T: DeserializeOwned>(&self, request: RequestBuilder) -> anyhow::Result<T> {
        let response = self.send(request.header(ACCEPT, "application/json")).await?;
        let body = response.bytes().await.map_err(|e| self.transport_error(e))?;
        serde_json::from_slice(&body).context("the server's answer is not the JSON this client expects")
    }

    fn transport_error(&self, e: reqwest::Error) -> anyhow::Error {
        let what = if e.is_connect() {
            format!("cannot reach the paddock server at {}", self.base)
        } else {
            format!("the connection to the paddock server at {} failed", self.base)
        };
        // The URL is already named; reqwest repeats it in its own message.
        anyhow::Error::new(e.without_url()).context(what)
    }

    /// Opens a WebSocket to `segments` with the query `query`.
    pub async fn websocket(
        &self,
        segments: &[&str],
        query: &[(&str, String)],
    ) -> anyhow::Result<attach::Socket> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::Error as WsError;
        let mut url = self.url(segments);
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let scheme = if url.scheme() == "https" { "wss" } else { "ws" };
        let _ = url.set_scheme(scheme);
        let mut request = url
            .as_str()
            .into_client_request()
            .context("invalid WebSocket address")?;
        let auth = HeaderValue::from_str(&format!("Bearer {}", self.key))
            .map_err(|_| crate::UsageError::new("the API key contains characters not allowed in a header"))?;
        request.headers_mut().insert(AUTHORIZATION, auth);
        match tokio_tungstenite::connect_async(request).await {
            Ok((socket, _)) => Ok(socket),
            Err(WsError::Http(answer)) => {
                let body = answer.body().as_deref().unwrap_or_default();
                Err(ApiFailure::from_answer(answer.status(), body).into())
            }
            Err(e) => Err(anyhow::Error::new(e).context(format!(
                "cannot open a WebSocket to the paddock server at {}",
                self.base
            ))),
        }
    }
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("failed to render JSON")?;
    println!("{text}");
    Ok(())
}

/// Runs a `paddock sandbox` command.
pub fn sandbox(state_dir: &Path, command: SandboxCommand) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_environment(state_dir)?;
    block_on(async move {
        match command {
            SandboxCommand::Create(args) => sandboxes::create(&client, args).await,
            SandboxCommand::Ls(args) => sandboxes::list(&client, args).await,
            SandboxCommand::Get { id, json } => sandboxes::get(&client, &id, json).await,
            SandboxCommand::Rm { ids } => sandboxes::remove(&client, &ids).await,
            SandboxCommand::Timeout { id, duration, json } => {
                sandboxes::set_timeout(&client, &id, duration, json).await
            }
            SandboxCommand::Exec(args) => exec::exec(&client, args).await,
            SandboxCommand::Code(args) => code::code(&client, args).await,
            SandboxCommand::Shell(args) => attach::shell(&client, args).await,
            SandboxCommand::Cp(args) => cp::copy(&client, args).await,
            SandboxCommand::Logs(args) => exec::logs(&client, args).await,
            SandboxCommand::Snapshot {
                id,
                name,
                labels,
                json,
            } => snapshots::create(&client, &id, name, labels, json).await,
            SandboxCommand::Fork { id, count, json } => snapshots::fork(&client, &id, count, json).await,
            SandboxCommand::Checkpoint { id, json } => snapshots::checkpoint(&client, &id, json).await,
            SandboxCommand::Rollback { id, snapshot, json } => {
                snapshots::rollback(&client, &id, snapshot, json).await
            }
            SandboxCommand::Commit { id } => snapshots::step(&client, &id, "commit").await,
            SandboxCommand::Pause { id } => snapshots::step(&client, &id, "pause").await,
            SandboxCommand::Stop { id } => snapshots::step(&client, &id, "stop").await,
            SandboxCommand::Resume { id } => snapshots::step(&client, &id, "resume").await,
            SandboxCommand::Network(args) => network::show_or_set(&client, args).await,
            SandboxCommand::PortForward(args) => port_forward::forward(&client, args).await,
        }
    })
}

/// Runs a `paddock snapshot` command.
pub fn snapshot(state_dir: &Path, command: SnapshotCommand) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_environment(state_dir)?;
    block_on(async move {
        match command {
            SnapshotCommand::Ls { sandbox, json } => snapshots::list(&client, sandbox, json).await,
            SnapshotCommand::Get { id, json } => snapshots::get(&client, &id, json).await,
            SnapshotCommand::Rm { ids } => snapshots::remove(&client, &ids).await,
            SnapshotCommand::Export {
                id,
                output,
                keep_setid,
            } => snapshot_transfer::export(&client, &id, output.as_deref(), keep_setid).await,
            SnapshotCommand::Import {
                file,
                name,
                labels,
                json,
            } => snapshot_transfer::import(&client, &file, name, labels, json).await,
        }
    })
}

/// Runs a `paddock volume` command.
pub fn volume(state_dir: &Path, command: VolumeCommand) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_environment(state_dir)?;
    block_on(async move {
        match command {
            VolumeCommand::Create {
                name,
                size,
                labels,
                json,
            } => volumes::create(&client, name, size, labels, json).await,
            VolumeCommand::Ls { json } => volumes::list(&client, json).await,
            VolumeCommand::Get { volume, json } => volumes::get(&client, &volume, json).await,
            VolumeCommand::Rm { volumes } => volumes::remove(&client, &volumes).await,
        }
    })
}

/// Runs a `paddock template` command.
pub fn template(state_dir: &Path, command: TemplateCommand) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_environment(state_dir)?;
    block_on(async move {
        match command {
            TemplateCommand::Build(args) => {
                let args = *args;
                let source = templates::BuildSource {
                    from: args.from,
                    recipe: args.file.map(|f| templates::read_recipe(&f)).transpose()?,
                    build_args: args.build_args.into_iter().collect(),
                    network: args.net.policy()?,
                    context: args.context,
                };
                templates::build(&client, args.name, source, args.start, args.json).await
            }
            TemplateCommand::Ls { json } => templates::list(&client, json).await,
            TemplateCommand::Get { template, json } => templates::get(&client, &template, json).await,
            TemplateCommand::Rm { templates } => templates::remove(&client, &templates).await,
        }
    })
}

pub fn secret(state_dir: &Path, command: SecretCommand) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_environment(state_dir)?;
    block_on(async move {
        match command {
            SecretCommand::Create {
                name,
                hosts,
                headers,
                query,
                from_env,
            } => {
                let binding = network::Binding {
                    hosts,
                    headers,
                    query,
                };
                network::create_secret(&client, name, binding, from_env).await
            }
            SecretCommand::Ls { json } => network::list_secrets(&client, json).await,
            SecretCommand::Rm { names } => network::remove_secrets(&client, &names).await,
        }
    })
}

/// Runs a `paddock approvals` command.
pub fn approvals(state_dir: &Path, command: ApprovalCommand) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_environment(state_dir)?;
    block_on(async move {
        match command {
            ApprovalCommand::Ls(args) => approvals::list(&client, args).await,
            ApprovalCommand::Show { id, json } => approvals::show(&client, &id, json).await,
            ApprovalCommand::Approve { id, note } => {
                approvals::decide(&client, &id, approvals::Decision::Approve, note).await
            }
            ApprovalCommand::Reject { id, note } => {
                approvals::decide(&client, &id, approvals::Decision::Reject, note).await
            }
        }
    })
}

/// Runs a `paddock execution` command.
pub fn executions(state_dir: &Path, command: ExecutionCommand) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_environment(state_dir)?;
    block_on(async move {
        match command {
            ExecutionCommand::Propose(args) => executions::propose(&client, args).await,
            ExecutionCommand::Ls { limit, json } => executions::list(&client, limit, json).await,
            ExecutionCommand::Show { id, json } => executions::show(&client, &id, json).await,
            ExecutionCommand::Cancel { id, json } => executions::cancel(&client, &id, json).await,
        }
    })
}

/// Runs a `paddock policy` command.
pub fn policy(state_dir: &Path, command: PolicyCommand) -> anyhow::Result<ExitCode> {
    let client = ApiClient::from_environment(state_dir)?;
    block_on(async move {
        match command {
            PolicyCommand::Get { sandbox, json } => policy::get(&client, sandbox.as_deref(), json).await,
            PolicyCommand::Set { file, sandbox, json } => {
                let policy = policy::read_policy(&file)?;
                policy::set(&client, sandbox.as_deref(), policy, json).await
            }
            PolicyCommand::Delete { sandbox } => policy::delete(&client, sandbox.as_deref()).await,
        }
    })
}

/// Runs `fut` on a single-threaded runtime.
pub fn block_on<T>(fut: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    let result = rt.block_on(fut);
    // A read of this process's stdin may still block on a helper thread; do not wait for it.
    rt.shutdown_background();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_answers() {
        let body = br#"{"code":"sandbox_not_found","message":"sandbox abc not found"}"#;
        let f = ApiFailure::from_answer(reqwest::StatusCode::NOT_FOUND, body);
        assert_eq!(f.to_string(), "sandbox abc not found (sandbox_not_found)");
        let body = br#"{"code":"invalid_request","message":"too big","field":"limits.memory"}"#;
        let f = ApiFailure::from_answer(reqwest::StatusCode::BAD_REQUEST, body);
        assert_eq!(f.to_string(), "limits.memory: too big (invalid_request)");
        let body = br#"{"code":"approval_pending","message":"held","approval_id":"apr_1"}"#;
        let f = ApiFailure::from_answer(reqwest::StatusCode::CONFLICT, body);
        assert_eq!(
            (f.to_string(), f.approval_id.as_deref()),
            ("held (approval_pending)".to_owned(), Some("apr_1"))
        );
        let f = ApiFailure::from_answer(reqwest::StatusCode::BAD_GATEWAY, b"upstream down");
        assert_eq!(
            f.to_string(),
            "the server answered 502 Bad Gateway: upstream down (http_502)"
        );
    }

    #[test]
    fn urls_encode_segments_and_keep_a_base_path() {
        let c = ApiClient::new("http://h:1/prefix", "k".into()).expect("client");
        assert_eq!(
            c.url(&["v1", "sandboxes", "a/b c"]).as_str(),
            "http://h:1/prefix/v1/sandboxes/a%2Fb%20c"
        );
        let c = ApiClient::new("http://h:1", "k".into()).expect("client");
        assert_eq!(c.url(&["v1", "audit"]).as_str(), "http://h:1/v1/audit");
        assert!(ApiClient::new("ftp://h", "k".into()).is_err());
        assert!(ApiClient::new("not a url", "k".into()).is_err());
    }
}

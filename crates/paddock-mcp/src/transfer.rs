//! Files to and from URLs, fetched and sent by the sandbox itself, so the sandbox's network policy
//! (its allowlist, the operator's deny list, the egress proxy, its audit rows and injected
//! secrets) applies exactly as to any of its processes: `file_download_url` saves a URL into a
//! file, `file_upload_url` sends a file to a URL. Each is one command in the sandbox, run with
//! `curl`, else `wget`, else `python3`, whichever the sandbox has (the URL and path are arguments,
//! never shell text), with a time limit, progress and cancellation as `run_command`'s.
//!
//! What it does not do: reach anything from the host (paddock never fetches on a sandbox's
//! behalf), follow a URL that is not http(s), or bound a download below the sandbox's own disk
//! limit and quota.

use paddock_types::api::ExecRequest;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, Json, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tools::{sandbox_id, tail, time_limit};
use crate::PaddockMcp;

/// The download, by whichever client the sandbox has: `$1` the URL, `$2` the file.
const DOWNLOAD: &str = r#"set -eu
url=$1 path=$2
mkdir -p -- "$(dirname -- "$path")"
if command -v curl >/dev/null 2>&1; then
  curl --fail --silent --show-error --location --max-redirs 5 --proto =http,https --output "$path" -- "$url"
elif command -v wget >/dev/null 2>&1; then
  wget -q -O "$path" -- "$url"
elif command -v python3 >/dev/null 2>&1; then
  python3 -c 'import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=60) as r, open(sys.argv[2], "wb") as f:
    shutil.copyfileobj(r, f)' "$url" "$path"
else
  echo "this sandbox has no curl, wget or python3 to fetch with" >&2
  exit 127
fi
wc -c < "$path"
"#;

/// The upload: `$1` the file, `$2` the URL, `$3` the method.
const UPLOAD: &str = r#"set -eu
path=$1 url=$2 method=$3
test -f "$path" || { echo "no file $path" >&2; exit 2; }
if command -v curl >/dev/null 2>&1; then
  curl --fail --silent --show-error --proto =http,https -X "$method" --data-binary "@$path" -H 'Content-Type: application/octet-stream' -o /dev/null -w '%{http_code}' -- "$url"
elif command -v python3 >/dev/null 2>&1; then
  python3 -c 'import sys, urllib.request
data = open(sys.argv[1], "rb").read()
r = urllib.request.Request(sys.argv[2], data=data, method=sys.argv[3], headers={"Content-Type": "application/octet-stream"})
with urllib.request.urlopen(r, timeout=60) as answer:
    print(answer.status, end="")' "$path" "$url" "$method"
else
  echo "this sandbox has no curl or python3 to send with" >&2
  exit 127
fi
"#;

/// `file_download_url`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DownloadArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// An http:// or https:// URL the sandbox's network policy allows.
    pub url: String,
    /// Absolute path of the file to write inside the sandbox (parents are made).
    pub path: String,
    /// Seconds before the transfer is stopped (default 60, at most 3600).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// `file_upload_url`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UploadArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path of the file inside the sandbox.
    pub path: String,
    /// An http:// or https:// URL the sandbox's network policy allows.
    pub url: String,
    /// `PUT` (default) or `POST`; the file is the request's body.
    #[serde(default)]
    pub method: Option<String>,
    /// Seconds before the transfer is stopped (default 60, at most 3600).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// A transfer's result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Transferred {
    /// The file inside the sandbox.
    pub path: String,
    /// The URL.
    pub url: String,
    /// Bytes written to the file (a download).
    pub bytes: Option<u64>,
    /// The HTTP status the server answered an upload with.
    pub status: Option<u16>,
}

/// The URL, if it is http(s).
fn web_url(url: &str) -> Result<&str, String> {
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://"))
        || url.chars().any(char::is_whitespace)
    {
        return Err(format!(
            "invalid_request: url: {url:?} is not an http:// or https:// URL"
        ));
    }
    Ok(url)
}

/// The failure a transfer command's end means.
fn transfer_failure(what: &str, exit: i32, timed_out: bool, stderr: &str) -> String {
    let detail = tail(stderr.trim(), 1000);
    match (timed_out, exit) {
        (true, _) => format!("timeout: the {what} did not finish within its time limit"),
        (false, 127) => format!("unsupported: {detail}"),
        _ => format!("unavailable: the {what} failed (exit {exit}): {detail}"),
    }
}

fn argv(script: &str, args: &[&str]) -> ExecRequest {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        script.to_owned(),
        "paddock".to_owned(),
    ];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    ExecRequest {
        argv: Some(argv),
        ..ExecRequest::default()
    }
}

#[tool_router(router = transfer_router, vis = "pub(crate)")]
impl PaddockMcp {
    #[tool(
        name = "file_download_url",
        description = "Download a URL into a file of a sandbox. The sandbox itself fetches it, so only destinations its network policy allows are reachable; fails with the fetch's error otherwise.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn file_download_url(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<DownloadArgs>,
    ) -> Result<Json<Transferred>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let url = web_url(&args.url)?;
        let timeout = time_limit(args.timeout_secs)?;
        let mut request = argv(DOWNLOAD, &[url, &args.path]);
        request.timeout_ms = Some(timeout * 1000);
        let ran = self.run_collected(&ctx, &p, &id, request, timeout).await?;
        if ran.exit_code != 0 || ran.timed_out {
            return Err(transfer_failure(
                "download",
                ran.exit_code,
                ran.timed_out,
                &ran.stderr,
            ));
        }
        Ok(Json(Transferred {
            bytes: ran.stdout.trim().parse().ok(),
            status: None,
            path: args.path,
            url: args.url,
        }))
    }

    #[tool(
        name = "file_upload_url",
        description = "Send a file of a sandbox to a URL as the body of a PUT (or POST). The sandbox itself sends it, so only destinations its network policy allows are reachable.",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn file_upload_url(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<UploadArgs>,
    ) -> Result<Json<Transferred>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let url = web_url(&args.url)?;
        let timeout = time_limit(args.timeout_secs)?;
        let method = match args.method.as_deref().map(str::to_ascii_uppercase).as_deref() {
            None | Some("PUT") => "PUT",
            Some("POST") => "POST",
            Some(other) => {
                return Err(format!(
                    "invalid_request: method: {other:?} is neither PUT nor POST"
                ))
            }
        };
        let mut request = argv(UPLOAD, &[&args.path, url, method]);
        request.timeout_ms = Some(timeout * 1000);
        let ran = self.run_collected(&ctx, &p, &id, request, timeout).await?;
        if ran.exit_code != 0 || ran.timed_out {
            return Err(transfer_failure(
                "upload",
                ran.exit_code,
                ran.timed_out,
                &ran.stderr,
            ));
        }
        Ok(Json(Transferred {
            bytes: None,
            status: ran.stdout.trim().parse().ok(),
            path: args.path,
            url: args.url,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_web_urls_and_sane_time_limits_are_taken() {
        assert!(web_url("https://example.test/a").is_ok());
        assert!(web_url("HTTP://example.test/a").is_ok());
        for bad in ["file:///etc/passwd", "ftp://x/y", "http://x/ y", "-o/etc/x"] {
            assert!(web_url(bad).is_err(), "{bad}");
        }
        assert_eq!(time_limit(None), Ok(60));
        assert!(time_limit(Some(0)).is_err() && time_limit(Some(3601)).is_err());
        assert_eq!(time_limit(Some(3600)), Ok(3600));
    }

    #[test]
    fn a_failed_transfer_says_why_with_a_stable_code() {
        assert!(transfer_failure("download", 127, false, "no curl").starts_with("unsupported: no curl"));
        assert!(transfer_failure("download", 22, false, "curl: (22) 403").starts_with("unavailable:"));
        assert!(transfer_failure("upload", -1, true, "").starts_with("timeout:"));
    }
}

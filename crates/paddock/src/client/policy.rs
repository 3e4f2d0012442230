//! `paddock policy get | set | delete`: the tenant's approval policy (`/v1/policy`), or with
//! `--sandbox` one sandbox's (`/v1/sandboxes/{id}/policy`).

use std::io::Read as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use paddock_types::api::{ApprovalPolicyInfo, SetApprovalPolicyRequest};
use reqwest::Method;

use super::{print_json, ApiClient};

/// The largest policy file read (the server bounds request bodies far below this anyway).
const MAX_POLICY: u64 = 1 << 20;

/// The endpoint of the policy `sandbox` names (the tenant's when `None`).
fn endpoint(sandbox: Option<&str>) -> Vec<&str> {
    match sandbox {
        Some(id) => vec!["v1", "sandboxes", id, "policy"],
        None => vec!["v1", "policy"],
    }
}

/// Whose policy it is, for a person.
fn whose(sandbox: Option<&str>) -> String {
    match sandbox {
        Some(id) => format!("sandbox {id}"),
        None => "the tenant".to_owned(),
    }
}

/// The policy JSON in `path` (`-`: stdin). Only its syntax is checked here; the server compiles it
/// and names the faulty field.
pub fn read_policy(path: &Path) -> anyhow::Result<serde_json::Value> {
    let mut text = String::new();
    let read = if path == Path::new("-") {
        std::io::stdin().take(MAX_POLICY + 1).read_to_string(&mut text)
    } else {
        std::fs::File::open(path)
            .with_context(|| format!("cannot open the policy {}", path.display()))?
            .take(MAX_POLICY + 1)
            .read_to_string(&mut text)
    };
    read.with_context(|| format!("cannot read the policy {}", path.display()))?;
    if text.len() as u64 > MAX_POLICY {
        return Err(crate::UsageError::new(format!(
            "the policy {} is larger than {MAX_POLICY} bytes",
            path.display()
        ))
        .into());
    }
    serde_json::from_str(&text)
        .map_err(|e| crate::UsageError::new(format!("the policy {} is not JSON: {e}", path.display())).into())
}

pub async fn get(client: &ApiClient, sandbox: Option<&str>, json: bool) -> anyhow::Result<ExitCode> {
    let info: ApprovalPolicyInfo = client
        .json(client.request(Method::GET, &endpoint(sandbox)))
        .await?;
    if json {
        print_json(&info)?;
    } else {
        print_json(&info.policy)?;
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn set(
    client: &ApiClient,
    sandbox: Option<&str>,
    policy: serde_json::Value,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let body = SetApprovalPolicyRequest { policy };
    let info: ApprovalPolicyInfo = client
        .json(client.request(Method::PUT, &endpoint(sandbox)).json(&body))
        .await?;
    if json {
        print_json(&info)?;
    } else {
        println!("policy of {} set", whose(sandbox));
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn delete(client: &ApiClient, sandbox: Option<&str>) -> anyhow::Result<ExitCode> {
    client
        .send(client.request(Method::DELETE, &endpoint(sandbox)))
        .await?;
    println!("policy of {} deleted", whose(sandbox));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_policy_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("good.json");
        std::fs::write(&good, r#"{"default": "ask"}"#).expect("write");
        assert_eq!(
            read_policy(&good).expect("read"),
            serde_json::json!({"default": "ask"})
        );
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "default: ask").expect("write");
        let e = read_policy(&bad).expect_err("not JSON");
        assert!(e.to_string().contains("is not JSON"), "{e}");
        assert!(read_policy(&dir.path().join("missing")).is_err());
    }
}

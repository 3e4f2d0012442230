//! `paddock sandbox network ID [--set ...]` and `paddock secret create | ls | rm`.

use std::io::Read;
use std::process::ExitCode;

use paddock_types::api::{
    CreateSecretRequest, SandboxNetworkInfo, SecretInfo, SecretList, SetNetworkRequest,
};
use paddock_types::EgressTarget;
use reqwest::Method;

use super::{print_json, ApiClient, Table};
use crate::cli::NetworkCmdArgs;

pub async fn show_or_set(client: &ApiClient, args: NetworkCmdArgs) -> anyhow::Result<ExitCode> {
    let path = ["v1", "sandboxes", args.id.as_str(), "network"];
    let info: SandboxNetworkInfo = if args.set {
        let policy = args.net.policy()?.unwrap_or_default();
        let request = SetNetworkRequest {
            policy: Some(policy),
            secrets: (!args.secrets.is_empty()).then_some(args.secrets),
        };
        client
            .json(client.request(Method::PUT, &path).json(&request))
            .await?
    } else {
        if args.net.any() || !args.secrets.is_empty() {
            anyhow::bail!("policy flags change the network only with --set");
        }
        client.json(client.request(Method::GET, &path)).await?
    };
    if args.json {
        print_json(&info)?;
        return Ok(ExitCode::SUCCESS);
    }
    print_network(&info);
    Ok(ExitCode::SUCCESS)
}

fn rule_text(rule: &paddock_types::EgressRule) -> String {
    let target = match rule.target() {
        EgressTarget::Domain(d) => d.to_string(),
        EgressTarget::Cidr(c) => c.to_string(),
    };
    if rule.covers_all_ports() {
        target
    } else {
        let ports: Vec<String> = rule.ports().iter().map(|p| p.to_string()).collect();
        format!("{target}:{}", ports.join(","))
    }
}

fn print_network(info: &SandboxNetworkInfo) {
    println!("sandbox: {}", info.sandbox_id);
    if let (Some(proxy), Some(ip)) = (&info.proxy_url, &info.sandbox_ip) {
        println!("address: {ip} (proxy {proxy})");
    }
    let list = |rules: &[paddock_types::EgressRule]| {
        if rules.is_empty() {
            "-".to_owned()
        } else {
            rules.iter().map(rule_text).collect::<Vec<_>>().join(" ")
        }
    };
    println!("allow:   {}", list(info.policy.allow()));
    println!("deny:    {}", list(info.policy.deny()));
    println!(
        "secrets: {}",
        if info.secrets.is_empty() {
            "-".to_owned()
        } else {
            info.secrets.join(" ")
        }
    );
    println!();
    let mut table = Table::new(["AT", "KIND", "DECISION", "DESTINATION", "RULE", "UP", "DOWN"]);
    for e in &info.recent {
        let d = &e.detail;
        let name = d["name"].as_str().unwrap_or("");
        let destination = match e.kind.as_str() {
            "dns" => format!("{name} {}", d["query_type"].as_str().unwrap_or("")),
            _ => {
                let ip = d["ip"].as_str().unwrap_or("-");
                let port = d["port"].as_u64().unwrap_or(0);
                if name.is_empty() {
                    format!("{ip}:{port}")
                } else {
                    format!("{name} ({ip}):{port}")
                }
            }
        };
        table.row([
            e.at.clone(),
            e.kind.clone(),
            if e.allowed { "allowed" } else { "denied" }.to_owned(),
            destination,
            d["rule"]["kind"].as_str().unwrap_or("").to_owned(),
            d["bytes_up"].as_u64().map(|b| b.to_string()).unwrap_or_default(),
            d["bytes_down"]
                .as_u64()
                .map(|b| b.to_string())
                .unwrap_or_default(),
        ]);
    }
    table.print();
}

/// Where a new secret may go: `--host`, `--header` (none: the server's default), `--query`.
pub struct Binding {
    pub hosts: Vec<String>,
    pub headers: Vec<String>,
    pub query: bool,
}

pub async fn create_secret(
    client: &ApiClient,
    name: String,
    binding: Binding,
    from_env: Option<String>,
) -> anyhow::Result<ExitCode> {
    let value = match from_env {
        Some(var) => {
            std::env::var(&var).map_err(|_| anyhow::anyhow!("environment variable {var} is not set"))?
        }
        None => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| anyhow::anyhow!("cannot read the secret's value from standard input: {e}"))?;
            text.trim_end_matches(['\n', '\r']).to_owned()
        }
    };
    let request = CreateSecretRequest {
        name,
        value,
        hosts: binding.hosts,
        headers: (!binding.headers.is_empty()).then_some(binding.headers),
        query: binding.query,
    };
    let info: SecretInfo = client
        .json(client.request(Method::POST, &["v1", "secrets"]).json(&request))
        .await?;
    println!("{}", info.name);
    Ok(ExitCode::SUCCESS)
}

pub async fn list_secrets(client: &ApiClient, json: bool) -> anyhow::Result<ExitCode> {
    let list: SecretList = client
        .json(client.request(Method::GET, &["v1", "secrets"]))
        .await?;
    if json {
        print_json(&list)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(["NAME", "HOSTS", "IN", "CREATED"]);
    for s in &list.secrets {
        let mut fields = s.headers.clone();
        if s.query {
            fields.push("?query".into());
        }
        table.row([
            s.name.clone(),
            s.hosts.join(","),
            fields.join(","),
            s.created_at.clone(),
        ]);
    }
    table.print();
    Ok(ExitCode::SUCCESS)
}

pub async fn remove_secrets(client: &ApiClient, names: &[String]) -> anyhow::Result<ExitCode> {
    for name in names {
        client
            .send(client.request(Method::DELETE, &["v1", "secrets", name]))
            .await?;
        println!("{name}");
    }
    Ok(ExitCode::SUCCESS)
}

//! The network of a `paddock run` sandbox: the egress proxy, in the `paddock run` process, serving
//! its link with the run's policy (`--allow-domain`, ...) and secrets (`--secret`), under the
//! server configuration's `[egress]` settings.
//!
//! Only `paddock-full` links this (the `paddock` front hands a networked run over to it); the rest
//! of `paddock run` is in `run.rs`. It keeps no audit log: refusals go to the log as warnings.

use anyhow::Context;
use paddock_control::NetworkConfig;
use paddock_runtime::SandboxHandle;
use paddock_types::{SandboxId, SandboxSpec};

use crate::cli::RunArgs;
use crate::run::{LocalFuture, RunNetwork};

/// The egress proxy serving one `paddock run` sandbox.
pub struct EgressNetwork {
    config: NetworkConfig,
    policy: paddock_types::NetworkPolicy,
    /// Handed to the proxy when it starts serving.
    secrets: Vec<paddock_egress::Secret>,
    ca: Option<paddock_egress::SandboxCaKey>,
    egress: Option<paddock_egress::Egress>,
}

impl EgressNetwork {
    /// The run's network from its flags, under `config` (the server configuration's `[egress]`):
    /// fails on a bad `--secret` or policy flag before anything is made.
    pub fn new(config: NetworkConfig, args: &RunArgs) -> anyhow::Result<Self> {
        let secrets = args
            .secrets
            .iter()
            .map(|s| parse_secret(s, |name| std::env::var(name).ok()))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let policy = args.net.policy()?.unwrap_or_default();
        Ok(Self {
            config,
            policy,
            secrets,
            ca: None,
            egress: None,
        })
    }
}

impl RunNetwork for EgressNetwork {
    fn prepare(&mut self, spec: &mut SandboxSpec) -> anyhow::Result<()> {
        let ca = paddock_egress::SandboxCaKey::generate(&spec.id)?;
        spec.network = Some(paddock_types::NetworkSpec {
            ports: self.config.ports,
            ca_pem: ca.cert_pem().to_owned(),
            conntrack: self.config.conntrack,
        });
        self.ca = Some(ca);
        Ok(())
    }

    fn serve<'a>(
        &'a mut self,
        handle: &'a SandboxHandle,
    ) -> LocalFuture<'a, anyhow::Result<Vec<(String, String)>>> {
        Box::pin(async move {
            let link = handle
                .network
                .context("the backend made no network link for the sandbox")?;
            let ca = self.ca.as_ref().context("the network was not prepared")?;
            let egress =
                paddock_egress::Egress::new(self.config.egress.clone(), std::sync::Arc::new(LogAudit))?;
            let listen = paddock_egress::SandboxListen::on_link(&link, &self.config.ports);
            let secrets = std::mem::take(&mut self.secrets);
            let mut env = link.env(&self.config.ports);
            env.extend(secrets.iter().map(|s| s.name().env_var()));
            egress
                .add_sandbox_at(handle.id.clone(), self.policy.clone(), listen, ca)
                .await?;
            egress.set_secrets(&handle.id, secrets)?;
            self.egress = Some(egress);
            Ok(env)
        })
    }

    fn stop(&mut self, id: &SandboxId) {
        // Dropped here, before the sandbox's link goes: the proxy stops listening on it.
        if let Some(egress) = self.egress.take() {
            let _ = egress.remove_sandbox(id);
        }
    }
}

/// `--secret NAME:HOST[,HOST...][:FIELD[,FIELD...]]`: the value from this process's environment
/// variable NAME, bound to those hosts and header fields (`Authorization` when none are given);
/// `?query` among the fields also binds it to query strings.
fn parse_secret(
    arg: &str,
    value_of: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<paddock_egress::Secret> {
    let usage = || anyhow::anyhow!("--secret {arg:?}: use NAME:HOST[,HOST...][:HEADER[,HEADER...]]");
    let mut parts = arg.splitn(3, ':');
    let (Some(name), Some(hosts)) = (parts.next(), parts.next()) else {
        return Err(usage());
    };
    let name: paddock_egress::SecretName = name.parse()?;
    let hosts = hosts
        .split(',')
        .map(|h| h.parse::<paddock_types::DomainPattern>())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--secret {arg:?}"))?;
    let (headers, query) = match parts.next() {
        None => (None, false),
        Some(fields) => {
            let mut query = false;
            let mut headers = Vec::new();
            for f in fields.split(',') {
                if f == "?query" {
                    query = true;
                } else {
                    headers.push(
                        f.parse::<paddock_egress::BoundHeader>()
                            .with_context(|| format!("--secret {arg:?}"))?,
                    );
                }
            }
            (Some(headers), query)
        }
    };
    let binding = paddock_egress::SecretBinding::new(hosts, headers, query)
        .with_context(|| format!("--secret {arg:?}"))?;
    let value = value_of(name.as_str()).ok_or_else(|| {
        anyhow::anyhow!(
            "--secret {name}: paddock's environment has no variable {name} to take the value from"
        )
    })?;
    Ok(paddock_egress::Secret::new(
        name,
        zeroize::Zeroizing::new(value),
        binding,
    )?)
}

/// `paddock run` keeps no audit log: the proxy's records go to the log (refusals as warnings, so a
/// user sees why a connection failed).
#[derive(Debug)]
struct LogAudit;

impl paddock_egress::AuditSink for LogAudit {
    fn record(&self, record: paddock_egress::AuditRecord) {
        use paddock_egress::AuditRecord;
        match &record {
            AuditRecord::Connection(c) if !c.allowed => {
                let name = c.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                let ip = c.ip.map(|i| i.to_string()).unwrap_or_default();
                tracing::warn!(target: "paddock::egress", name, ip, port = c.port, rule = ?c.rule, "connection refused");
            }
            AuditRecord::Dns(d) if !d.allowed => {
                tracing::warn!(target: "paddock::egress", name = d.name, rule = ?d.rule, "DNS question refused");
            }
            AuditRecord::Refused(r) => {
                tracing::warn!(target: "paddock::egress", limit = r.limit.as_str(), count = r.count, "refused at a cap");
            }
            _ => tracing::info!(target: "paddock::egress", record = ?record, "egress"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(arg: &str) -> anyhow::Result<paddock_egress::Secret> {
        parse_secret(arg, |name| (name == "GH").then(|| "ghp_x".to_owned()))
    }

    #[test]
    fn secrets_name_hosts_and_optionally_fields() {
        let s = parse("GH:api.test").expect("default");
        assert_eq!(
            s.binding().headers(),
            &[paddock_egress::BoundHeader::authorization()]
        );
        let s = parse("GH:api.test,*.api.test:X-Api-Key,Cookie,?query").expect("fields");
        let fields: Vec<&str> = s.binding().headers().iter().map(|h| h.as_str()).collect();
        assert_eq!(fields, ["cookie", "x-api-key"]);
        assert!(s.binding().query() && s.binding().hosts().len() == 2);
        for bad in [
            "GH",
            "GH:",
            "GH:api.test:Host",
            "GH:api.test:a b",
            "NOPE:api.test",
            "G-H:api.test",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

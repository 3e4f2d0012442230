//! Syntax of the server-side commands: `serve`, `config show`, `keys`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Subcommand};
use paddock_types::{ByteSize, CpuQuota};

/// `paddock serve` options. Each overrides the configuration file and its `PADDOCK_*` variable.
#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port; the bound address is printed) [default: 127.0.0.1:7420].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Memory limit of sandboxes whose request names none.
    #[arg(long, value_name = "SIZE")]
    pub default_memory: Option<ByteSize>,
    /// CPU quota of sandboxes whose request names none.
    #[arg(long, value_name = "CPUS")]
    pub default_cpus: Option<CpuQuota>,
    /// Process limit of sandboxes whose request names none.
    #[arg(long, value_name = "N")]
    pub default_pids: Option<u32>,
    /// Disk limit of sandboxes whose request names none.
    #[arg(long, value_name = "SIZE")]
    pub default_disk: Option<ByteSize>,
    /// The most memory a sandbox may ask for.
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<ByteSize>,
    /// The most CPUs a sandbox may ask for.
    #[arg(long, value_name = "CPUS")]
    pub max_cpus: Option<CpuQuota>,
    /// The most processes a sandbox may ask for.
    #[arg(long, value_name = "N")]
    pub max_pids: Option<u32>,
    /// The most disk a sandbox may ask for.
    #[arg(long, value_name = "SIZE")]
    pub max_disk: Option<ByteSize>,
    /// Timeout of sandboxes whose request names none (e.g. 5m) [default: 5m].
    #[arg(long, value_name = "DURATION", value_parser = parse_human_duration)]
    pub default_timeout: Option<Duration>,
    /// The longest timeout a sandbox may have (e.g. 24h) [default: 24h].
    #[arg(long, value_name = "DURATION", value_parser = parse_human_duration)]
    pub max_timeout: Option<Duration>,
    /// How often expired and dead sandboxes are looked for [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = parse_human_duration)]
    pub reaper_interval: Option<Duration>,
    /// How long ended sandboxes stay listed [default: 7days].
    #[arg(long, value_name = "DURATION", value_parser = parse_human_duration)]
    pub history_retention: Option<Duration>,
    /// The largest snapshot archive `POST /v1/snapshots/import` accepts [default: 10G].
    #[arg(long, value_name = "SIZE")]
    pub max_import: Option<ByteSize>,
    /// Sandboxes of the `default` template kept pre-started [default: 0].
    #[arg(long, value_name = "N")]
    pub warm_pool: Option<u32>,
}

#[derive(Debug, Subcommand)]
pub enum K8sCommand {
    /// Print what a cluster administrator applies once for the kubernetes-job executor (`kubectl
    /// apply -f -`): the executions' namespace, their pods' service account, a Role and RoleBinding
    /// for the account `paddock serve` uses, and a default-deny egress NetworkPolicy (DNS, and the
    /// API server when --api-server-cidr is given). Names come from [executions.kubernetes].
    Manifests(K8sManifestsArgs),
}

/// `paddock k8s manifests` options.
#[derive(Debug, Args)]
pub struct K8sManifestsArgs {
    /// The service account `paddock serve` runs as (the RoleBinding's subject).
    #[arg(long, default_value = "paddock")]
    pub server_account: String,
    /// That account's namespace.
    #[arg(long, default_value = "paddock-system")]
    pub server_namespace: String,
    /// An address range of the API server the executions' pods may reach (TCP 443 and 6443);
    /// repeat for several. None: DNS only.
    #[arg(long = "api-server-cidr", value_name = "CIDR")]
    pub api_server_cidrs: Vec<ipnet::IpNet>,
    /// Print a JSON list instead of YAML documents.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the resolved server configuration (defaults, file, PADDOCK_* variables, flags) as TOML.
    Show(ServeArgs),
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create an API key and print it (the only time it is shown).
    Create {
        /// The tenant the key acts for (created if new).
        #[arg(long)]
        tenant: String,
        /// A name to recognise the key by.
        #[arg(long)]
        name: Option<String>,
        /// May manage keys and tenants and read every tenant's audit log.
        #[arg(long)]
        admin: bool,
        /// May not change a live sandbox's network policy or secrets after creating it (`PUT
        /// /v1/sandboxes/{id}/network` is refused with `forbidden`); keys may by default.
        #[arg(long)]
        no_change_network: bool,
        /// May set and delete the tenant's approval policies (`PUT`/`DELETE /v1/policy` and
        /// `/v1/sandboxes/{id}/policy`); keys may not by default, admin keys always may.
        #[arg(long)]
        approver: bool,
        /// Print the key in E2B's spelling (`e2b_` and hex, for `E2B_API_KEY`); both spellings work
        /// on both APIs.
        #[arg(long, conflicts_with = "json")]
        e2b: bool,
        /// Print the created key as JSON (both spellings).
        #[arg(long)]
        json: bool,
    },
    /// List API keys (never their secrets).
    #[command(alias = "ls")]
    List {
        /// Only this tenant's keys.
        #[arg(long)]
        tenant: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke an API key: requests with it are refused from now on.
    Revoke {
        /// The key's id (`keys list`).
        id: String,
    },
}

/// Parses a duration as humantime writes it (`5m`, `24h`, `1h 30m`, `7days`), or a plain number of
/// seconds.
pub fn parse_human_duration(s: &str) -> Result<Duration, String> {
    if let Ok(d) = super::parse_duration(s) {
        return Ok(d);
    }
    match humantime::parse_duration(s.trim()) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(format!("invalid duration {s:?}: use e.g. 30s, 5m, 24h or 7days")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        assert_eq!(parse_human_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_human_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_human_duration("7days"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_human_duration("90"), Ok(Duration::from_secs(90)));
        for bad in ["", "0s", "soon", "-1m"] {
            assert!(parse_human_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn keys_create_takes_no_change_network() {
        use clap::Parser;
        let create = |extra: &[&str]| {
            let args = [&["paddock", "keys", "create", "--tenant", "t"][..], extra].concat();
            match crate::cli::Cli::try_parse_from(args).map(|c| c.command) {
                Ok(crate::cli::Command::Keys {
                    command:
                        KeysCommand::Create {
                            no_change_network, ..
                        },
                }) => no_change_network,
                other => panic!("not keys create: {other:?}"),
            }
        };
        assert!(!create(&[]));
        assert!(create(&["--no-change-network"]));
    }

    #[test]
    fn keys_create_takes_approver() {
        use clap::Parser;
        let create = |extra: &[&str]| {
            let args = [&["paddock", "keys", "create", "--tenant", "t"][..], extra].concat();
            match crate::cli::Cli::try_parse_from(args).map(|c| c.command) {
                Ok(crate::cli::Command::Keys {
                    command: KeysCommand::Create { approver, .. },
                }) => approver,
                other => panic!("not keys create: {other:?}"),
            }
        };
        assert!(!create(&[]));
        assert!(create(&["--approver"]));
    }
}

//! The resolved configuration of `run`, `gc` and `pool destroy` (flags, then `PADDOCK_*` environment,
//! then defaults). The server's configuration, which adds a file, is in `serve_config.rs`.

use std::path::PathBuf;

use anyhow::Context;
use paddock_runtime::native::{IdRange, NativeBackend, NativeConfig};
use paddock_types::ByteSize;

use crate::cli::GlobalArgs;

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/paddock";
/// Default parent cgroup.
pub const DEFAULT_CGROUP_PARENT: &str = "paddock";
/// Default size of the pool image.
pub const DEFAULT_POOL_SIZE: ByteSize = ByteSize::gib(64);

/// `paddock-agent` next to this binary.
pub fn default_agent() -> anyhow::Result<PathBuf> {
    beside_this_binary("paddock-agent")
}

/// `paddock-setup` (the setup shim's executable) next to this binary.
fn setup_binary() -> anyhow::Result<PathBuf> {
    beside_this_binary("paddock-setup")
}

/// The file `name` in this binary's directory.
pub fn beside_this_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the paddock binary")?;
    Ok(exe.with_file_name(name))
}

/// Configuration shared by the commands.
#[derive(Debug, Clone)]
pub struct Config {
    /// State directory.
    pub state_dir: PathBuf,
    /// Agent binary.
    pub agent: PathBuf,
    /// Pool image size.
    pub pool_size: ByteSize,
    /// Parent cgroup name.
    pub cgroup_parent: String,
    /// Addresses of networked sandboxes' links (`[egress] subnet`).
    pub network_subnet: paddock_runtime::NetworkSubnet,
}

impl Config {
    /// Resolves the configuration from the parsed global flags (and their `PADDOCK_*` variables).
    pub fn resolve(g: &GlobalArgs) -> anyhow::Result<Self> {
        let state_dir = g
            .state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        let agent = match &g.agent {
            Some(p) => p.clone(),
            None => default_agent()?,
        };
        if !state_dir.is_absolute() {
            anyhow::bail!(
                "--state-dir must be an absolute path, got {}",
                state_dir.display()
            );
        }
        Ok(Self {
            state_dir,
            agent,
            pool_size: g.pool_size.unwrap_or(DEFAULT_POOL_SIZE),
            cgroup_parent: g
                .cgroup_parent
                .clone()
                .unwrap_or_else(|| DEFAULT_CGROUP_PARENT.to_owned()),
            network_subnet: paddock_runtime::NetworkSubnet::DEFAULT,
        })
    }

    /// Opens the native backend.
    pub fn open_backend(&self, die_with_parent: bool) -> anyhow::Result<NativeBackend> {
        let setup_binary = setup_binary()?;
        let config = NativeConfig {
            state_dir: self.state_dir.clone(),
            pool_size: self.pool_size,
            ids: IdRange::DEFAULT,
            agent_binary: self.agent.clone(),
            setup_binary,
            cgroup_parent: self.cgroup_parent.clone(),
            die_with_parent,
            network_subnet: self.network_subnet,
        };
        Ok(NativeBackend::open(config)?)
    }
}

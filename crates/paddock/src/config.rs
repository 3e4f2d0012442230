//! The resolved configuration of one invocation (flags, then `PADDOCK_*` environment, then defaults).

use std::path::PathBuf;

use anyhow::Context;
use paddock_runtime::native::{IdRange, NativeBackend, NativeConfig};
use paddock_types::ByteSize;

use crate::cli::GlobalArgs;

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
}

impl Config {
    /// Resolves the configuration from the parsed global flags.
    pub fn resolve(g: &GlobalArgs) -> anyhow::Result<Self> {
        let agent = match &g.agent {
            Some(p) => p.clone(),
            None => {
                let exe = std::env::current_exe().context("cannot locate the paddock binary")?;
                exe.with_file_name("paddock-agent")
            }
        };
        if !g.state_dir.is_absolute() {
            anyhow::bail!(
                "--state-dir must be an absolute path, got {}",
                g.state_dir.display()
            );
        }
        Ok(Self {
            state_dir: g.state_dir.clone(),
            agent,
            pool_size: g.pool_size,
            cgroup_parent: g.cgroup_parent.clone(),
        })
    }

    /// Opens the native backend.
    pub fn open_backend(&self, die_with_parent: bool) -> anyhow::Result<NativeBackend> {
        let setup_binary = std::env::current_exe().context("cannot locate the paddock binary")?;
        let config = NativeConfig {
            state_dir: self.state_dir.clone(),
            pool_size: self.pool_size,
            ids: IdRange::DEFAULT,
            agent_binary: self.agent.clone(),
            setup_binary,
            cgroup_parent: self.cgroup_parent.clone(),
            die_with_parent,
        };
        Ok(NativeBackend::open(config)?)
    }
}

//! A networked sandbox's link as its boots see it: made at creation, recorded in `boot.json`,
//! joined by every init of the sandbox (rollbacks too), its files rewritten into every new volume,
//! removed with the sandbox.

use std::path::{Path, PathBuf};

use paddock_sys::fs_in_root::Owner;
use paddock_types::{NetworkLink, NetworkSpec};
use serde::{Deserialize, Serialize};

use super::{create_link, remove_link, write_network_files, LinkRecord, PendingLink, NETNS_PIN};
use crate::native::NativeBackend;
use crate::RuntimeError;

/// The network part of `boot.json`: what the sandbox asked for and what was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootNetwork {
    /// The request (ports, CA).
    pub spec: NetworkSpec,
    /// The link.
    pub made: LinkRecord,
}

impl BootNetwork {
    /// The link the sandbox's handle carries.
    pub fn link(&self) -> NetworkLink {
        self.made.link
    }
}

/// The namespace pin of the sandbox whose run directory is `run_dir`.
pub fn netns_pin(run_dir: &Path) -> PathBuf {
    run_dir.join(NETNS_PIN)
}

impl NativeBackend {
    /// Refuses a networked sandbox on a host that cannot make its link (rather than giving it none).
    pub(in crate::native) fn check_network(&self) -> Result<(), RuntimeError> {
        match &self.network_tools {
            Ok(_) => Ok(()),
            Err(missing) => Err(RuntimeError::Unsupported(format!(
                "this host cannot give sandboxes network access: {missing} not found (install iproute2, \
                 nftables and util-linux)"
            ))),
        }
    }

    /// Makes the link of a new sandbox whose run directory is `run_dir` (see [`create_link`]).
    pub(in crate::native) fn link_sandbox(
        &self,
        run_dir: &Path,
        spec: &NetworkSpec,
    ) -> Result<PendingLink, RuntimeError> {
        self.check_network()?;
        let tools = self
            .network_tools
            .as_ref()
            .map_err(|m| RuntimeError::Unsupported(m.clone()))?;
        let t = std::time::Instant::now();
        let pending = create_link(
            tools,
            self.config.network_subnet,
            &spec.ports,
            &spec.conntrack,
            &netns_pin(run_dir),
        )
        .map_err(RuntimeError::Network)?;
        tracing::debug!(
            step = "make link",
            slot = pending.record().link.slot,
            us = t.elapsed().as_micros() as u64
        );
        Ok(pending)
    }

    /// Removes the link recorded for the sandbox whose run directory is `run_dir`, and its
    /// namespace pin even without a record (a crash between making the link and recording it: the
    /// namespace then takes its veth pair along when it ends).
    pub(in crate::native) fn unlink_sandbox(
        &self,
        run_dir: &Path,
        network: Option<&BootNetwork>,
    ) -> Result<(), RuntimeError> {
        let pin = netns_pin(run_dir);
        let made = network.map(|n| &n.made);
        match &self.network_tools {
            Ok(tools) => remove_link(tools, made, &pin).map_err(RuntimeError::Network),
            Err(missing) => {
                super::link::unpin_namespace(&pin).map_err(RuntimeError::Network)?;
                match made {
                    None => Ok(()),
                    Some(_) => Err(RuntimeError::Unsupported(format!(
                        "cannot remove a sandbox's link: {missing} not found"
                    ))),
                }
            }
        }
    }

    /// Writes the network files of a sandbox into its volume (every boot: a snapshot's may be
    /// another link's, or edited).
    pub(in crate::native) fn write_sandbox_network_files(
        &self,
        volume: &Path,
        rootfs: &crate::native::setup::Rootfs,
        network: &BootNetwork,
    ) -> Result<(), RuntimeError> {
        let owner = Owner {
            uid: self.config.ids.host_uid(0),
            gid: self.config.ids.host_gid(0),
        };
        write_network_files(volume, rootfs, &network.made.link, &network.spec.ca_pem, owner)
            .map_err(RuntimeError::Network)
    }
}

//! Making and removing one sandbox's link: its pinned network namespace, the veth pair and the
//! firewall table of its slot.

use std::fs;
use std::io;
use std::path::Path;

use paddock_types::{ConntrackLimits, EgressPorts, NetworkLink};
use serde::{Deserialize, Serialize};

use super::error::file_err;
use super::ruleset::{
    interface_name, render_host_side, render_ruleset, render_sandbox_side, table_name, CREATE_LINE,
};
use super::tools::{run, Running};
use super::{NetworkError, NetworkSubnet, NetworkTools};

/// The name of the namespace pin in a sandbox's run directory (a bind mount of the namespace's nsfs
/// file).
pub const NETNS_PIN: &str = "netns";

/// What the host made for a networked sandbox, as kept in its `boot.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkRecord {
    /// The link's addresses and slot.
    pub link: NetworkLink,
    /// The index the host interface had when it was made: anything of the slot is removed only
    /// while the interface named `pdk<slot>` still has it (a slot whose interface went away may
    /// belong to someone else by now).
    pub ifindex: u32,
}

/// A link whose sandbox side exists and whose host side and firewall are being configured (by
/// processes running meanwhile); [`PendingLink::finish`] waits for them. Dropped unfinished, its
/// processes are killed: the link must then be removed ([`remove_link`]).
#[derive(Debug)]
pub struct PendingLink {
    record: LinkRecord,
    host_side: Running,
    firewall: Running,
}

impl PendingLink {
    /// What was made.
    pub fn record(&self) -> LinkRecord {
        self.record
    }

    /// Waits until the link is configured and its firewall installed.
    pub fn finish(self) -> Result<(), NetworkError> {
        let host = self.host_side.wait();
        let firewall = self.firewall.wait();
        host.and(firewall)
    }
}

/// Makes a link: a new network namespace pinned at `pin` (a file created here, inside the
/// sandbox's run directory), the veth pair of the first free slot of `subnet` with the sandbox's end
/// configured; then starts configuring the host end and installing the firewall. On failure nothing
/// of it is left.
pub fn create_link(
    tools: &NetworkTools,
    subnet: NetworkSubnet,
    ports: &EgressPorts,
    conntrack: &ConntrackLimits,
    pin: &Path,
) -> Result<PendingLink, NetworkError> {
    let pin_text = pin
        .to_str()
        .filter(|s| batch_safe(s))
        .ok_or_else(|| NetworkError::UnusablePath(pin.to_owned()))?;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(pin)
        .map_err(file_err("create", pin))?;
    let made = make_pair(tools, subnet, pin_text);
    let link = match made {
        Ok(link) => link,
        Err(e) => {
            // The pair, if one was made, had its sandbox end in this namespace: it goes with it.
            if let Err(unpin) = unpin_namespace(pin) {
                tracing::warn!(error = %unpin, "cannot remove a network namespace pin");
            }
            return Err(e);
        }
    };
    let started = (|| -> Result<PendingLink, (Option<LinkRecord>, NetworkError)> {
        let dev = interface_name(link.slot);
        let index_file = Path::new("/sys/class/net").join(&dev).join("ifindex");
        let ifindex = fs::read_to_string(&index_file)
            .map_err(|e| (None, file_err("read", &index_file)(e)))?
            .trim()
            .parse::<u32>()
            .map_err(|e| {
                (
                    None,
                    file_err("parse", &index_file)(io::Error::new(io::ErrorKind::InvalidData, e)),
                )
            })?;
        let record = LinkRecord { link, ifindex };
        // No IPv6 on the host end either (the kernel may have been built without it: no file).
        let sysctl = Path::new("/proc/sys/net/ipv6/conf")
            .join(&dev)
            .join("disable_ipv6");
        match fs::write(&sysctl, "1") {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err((Some(record), file_err("write", &sysctl)(e)))
            }
            _ => {}
        }
        let host_side = Running::start(
            "configure the host end of the link",
            &tools.ip,
            &["-batch", "-"],
            &render_host_side(&link),
        )
        .map_err(|e| (Some(record), e))?;
        let firewall = Running::start(
            "install the link's firewall",
            &tools.nft,
            &["-f", "-"],
            &render_ruleset(&link, ports, conntrack),
        )
        .map_err(|e| (Some(record), e))?;
        Ok(PendingLink {
            record,
            host_side,
            firewall,
        })
    })();
    started.map_err(|(record, e)| {
        if let Err(cleanup) = remove_link(tools, record.as_ref(), pin) {
            tracing::warn!(error = %cleanup, "cleanup after a failed link");
        }
        e
    })
}

/// Makes the namespace and the pair on the first free slot; returns the slot's link.
fn make_pair(
    tools: &NetworkTools,
    subnet: NetworkSubnet,
    pin_text: &str,
) -> Result<NetworkLink, NetworkError> {
    // The host's namespace as `ip`, running inside the new one, can name it.
    let host_netns = format!("/proc/{}/ns/net", std::process::id());
    let enter = format!("--net={pin_text}");
    let ip = tools
        .ip
        .to_str()
        .ok_or_else(|| NetworkError::UnusablePath(tools.ip.clone()))?;
    let mut pinned = false;
    for slot in 0..subnet.slots() {
        let dev = interface_name(slot);
        if fs::symlink_metadata(Path::new("/sys/class/net").join(&dev)).is_ok() {
            continue;
        }
        let Some(link) = subnet.link(slot) else { break };
        let input = render_sandbox_side(&link, &host_netns);
        let made = if pinned {
            run(
                "configure the sandbox side of the link",
                &tools.nsenter,
                &[&enter, ip, "-batch", "-"],
                &input,
            )
        } else {
            // unshare makes the namespace, pins it, and runs ip inside it.
            run(
                "create the sandbox's network namespace",
                &tools.unshare,
                &[&enter, ip, "-batch", "-"],
                &input,
            )
        };
        match made {
            Ok(()) => return Ok(link),
            Err(NetworkError::Tool { ref stderr, .. }) if taken_slot(stderr) => {
                // Someone else made `pdk<slot>` since the check above: the kernel said no.
                tracing::debug!(slot, "network slot taken; trying the next one");
                pinned = true;
            }
            Err(e) => return Err(e),
        }
    }
    Err(NetworkError::NoFreeSlot {
        subnet: subnet.to_string(),
        slots: subnet.slots(),
    })
}

/// Whether `ip -batch` failed at the line that creates the pair because the name exists.
fn taken_slot(stderr: &str) -> bool {
    stderr.contains("File exists") && stderr.contains(&format!("Command failed -:{CREATE_LINE}"))
}

/// Whether `ip -batch` takes `s` as one word.
fn batch_safe(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '#' | '\\'))
}

/// Removes a link: the firewall table and the host interface (only while the interface is still
/// the recorded one; deleting either end of a veth pair deletes both), then the namespace pin. Each
/// step is done even when an earlier one failed; the first error is returned. Nothing that is gone
/// already is an error.
pub fn remove_link(
    tools: &NetworkTools,
    record: Option<&LinkRecord>,
    pin: &Path,
) -> Result<(), NetworkError> {
    let mut result = Ok(());
    if let Some(record) = record {
        let slot = record.link.slot;
        let dev = interface_name(slot);
        if current_ifindex(&dev) == Some(record.ifindex) {
            // While the interface is ours, so is the slot: the table goes first, so that nobody
            // who takes the slot afterwards ever loses theirs.
            let table = table_name(slot);
            let removed = run(
                "remove the link's firewall",
                &tools.nft,
                &["delete", "table", "inet", &table],
                "",
            );
            result = result.and(tolerate(removed, "No such file or directory"));
            let removed = run("remove the link", &tools.ip, &["link", "del", "dev", &dev], "");
            result = result.and(tolerate(removed, "Cannot find device"));
        } else {
            tracing::debug!(
                slot,
                "the link's interface is gone already; its slot is left alone"
            );
        }
    }
    result.and(unpin_namespace(pin))
}

fn tolerate(result: Result<(), NetworkError>, gone: &str) -> Result<(), NetworkError> {
    match result {
        Err(NetworkError::Tool { ref stderr, .. }) if stderr.contains(gone) => Ok(()),
        other => other,
    }
}

/// The index of host interface `dev`, if it exists.
fn current_ifindex(dev: &str) -> Option<u32> {
    fs::read_to_string(Path::new("/sys/class/net").join(dev).join("ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Unmounts and removes a namespace pin (the namespace ends with its last user). Absent, or a file
/// that was never mounted on, is fine.
pub fn unpin_namespace(pin: &Path) -> Result<(), NetworkError> {
    if fs::symlink_metadata(pin).is_err() {
        return Ok(());
    }
    match paddock_sys::mount::unmount_detach(pin) {
        Err(e) if e.kind() != io::ErrorKind::InvalidInput => return Err(file_err("unmount", pin)(e)),
        _ => {}
    }
    match fs::remove_file(pin) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(file_err("remove", pin)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_slot_is_told_from_other_failures() {
        assert!(taken_slot("RTNETLINK answers: File exists\nCommand failed -:2"));
        assert!(!taken_slot("RTNETLINK answers: File exists\nCommand failed -:4"));
        assert!(!taken_slot(
            "RTNETLINK answers: Operation not permitted\nCommand failed -:2"
        ));
    }

    #[test]
    fn batch_words() {
        assert!(batch_safe("/var/lib/paddock/run/sb-1/netns"));
        for bad in ["", "/a b/netns", "/a\"b", "/a#b", "/a\\b", "/a\tb"] {
            assert!(!batch_safe(bad), "{bad:?}");
        }
    }
}

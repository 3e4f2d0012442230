//! The files a networked sandbox sees: its resolver and the egress CA, alone and in trust bundles.
//!
//! They are written into the sandbox's volume, whose `etc/` the sandbox (or the sandbox a snapshot
//! came from) controls: `etc` itself is opened without following a symlink, every path below it is
//! resolved inside it (`openat2(RESOLVE_IN_ROOT)`, [`paddock_sys::fs_in_root::Root`]), so a symlink
//! planted there never leads a write to a host file, and every file is replaced
//! ([`Root::replace_file`]: whatever is there is unlinked and a new file created), never written
//! through. Nothing is read from the volume.
//!
//! - host root file system: `etc/resolv.conf`, [`EGRESS_CA_PATH`], [`CA_BUNDLE_PATH`] (the host's
//!   system bundle plus the CA) and the sandbox's own copy of the system bundle,
//!   `etc/ssl/certs/ca-certificates.crt`, replaced by the same bundle, so that programs that ignore
//!   `SSL_CERT_FILE` (curl's and OpenSSL's defaults) trust the CA too.
//! - a `--rootfs` directory: its `etc` is read-only and paddock's, so the files go into a layer,
//!   `etc/.paddock-etc/` of the volume (`plan::NETWORK_ETC_LAYER`), rebuilt at every boot and laid
//!   over the directory's `etc` with a read-only overlayfs: `resolv.conf`, `paddock/*`, and
//!   `ssl/certs/ca-certificates.crt` where the directory has `etc/ssl/certs`. The system bundle is
//!   the directory's own, read inside it (its symlinks resolve inside it too).

use std::io;
use std::path::Path;

use paddock_sys::fs_in_root::{EntryKind, Owner, Root, Symlinks};
use paddock_types::{NetworkLink, CA_BUNDLE_PATH, EGRESS_CA_PATH};

use super::error::file_err;
use super::NetworkError;
use crate::native::setup::plan::NETWORK_ETC_LAYER;
use crate::native::setup::Rootfs;

/// Where the system trust bundle is, relative to a root.
const SYSTEM_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

/// Most bytes of a system trust bundle read (Debian's is about 220 KiB).
const MAX_BUNDLE_BYTES: u64 = 16 << 20;

/// Writes the network files of a sandbox with `link` and egress CA `ca_pem` into the `etc/` of its
/// volume (`volume`), owned by `owner` (the sandbox's root).
pub fn write_network_files(
    volume: &Path,
    rootfs: &Rootfs,
    link: &NetworkLink,
    ca_pem: &str,
    owner: Owner,
) -> Result<(), NetworkError> {
    let volume_etc = &volume.join("etc");
    let etc = Root::open(volume)
        .and_then(|v| v.open_dir(Path::new("etc")))
        .map_err(file_err("open", volume_etc))?;
    let resolv = format!(
        "# paddock: names are resolved by the sandbox's egress proxy\nnameserver {}\n",
        link.host_ip
    );
    let ca = with_newline(ca_pem);
    // The host's, the directory's or the template's own (symlinks resolve inside it), never the
    // volume's.
    let system_root = rootfs.system_root();
    let bundle = read_optional(|| {
        Root::open(system_root)?.read_regular(
            Path::new(SYSTEM_BUNDLE),
            MAX_BUNDLE_BYTES,
            Symlinks::FollowInRoot,
        )
    })
    .map_err(file_err(
        "read the system trust bundle of",
        Path::new(SYSTEM_BUNDLE),
    ))?;
    let mut bundle = with_newline(&String::from_utf8_lossy(&bundle));
    bundle.push_str(&ca);
    let in_etc = |p: &'static str| p.strip_prefix("/etc/").unwrap_or(p);
    let files: Vec<(String, &str)> = match rootfs {
        // The volume's etc is the sandbox's own.
        Rootfs::Host | Rootfs::Image { .. } => {
            let dir = Path::new(in_etc(EGRESS_CA_PATH))
                .parent()
                .unwrap_or(Path::new("paddock"));
            // paddock's own directory: whatever else the sandbox left under its name goes.
            match etc.lstat(dir) {
                Ok(stat) if stat.kind != EntryKind::Dir => {
                    etc.remove(dir)
                        .map_err(file_err("remove", &volume_etc.join(dir)))?;
                }
                _ => {}
            }
            etc.mkdir_all(dir, 0o755, Some(owner))
                .map_err(file_err("create", &volume_etc.join(dir)))?;
            let mut files = vec![
                ("resolv.conf".to_owned(), resolv.as_str()),
                (in_etc(EGRESS_CA_PATH).to_owned(), ca.as_str()),
                (in_etc(CA_BUNDLE_PATH).to_owned(), bundle.as_str()),
            ];
            // Only where the template put it: paddock adds no directories to the system's.
            let system = Path::new(SYSTEM_BUNDLE)
                .strip_prefix("etc")
                .unwrap_or(Path::new(SYSTEM_BUNDLE));
            if etc.lstat(system).is_ok_and(|s| s.kind == EntryKind::File) {
                files.push(("ssl/certs/ca-certificates.crt".to_owned(), bundle.as_str()));
            }
            files
        }
        Rootfs::Dir { path } => {
            // The layer laid over the directory's etc, rebuilt whole (whatever a snapshot left there
            // goes, symlinks unlinked, never followed).
            match etc.remove_tree(Path::new(NETWORK_ETC_LAYER)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(file_err("remove", &volume_etc.join(NETWORK_ETC_LAYER))(e));
                }
                _ => {}
            }
            let layer = Path::new(NETWORK_ETC_LAYER);
            let mut dirs = vec![layer
                .join(in_etc(EGRESS_CA_PATH))
                .parent()
                .map(Path::to_owned)
                .unwrap_or_default()];
            let has_system_dir = Root::open(path)
                .and_then(|r| r.lstat(Path::new("etc/ssl/certs")))
                .is_ok_and(|s| s.kind == EntryKind::Dir);
            if has_system_dir {
                dirs.push(layer.join("ssl/certs"));
            }
            for dir in dirs {
                etc.mkdir_all(&dir, 0o755, Some(owner))
                    .map_err(file_err("create", &volume_etc.join(&dir)))?;
            }
            let mut files = vec![
                ("resolv.conf".to_owned(), resolv.as_str()),
                (format!("{NETWORK_ETC_LAYER}/resolv.conf"), resolv.as_str()),
                (
                    format!("{NETWORK_ETC_LAYER}/{}", in_etc(EGRESS_CA_PATH)),
                    ca.as_str(),
                ),
                (
                    format!("{NETWORK_ETC_LAYER}/{}", in_etc(CA_BUNDLE_PATH)),
                    bundle.as_str(),
                ),
            ];
            if has_system_dir {
                files.push((
                    format!("{NETWORK_ETC_LAYER}/ssl/certs/ca-certificates.crt"),
                    bundle.as_str(),
                ));
            }
            files
        }
    };
    for (name, content) in files {
        etc.replace_file(Path::new(&name), content.as_bytes(), 0o644, Some(owner))
            .map_err(file_err("write", &volume_etc.join(&name)))?;
    }
    Ok(())
}

/// A file's content, or nothing if it does not exist.
fn read_optional(read: impl FnOnce() -> io::Result<Vec<u8>>) -> io::Result<Vec<u8>> {
    match read() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        other => other,
    }
}

fn with_newline(s: &str) -> String {
    let mut s = s.to_owned();
    if !s.is_empty() && !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::net::Ipv4Addr;
    use std::os::unix::fs::symlink;

    use super::*;

    fn link() -> NetworkLink {
        NetworkLink {
            slot: 1,
            host_ip: Ipv4Addr::new(10, 253, 0, 5),
            sandbox_ip: Ipv4Addr::new(10, 253, 0, 6),
            prefix_len: 30,
        }
    }

    fn owner() -> Owner {
        Owner {
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
        }
    }

    const CA: &str = "-----BEGIN CERTIFICATE-----\nTEST\n-----END CERTIFICATE-----";

    #[test]
    fn a_rootfs_directory_gets_a_layer_with_its_own_bundle() {
        let rootfs = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(rootfs.path().join("etc/ssl/certs")).expect("mkdir");
        fs::write(rootfs.path().join(SYSTEM_BUNDLE), "SYSTEM").expect("bundle");
        let volume = tempfile::tempdir().expect("tempdir");
        let etc = volume.path().join("etc");
        fs::create_dir(&etc).expect("etc");
        // A snapshot's leftover in the layer's place: a symlink out of the volume.
        let outside = tempfile::tempdir().expect("tempdir");
        symlink(outside.path(), etc.join(NETWORK_ETC_LAYER)).expect("symlink");
        let spec = Rootfs::Dir {
            path: rootfs.path().to_owned(),
        };
        write_network_files(volume.path(), &spec, &link(), CA, owner()).expect("write");
        let read = |name: &str| fs::read_to_string(etc.join(name)).expect(name);
        assert!(read("resolv.conf").ends_with("nameserver 10.253.0.5\n"));
        assert!(read(".paddock-etc/resolv.conf").ends_with("nameserver 10.253.0.5\n"));
        assert_eq!(read(".paddock-etc/paddock/egress-ca.pem"), format!("{CA}\n"));
        assert_eq!(
            read(".paddock-etc/paddock/ca-bundle.pem"),
            format!("SYSTEM\n{CA}\n")
        );
        assert_eq!(
            read(".paddock-etc/ssl/certs/ca-certificates.crt"),
            format!("SYSTEM\n{CA}\n")
        );
        assert_eq!(
            fs::read_dir(outside.path()).expect("read").count(),
            0,
            "nothing written outside"
        );
    }

    #[test]
    fn a_rootfs_bundle_symlink_is_resolved_inside_the_rootfs() {
        let rootfs = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(rootfs.path().join("etc/ssl/certs")).expect("mkdir");
        // Absolute: on the host this would name the host's own file.
        symlink("/etc/hostname", rootfs.path().join(SYSTEM_BUNDLE)).expect("symlink");
        fs::write(rootfs.path().join("etc/hostname"), "INSIDE").expect("write");
        let volume = tempfile::tempdir().expect("tempdir");
        fs::create_dir(volume.path().join("etc")).expect("etc");
        let spec = Rootfs::Dir {
            path: rootfs.path().to_owned(),
        };
        write_network_files(volume.path(), &spec, &link(), CA, owner()).expect("write");
        let bundle =
            fs::read_to_string(volume.path().join("etc/.paddock-etc/paddock/ca-bundle.pem")).expect("bundle");
        assert_eq!(bundle, format!("INSIDE\n{CA}\n"));
    }

    #[test]
    fn symlinks_in_the_volume_never_lead_outside() {
        let outside = tempfile::tempdir().expect("tempdir");
        let volume = tempfile::tempdir().expect("tempdir");
        let etc = &volume.path().join("etc");
        fs::create_dir(etc).expect("etc");
        // What a sandbox could leave in a snapshot: links to host paths on the way and at the end.
        symlink(outside.path(), etc.join("paddock")).expect("symlink");
        symlink(outside.path().join("resolv"), etc.join("resolv.conf")).expect("symlink");
        fs::create_dir_all(etc.join("ssl")).expect("mkdir");
        symlink(outside.path(), etc.join("ssl/certs")).expect("symlink");
        write_network_files(volume.path(), &Rootfs::Host, &link(), CA, owner()).expect("write");
        assert_eq!(
            fs::read_dir(outside.path()).expect("read").count(),
            0,
            "nothing written outside"
        );
        assert!(fs::symlink_metadata(etc.join("resolv.conf"))
            .expect("resolv")
            .is_file());
        assert!(fs::read_to_string(etc.join("resolv.conf"))
            .expect("resolv")
            .contains("nameserver 10.253.0.5"));
    }

    #[test]
    fn a_volume_whose_etc_is_a_symlink_gets_nothing_written() {
        let outside = tempfile::tempdir().expect("tempdir");
        let volume = tempfile::tempdir().expect("tempdir");
        symlink(outside.path(), volume.path().join("etc")).expect("symlink");
        let err = write_network_files(volume.path(), &Rootfs::Host, &link(), CA, owner())
            .expect_err("a symlinked etc");
        assert!(err.to_string().contains("failed to open"), "{err}");
        assert_eq!(fs::read_dir(outside.path()).expect("read").count(), 0);
    }
}

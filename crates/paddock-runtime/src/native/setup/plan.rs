//! The mount plan: what a sandbox's root file system is made of, as data.
//!
//! [`plan_mounts`] is a pure function of the setup spec and a view of the host's top-level entries, so
//! the layout (and every path that is deliberately absent) is unit-tested without privileges; the shim
//! only executes the steps ([`super::mounts`]).

use std::path::PathBuf;

use super::{Rootfs, SetupSpec};
use paddock_sys::mount::MountAttrs;

/// The most pseudo-terminals one sandbox holds at once. Every devpts instance but the host's draws
/// from one host-wide pool (`kernel.pty.max` minus `kernel.pty.reserve`: 3,072 by default), so
/// without a cap one sandbox could take them all and every other sandbox's PTY sessions would fail
/// (measured: 3,071 held by one, then `ENOSPC` in the next). 64 is far more than interactive
/// sessions need.
pub const SANDBOX_MAX_PTYS: u32 = 64;

/// One step, with `target` relative to the new root ("" is the root itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountStep {
    /// Mount a tmpfs.
    Tmpfs {
        /// Where.
        target: String,
        /// tmpfs options.
        options: &'static str,
        /// Mount attributes.
        attrs: MountAttrs,
    },
    /// Bind a host path (directory or file) and set attributes on the new mount.
    Bind {
        /// Host path.
        source: PathBuf,
        /// Where.
        target: String,
        /// Include submounts.
        recursive: bool,
        /// Attributes.
        attrs: MountAttrs,
    },
    /// A fresh procfs for the sandbox's PID namespace.
    Proc {
        /// Where.
        target: String,
    },
    /// A private devpts instance.
    Devpts {
        /// Where.
        target: String,
        /// The most pseudo-terminals it may hold at once (`max=`).
        max_ptys: u32,
    },
    /// Create a directory.
    Mkdir {
        /// Where.
        target: String,
    },
    /// Create a symlink.
    Symlink {
        /// Where.
        target: String,
        /// What it points to.
        points_to: String,
    },
    /// Bind a generated file read-only over an existing file (skipped if the target is absent, since
    /// the directory holding it is read-only).
    Overlay {
        /// Host path of the generated file.
        source: PathBuf,
        /// Where.
        target: String,
    },
    /// Lay `layer`, a directory of the sandbox's volume, over the existing directory `target` with a
    /// read-only overlayfs (`layer` on top): the directory's files plus the layer's. The layer must
    /// be a real directory (the volume is the sandbox's: a symlink there would be followed in the
    /// host's view); inside it, symlinks are shown as they are, never followed by the mount.
    Layer {
        /// Host path of the layer.
        layer: PathBuf,
        /// Where.
        target: String,
    },
    /// Make an existing path read-only by binding it onto itself (skipped if absent).
    ReadOnly {
        /// Where.
        target: String,
    },
    /// Hide an existing file behind /dev/null or an existing directory behind an empty read-only
    /// tmpfs (skipped if absent).
    Mask {
        /// Where.
        target: String,
    },
    /// Block until the caller says the sandbox's volume exists; steps after this one may use it.
    WaitForVolume,
    /// Bind a host directory tree onto `target`, a directory created if missing and resolved inside
    /// the new root (`openat2(RESOLVE_IN_ROOT)`: a symlink on the way, which the sandbox itself may
    /// have planted in its own files, resolves inside the new root, never to a host path), with
    /// `attrs` set before the mount is attached. For named volumes, whose mount points may lie in the
    /// sandbox's own writable directories.
    BindInRoot {
        /// Host path.
        source: PathBuf,
        /// Where.
        target: String,
        /// Attributes.
        attrs: MountAttrs,
    },
    /// Set attributes on an existing mount.
    SetAttrs {
        /// Where.
        target: String,
        /// Attributes.
        attrs: MountAttrs,
    },
}

/// A top-level entry of the host's (or a rootfs directory's) `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEntry {
    /// A directory.
    Dir,
    /// A symlink with this target.
    Symlink(String),
    /// A regular file (an image's `/docker-entrypoint.sh`; skipped elsewhere).
    File,
    /// Anything else (skipped).
    Other,
}

/// Host system directories shown read-only in the default profile.
const HOST_SYSTEM_DIRS: [&str; 7] = ["usr", "bin", "lib", "lib32", "lib64", "libx32", "sbin"];
/// Top-level names of a `--rootfs` directory that paddock provides itself.
const MANAGED_TOP_LEVEL: [&str; 7] = ["proc", "dev", "sys", "tmp", "home", "root", "etc"];
/// Top-level names of an image template that paddock provides itself (the image's own, usually
/// empty directories, are left unused).
const IMAGE_MANAGED_TOP_LEVEL: [&str; 3] = ["proc", "dev", "sys"];
/// Kernel interfaces under /proc made read-only.
const PROC_READ_ONLY: [&str; 5] = ["sys", "sysrq-trigger", "irq", "bus", "fs"];
/// Kernel interfaces under /proc hidden entirely.
const PROC_MASKED: [&str; 8] = [
    "kcore",
    "keys",
    "timer_list",
    "latency_stats",
    "sched_debug",
    "acpi",
    "scsi",
    "kallsyms",
];
/// Host device nodes bound into the sandbox's /dev.
pub const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
/// Files generated per sandbox that replace a `--rootfs` directory's own.
pub const GENERATED_ETC: [&str; 5] = ["passwd", "group", "hosts", "hostname", "resolv.conf"];

/// The directory of a networked sandbox's volume (under `etc/`) laid over a `--rootfs` directory's
/// read-only `etc` ([`MountStep::Layer`]): the resolver, the egress CA and the trust bundles, which
/// paddock cannot add to that directory itself. Rebuilt at every boot (`native/network/files.rs`).
pub const NETWORK_ETC_LAYER: &str = ".paddock-etc";

const ROOT_ATTRS: MountAttrs = MountAttrs {
    readonly: false,
    nosuid: true,
    nodev: true,
    noexec: false,
};
const ROOT_FINAL: MountAttrs = MountAttrs {
    readonly: true,
    nosuid: true,
    nodev: true,
    noexec: false,
};

/// Builds the ordered mount steps for `spec`. `top_level` lists the entries of the host's `/` (default
/// profile) or of the rootfs directory (`--rootfs`).
pub fn plan_mounts(spec: &SetupSpec, top_level: &[(String, HostEntry)]) -> Vec<MountStep> {
    let mut steps = vec![MountStep::Tmpfs {
        target: String::new(),
        options: "mode=0755,size=1m",
        attrs: ROOT_ATTRS,
    }];
    let volume = &spec.volume;
    match &spec.rootfs {
        Rootfs::Host => {
            for (name, entry) in top_level {
                if !HOST_SYSTEM_DIRS.contains(&name.as_str()) {
                    continue;
                }
                match entry {
                    HostEntry::Dir => push_ro_dir(&mut steps, PathBuf::from("/").join(name), name),
                    HostEntry::Symlink(to) => steps.push(MountStep::Symlink {
                        target: name.clone(),
                        points_to: to.clone(),
                    }),
                    HostEntry::File | HostEntry::Other => {}
                }
            }
        }
        Rootfs::Image { .. } => {
            // Directories are the volume's, bound once it exists; a symlink is the template's
            // (the same in the volume, whose top level the sandbox never sees).
            for (name, entry) in top_level {
                if let HostEntry::Symlink(to) = entry {
                    if !IMAGE_MANAGED_TOP_LEVEL.contains(&name.as_str()) {
                        steps.push(MountStep::Symlink {
                            target: name.clone(),
                            points_to: to.clone(),
                        });
                    }
                }
            }
        }
        Rootfs::Dir { path } => {
            for (name, entry) in top_level {
                if MANAGED_TOP_LEVEL.contains(&name.as_str()) {
                    continue;
                }
                match entry {
                    HostEntry::Dir => push_ro_dir(&mut steps, path.join(name), name),
                    HostEntry::Symlink(to) => steps.push(MountStep::Symlink {
                        target: name.clone(),
                        points_to: to.clone(),
                    }),
                    HostEntry::File | HostEntry::Other => {}
                }
            }
            push_ro_dir(&mut steps, path.join("etc"), "etc");
        }
    }

    steps.push(MountStep::Mkdir {
        target: "proc".into(),
    });
    steps.push(MountStep::Proc {
        target: "proc".into(),
    });
    for p in PROC_READ_ONLY {
        steps.push(MountStep::ReadOnly {
            target: format!("proc/{p}"),
        });
    }
    for p in PROC_MASKED {
        steps.push(MountStep::Mask {
            target: format!("proc/{p}"),
        });
    }

    steps.push(MountStep::Mkdir { target: "dev".into() });
    steps.push(MountStep::Tmpfs {
        target: "dev".into(),
        options: "mode=0755,size=64k",
        attrs: MountAttrs {
            readonly: false,
            nosuid: true,
            nodev: false,
            noexec: true,
        },
    });
    for d in DEVICES {
        steps.push(MountStep::Bind {
            source: PathBuf::from("/dev").join(d),
            target: format!("dev/{d}"),
            recursive: false,
            attrs: MountAttrs {
                readonly: false,
                nosuid: true,
                nodev: false,
                noexec: true,
            },
        });
    }
    steps.push(MountStep::Mkdir {
        target: "dev/pts".into(),
    });
    steps.push(MountStep::Devpts {
        target: "dev/pts".into(),
        max_ptys: SANDBOX_MAX_PTYS,
    });
    steps.push(MountStep::Symlink {
        target: "dev/ptmx".into(),
        points_to: "pts/ptmx".into(),
    });
    steps.push(MountStep::Mkdir {
        target: "dev/shm".into(),
    });
    steps.push(MountStep::Tmpfs {
        target: "dev/shm".into(),
        options: "mode=1777,size=64m",
        attrs: MountAttrs {
            readonly: false,
            nosuid: true,
            nodev: true,
            noexec: false,
        },
    });
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        steps.push(MountStep::Symlink {
            target: format!("dev/{link}"),
            points_to: to.into(),
        });
    }
    steps.push(MountStep::SetAttrs {
        target: "dev".into(),
        attrs: MountAttrs {
            readonly: true,
            nosuid: true,
            nodev: false,
            noexec: true,
        },
    });

    // Everything above is independent of the sandbox's volume, which the caller may still be creating.
    steps.push(MountStep::WaitForVolume);
    match &spec.rootfs {
        Rootfs::Host => push_bind_dir(&mut steps, volume.join("etc"), "etc", MountAttrs::WRITABLE),
        Rootfs::Image { .. } => {
            for name in image_dirs(top_level) {
                push_bind_dir(&mut steps, volume.join(name), name, MountAttrs::WRITABLE);
            }
            // Its top-level files too (their content is the sandbox's to change; the name, on
            // the read-only root, is not).
            for (name, _) in top_level.iter().filter(|(_, e)| *e == HostEntry::File) {
                steps.push(MountStep::Bind {
                    source: volume.join(name),
                    target: name.clone(),
                    recursive: false,
                    attrs: MountAttrs::WRITABLE,
                });
            }
        }
        Rootfs::Dir { .. } => {
            for file in GENERATED_ETC {
                steps.push(MountStep::Overlay {
                    source: volume.join("etc").join(file),
                    target: format!("etc/{file}"),
                });
            }
            if spec.netns.is_some() {
                // First: the generated files above go over it.
                let at = steps.len() - GENERATED_ETC.len();
                steps.insert(
                    at,
                    MountStep::Layer {
                        layer: volume.join("etc").join(NETWORK_ETC_LAYER),
                        target: "etc".into(),
                    },
                );
            }
        }
    }
    if !matches!(spec.rootfs, Rootfs::Image { .. }) {
        push_bind_dir(&mut steps, volume.join("home"), "home", MountAttrs::WRITABLE);
        push_bind_dir(&mut steps, volume.join("root"), "root", MountAttrs::WRITABLE);
        push_bind_dir(&mut steps, volume.join("tmp"), "tmp", MountAttrs::WRITABLE);
    }

    for m in &spec.mounts {
        let attrs = if m.read_only {
            MountAttrs::READ_ONLY_SYSTEM
        } else {
            MountAttrs::WRITABLE
        };
        steps.push(MountStep::Bind {
            source: m.host.clone(),
            target: m.sandbox.relative().to_owned(),
            recursive: true,
            attrs,
        });
    }
    for v in &spec.volumes {
        steps.push(MountStep::BindInRoot {
            source: v.host.clone(),
            target: v.sandbox.relative().to_owned(),
            attrs: if v.read_only {
                MountAttrs::READ_ONLY_SYSTEM
            } else {
                MountAttrs::WRITABLE
            },
        });
    }
    steps.push(MountStep::SetAttrs {
        target: String::new(),
        attrs: ROOT_FINAL,
    });
    steps
}

fn push_ro_dir(steps: &mut Vec<MountStep>, source: PathBuf, target: &str) {
    push_bind_dir(steps, source, target, MountAttrs::READ_ONLY_SYSTEM);
}

fn push_bind_dir(steps: &mut Vec<MountStep>, source: PathBuf, target: &str, attrs: MountAttrs) {
    steps.push(MountStep::Mkdir {
        target: target.to_owned(),
    });
    steps.push(MountStep::Bind {
        source,
        target: target.to_owned(),
        recursive: true,
        attrs,
    });
}

/// The top-level directories of an image template that are bound from the volume: all but the
/// kernel's and paddock's own.
fn image_dirs(top_level: &[(String, HostEntry)]) -> impl Iterator<Item = &str> {
    top_level.iter().filter_map(|(name, entry)| {
        (*entry == HostEntry::Dir && !IMAGE_MANAGED_TOP_LEVEL.contains(&name.as_str()))
            .then_some(name.as_str())
    })
}

/// Paths (inside the sandbox) where Landlock allows writes; everything else is read/execute only.
/// `top_level` is the listing [`plan_mounts`] had.
pub fn writable_paths(spec: &SetupSpec, top_level: &[(String, HostEntry)]) -> Vec<String> {
    let mut paths: Vec<String> = vec![
        "/home".into(),
        "/root".into(),
        "/tmp".into(),
        "/dev/shm".into(),
        "/dev/pts".into(),
    ];
    paths.extend(
        ["null", "zero", "full", "tty"]
            .iter()
            .map(|d| format!("/dev/{d}")),
    );
    match &spec.rootfs {
        Rootfs::Host => paths.push("/etc".into()),
        Rootfs::Image { .. } => {
            paths.retain(|p| !["/home", "/root", "/tmp"].contains(&p.as_str()));
            paths.extend(image_dirs(top_level).map(|name| format!("/{name}")));
            paths.extend(
                top_level
                    .iter()
                    .filter(|(_, e)| *e == HostEntry::File)
                    .map(|(name, _)| format!("/{name}")),
            );
        }
        Rootfs::Dir { .. } => {}
    }
    paths.extend(
        spec.mounts
            .iter()
            .chain(&spec.volumes)
            .filter(|m| !m.read_only)
            .map(|m| m.sandbox.to_string()),
    );
    paths
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::native::setup::SetupSpec;

    fn targets(steps: &[MountStep]) -> Vec<String> {
        steps
            .iter()
            .filter_map(|s| match s {
                MountStep::Bind { target, .. }
                | MountStep::BindInRoot { target, .. }
                | MountStep::Tmpfs { target, .. }
                | MountStep::Proc { target }
                | MountStep::Devpts { target, .. } => Some(target.clone()),
                MountStep::Symlink { target, .. } => Some(target.clone()),
                _ => None,
            })
            .collect()
    }

    fn host_top_level() -> Vec<(String, HostEntry)> {
        [
            "usr", "etc", "root", "home", "var", "srv", "opt", "mnt", "run", "boot", "sys",
        ]
        .iter()
        .map(|n| (n.to_string(), HostEntry::Dir))
        .chain(std::iter::once((
            "bin".to_string(),
            HostEntry::Symlink("usr/bin".into()),
        )))
        .collect()
    }

    #[test]
    fn default_profile_hides_the_host() {
        let spec = SetupSpec::example();
        let steps = plan_mounts(&spec, &host_top_level());
        let t = targets(&steps);
        for hidden in ["var", "srv", "opt", "mnt", "run", "boot", "sys"] {
            assert!(!t.iter().any(|x| x == hidden), "{hidden} would be visible");
        }
        // /root exists, but as the sandbox's own private directory, never the host's.
        assert!(steps
            .iter()
            .all(|s| !matches!(s, MountStep::Bind { source, .. } if source == &PathBuf::from("/root"))));
        for present in [
            "usr", "bin", "etc", "home", "tmp", "proc", "dev", "dev/pts", "dev/shm", "dev/null",
        ] {
            assert!(t.iter().any(|x| x == present), "{present} missing");
        }
        // The host's /etc is never bound: the sandbox's /etc comes from its own volume.
        assert!(steps
            .iter()
            .all(|s| !matches!(s, MountStep::Bind { source, .. } if source == &PathBuf::from("/etc"))));
        // System directories are read-only, nosuid, nodev.
        let usr = steps
            .iter()
            .find(|s| matches!(s, MountStep::Bind { target, .. } if target == "usr"));
        assert!(
            matches!(usr, Some(MountStep::Bind { attrs, .. }) if attrs.readonly && attrs.nosuid && attrs.nodev)
        );
        // Nothing reads the volume before the caller says it exists.
        let wait = steps
            .iter()
            .position(|s| *s == MountStep::WaitForVolume)
            .expect("wait step");
        let first_volume_use = steps
            .iter()
            .position(|s| matches!(s, MountStep::Bind { source, .. } if source.starts_with(&spec.volume)))
            .expect("volume used");
        assert!(wait < first_volume_use);
        // The root ends read-only, and kernel knobs are protected.
        assert!(
            matches!(steps.last(), Some(MountStep::SetAttrs { target, attrs }) if target.is_empty() && attrs.readonly)
        );
        assert!(steps.contains(&MountStep::ReadOnly {
            target: "proc/sys".into()
        }));
        assert!(steps.contains(&MountStep::ReadOnly {
            target: "proc/sysrq-trigger".into()
        }));
        assert!(steps.contains(&MountStep::Mask {
            target: "proc/kcore".into()
        }));
    }

    #[test]
    fn writable_paths_cover_only_private_storage() {
        let spec = SetupSpec::example();
        let w = writable_paths(&spec, &host_top_level());
        assert!(w.contains(&"/home".to_string()) && w.contains(&"/tmp".to_string()));
        assert!(!w
            .iter()
            .any(|p| p == "/" || p == "/usr" || p == "/proc" || p.starts_with("/proc")));
    }

    #[test]
    fn volumes_are_bound_in_root_nosuid_nodev_and_writable_only_when_rw() {
        let mut spec = SetupSpec::example();
        spec.volumes = vec![
            paddock_types::MountSpec {
                host: "/var/lib/paddock/pool/volumes/vol-0000000000000001".into(),
                sandbox: "/data".parse().expect("path"),
                read_only: false,
            },
            paddock_types::MountSpec {
                host: "/var/lib/paddock/pool/volumes/vol-0000000000000002".into(),
                sandbox: "/home/user/ref".parse().expect("path"),
                read_only: true,
            },
        ];
        let steps = plan_mounts(&spec, &host_top_level());
        let binds: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                MountStep::BindInRoot { target, attrs, .. } => Some((target.as_str(), *attrs)),
                _ => None,
            })
            .collect();
        assert_eq!(
            binds,
            [
                ("data", MountAttrs::WRITABLE),
                ("home/user/ref", MountAttrs::READ_ONLY_SYSTEM)
            ]
        );
        assert!(binds.iter().all(|(_, a)| a.nosuid && a.nodev));
        // After /home is bound (a volume beneath it must land on top), before the root turns read-only.
        let home = steps
            .iter()
            .position(|s| matches!(s, MountStep::Bind { target, .. } if target == "home"))
            .expect("home");
        let first = steps
            .iter()
            .position(|s| matches!(s, MountStep::BindInRoot { .. }))
            .expect("volume");
        assert!(home < first);
        let w = writable_paths(&spec, &host_top_level());
        assert!(w.contains(&"/data".to_string()));
        assert!(!w.contains(&"/home/user/ref".to_string()));
    }

    #[test]
    fn an_image_root_is_the_volume_writable_nosuid_nodev_after_the_wait() {
        let mut spec = SetupSpec::example();
        spec.rootfs = Rootfs::Image {
            template: "/var/lib/paddock/pool/images/tp-1".into(),
        };
        let top = [
            ("bin", HostEntry::Symlink("usr/bin".into())),
            ("dev", HostEntry::Dir),
            ("etc", HostEntry::Dir),
            ("home", HostEntry::Dir),
            ("proc", HostEntry::Dir),
            ("sys", HostEntry::Dir),
            ("tmp", HostEntry::Dir),
            ("usr", HostEntry::Dir),
            ("proc", HostEntry::Symlink("/".into())),
            (".dockerenv", HostEntry::File),
            ("sock", HostEntry::Other),
        ]
        .map(|(n, e)| (n.to_owned(), e));
        let steps = plan_mounts(&spec, &top);
        let binds: Vec<_> = steps
            .iter()
            .filter_map(|s| match s {
                MountStep::Bind {
                    source,
                    target,
                    attrs,
                    ..
                } if source.starts_with(&spec.volume) => Some((target.as_str(), source.clone(), *attrs)),
                _ => None,
            })
            .collect();
        let names: Vec<_> = binds.iter().map(|b| b.0).collect();
        assert_eq!(
            names,
            ["etc", "home", "tmp", "usr", ".dockerenv"],
            "kernel and paddock names are never the image's; files are bound, sockets not"
        );
        for (name, source, attrs) in &binds {
            assert_eq!(source, &spec.volume.join(name));
            assert_eq!(*attrs, MountAttrs::WRITABLE);
            assert!(attrs.nosuid && attrs.nodev);
        }
        // Nothing of the template itself is bound: its tree is read through the volume's copy.
        assert!(steps.iter().all(|s| !matches!(s, MountStep::Bind { source, .. } if source.starts_with("/var/lib/paddock/pool/images"))));
        let wait = steps
            .iter()
            .position(|s| *s == MountStep::WaitForVolume)
            .expect("wait");
        let first = steps
            .iter()
            .position(|s| matches!(s, MountStep::Bind { source, .. } if source.starts_with(&spec.volume)))
            .expect("volume");
        assert!(wait < first);
        assert!(steps.contains(&MountStep::Symlink {
            target: "bin".into(),
            points_to: "usr/bin".into()
        }));
        assert!(!steps
            .iter()
            .any(|s| matches!(s, MountStep::Symlink { target, .. } if target == "proc")));
        assert!(
            matches!(steps.last(), Some(MountStep::SetAttrs { target, attrs }) if target.is_empty() && attrs.readonly)
        );
        let w = writable_paths(&spec, &top);
        for p in ["/etc", "/home", "/tmp", "/usr", "/dev/shm", "/.dockerenv"] {
            assert!(w.contains(&p.to_owned()), "{p} not writable");
        }
        for p in ["/", "/proc", "/sys", "/dev", "/bin", "/root", "/sock"] {
            assert!(!w.contains(&p.to_owned()), "{p} writable");
        }
    }
}

//! Executes a mount plan inside the sandbox's fresh mount namespace.

use std::fs;
use std::io;
use std::os::unix::fs::{symlink, DirBuilderExt};
use std::path::{Path, PathBuf};

use std::os::fd::AsFd;

use paddock_sys::fs_in_root::Root;
use paddock_sys::mount::{self, MountAttrs};
use rustix::fs::OFlags;

use super::plan::MountStep;

fn at(root: &Path, target: &str) -> PathBuf {
    if target.is_empty() {
        root.to_owned()
    } else {
        root.join(target)
    }
}

fn ctx(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// `path` as an overlayfs layer option: refused when it holds the option syntax's separators.
fn overlay_path(path: &Path) -> io::Result<&str> {
    path.to_str()
        .filter(|p| !p.contains([':', ',', '\\']))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} cannot be an overlay layer (`:`, `,` or `\\` in it)",
                    path.display()
                ),
            )
        })
}

/// Creates an empty file or directory at `target` to bind `source` onto.
fn ensure_mount_point(source: &Path, target: &Path) -> io::Result<()> {
    let meta = fs::metadata(source).map_err(|e| ctx(e, "cannot mount missing source", source))?;
    if fs::symlink_metadata(target).is_ok() {
        return Ok(());
    }
    if let Some(parent) = target.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(|e| ctx(e, "cannot create mount point", parent))?;
    }
    if meta.is_dir() {
        fs::DirBuilder::new()
            .mode(0o755)
            .create(target)
            .map_err(|e| ctx(e, "cannot create mount point", target))
    } else {
        fs::File::create(target)
            .map(drop)
            .map_err(|e| ctx(e, "cannot create mount point", target))
    }
}

/// Runs every step against the new root at `root`; `wait_for_volume` is called at
/// [`MountStep::WaitForVolume`].
pub fn execute(
    root: &Path,
    steps: &[MountStep],
    mut wait_for_volume: impl FnMut() -> io::Result<()>,
) -> io::Result<()> {
    for step in steps {
        match step {
            MountStep::WaitForVolume => wait_for_volume()?,
            MountStep::Tmpfs {
                target,
                options,
                attrs,
            } => {
                mount::mount_fs("tmpfs", &at(root, target), *attrs, options)?;
            }
            MountStep::Bind {
                source,
                target,
                recursive,
                attrs,
            } => {
                let dst = at(root, target);
                ensure_mount_point(source, &dst)?;
                mount::bind(source, &dst, *recursive)?;
                mount::set_attrs(&dst, *attrs, *recursive)?;
            }
            MountStep::Proc { target } => {
                let attrs = MountAttrs {
                    readonly: false,
                    nosuid: true,
                    nodev: true,
                    noexec: true,
                };
                mount::mount_fs("proc", &at(root, target), attrs, "")?;
            }
            MountStep::Devpts { target, max_ptys } => {
                let attrs = MountAttrs {
                    readonly: false,
                    nosuid: true,
                    nodev: false,
                    noexec: true,
                };
                mount::mount_fs(
                    "devpts",
                    &at(root, target),
                    attrs,
                    &format!("newinstance,ptmxmode=0666,mode=0620,gid=5,max={max_ptys}"),
                )?;
            }
            MountStep::Mkdir { target } => {
                let dst = at(root, target);
                match fs::DirBuilder::new().mode(0o755).create(&dst) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(ctx(e, "cannot create directory", &dst)),
                }
            }
            MountStep::Symlink { target, points_to } => {
                let dst = at(root, target);
                symlink(points_to, &dst).map_err(|e| ctx(e, "cannot create symlink", &dst))?;
            }
            MountStep::Overlay { source, target } => {
                let dst = at(root, target);
                if fs::symlink_metadata(&dst).is_ok_and(|m| m.is_file()) {
                    // The source lies in the sandbox's own file system, which a snapshot carries over
                    // from another sandbox: a symlink there would be followed here, in the host's
                    // view, and bind a host file. Only a regular file is taken (nothing runs in the
                    // sandbox during its setup, so it cannot change between the check and the bind).
                    let meta = fs::symlink_metadata(source).map_err(|e| ctx(e, "cannot inspect", source))?;
                    if !meta.is_file() {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "{} in the sandbox's file system is not a regular file (a symlink or \
                                 a directory there is refused)",
                                target
                            ),
                        ));
                    }
                    mount::bind(source, &dst, false)?;
                    mount::set_attrs(&dst, MountAttrs::READ_ONLY_SYSTEM, false)?;
                }
            }
            MountStep::Layer { layer, target } => {
                let dst = at(root, target);
                // Nothing runs in the sandbox during its setup: the layer cannot change in between.
                let meta = fs::symlink_metadata(layer).map_err(|e| ctx(e, "cannot inspect", layer))?;
                if !meta.is_dir() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{} is not a directory (a symlink there is refused)",
                            layer.display()
                        ),
                    ));
                }
                let options = format!("lowerdir={}:{}", overlay_path(layer)?, overlay_path(&dst)?);
                mount::mount_fs("overlay", &dst, MountAttrs::READ_ONLY_SYSTEM, &options)?;
            }
            MountStep::ReadOnly { target } => {
                let dst = at(root, target);
                if fs::symlink_metadata(&dst).is_ok() {
                    mount::bind(&dst, &dst, true)?;
                    mount::set_attrs(
                        &dst,
                        MountAttrs {
                            readonly: true,
                            nosuid: true,
                            nodev: true,
                            noexec: true,
                        },
                        true,
                    )?;
                }
            }
            MountStep::Mask { target } => {
                let dst = at(root, target);
                match fs::symlink_metadata(&dst) {
                    Ok(m) if m.is_dir() => {
                        let attrs = MountAttrs {
                            readonly: true,
                            nosuid: true,
                            nodev: true,
                            noexec: true,
                        };
                        mount::mount_fs("tmpfs", &dst, attrs, "size=0,mode=0555")?;
                    }
                    Ok(_) => {
                        let null = root.join("dev/null");
                        let src = if null.exists() {
                            null
                        } else {
                            PathBuf::from("/dev/null")
                        };
                        mount::bind(&src, &dst, false)?;
                    }
                    Err(_) => {}
                }
            }
            MountStep::BindInRoot {
                source,
                target,
                attrs,
            } => {
                let confined = Root::open(root).map_err(|e| ctx(e, "cannot open", root))?;
                let target = Path::new(target);
                confined
                    .mkdir_all(target, 0o755, None)
                    .map_err(|e| ctx(e, "cannot create mount point", &root.join(target)))?;
                let dir = confined
                    .open_with(target, OFlags::PATH | OFlags::DIRECTORY, 0)
                    .map_err(|e| ctx(e, "cannot open mount point", &root.join(target)))?;
                mount::bind_tree_onto(source, dir.as_fd(), *attrs)
                    .map_err(|e| ctx(e, "cannot mount", &root.join(target)))?;
            }
            MountStep::SetAttrs { target, attrs } => {
                mount::set_attrs(&at(root, target), *attrs, false)?;
            }
        }
    }
    Ok(())
}

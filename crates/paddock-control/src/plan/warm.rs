//! What a warm sandbox reads ahead before it is handed out (`Request::Prefetch`): a sandbox's
//! files are its own copies of its template's (a btrfs snapshot shares extents, not cached pages),
//! so without this the first command of a claimed sandbox reads its shell, loader and libraries
//! from disk. For a template made from an image that is the whole program (a static busybox is
//! 2 MB); for the host template, whose `/usr` is the host's, mostly `/etc`.
//!
//! What it does not do: read anything (the agent does, inside the sandbox, with its bounds), or
//! guess beyond the files nearly every first command uses and the image's own command.

use std::collections::BTreeMap;

/// The files nearly every first command reads: the user database the agent reads at each spawn,
/// the dynamic loader's cache, loaders and C libraries of glibc and musl systems, and the shells
/// and `env` that commands run through. Missing ones are skipped by the agent.
const COMMON: &[&str] = &[
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
    "/lib64/ld-linux-x86-64.so.2",
    "/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/lib/ld-linux-aarch64.so.1",
    "/lib/aarch64-linux-gnu/libc.so.6",
    "/usr/lib/aarch64-linux-gnu/libc.so.6",
    "/lib/ld-musl-x86_64.so.1",
    "/lib/ld-musl-aarch64.so.1",
    "/bin/sh",
    "/bin/bash",
    "/usr/bin/env",
];

/// At most this many paths (below the agent's bound, `PREFETCH_MAX_PATHS`, so a long `PATH` never
/// makes the request refused).
const MAX_PATHS: usize = 48;
const _: () = assert!(MAX_PATHS <= paddock_protocol::PREFETCH_MAX_PATHS);

/// The paths to read ahead in a warm sandbox whose environment is `env` and whose image's command
/// is `command` (its entrypoint and command, when the template is made from an image): the common
/// files, then the command's program (as given when it names a path, else in each directory of
/// the environment's `PATH`).
pub(crate) fn prefetch_paths(env: &BTreeMap<String, String>, command: Option<&[String]>) -> Vec<String> {
    let mut paths: Vec<String> = COMMON.iter().map(|p| (*p).to_owned()).collect();
    if let Some(program) = command.and_then(|c| c.first()).filter(|p| !p.is_empty()) {
        if program.starts_with('/') {
            paths.push(program.clone());
        } else if !program.contains('/') {
            let path = env
                .get("PATH")
                .map_or("/usr/local/bin:/usr/bin:/bin", String::as_str);
            paths.extend(
                path.split(':')
                    .filter(|dir| dir.starts_with('/'))
                    .map(|dir| format!("{}/{program}", dir.trim_end_matches('/'))),
            );
        }
    }
    let mut seen = std::collections::HashSet::new();
    paths.retain(|p| seen.insert(p.clone()));
    paths.truncate(MAX_PATHS);
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(path: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("PATH".to_owned(), path.to_owned())])
    }

    #[test]
    fn common_files_then_the_images_program() {
        let paths = prefetch_paths(
            &env("/usr/local/bin:/usr/bin:/bin"),
            Some(&["python3".into(), "-i".into()]),
        );
        assert_eq!(
            paths[..4],
            [
                "/etc/passwd",
                "/etc/group",
                "/etc/nsswitch.conf",
                "/etc/ld.so.cache"
            ]
        );
        assert_eq!(
            paths[COMMON.len()..],
            ["/usr/local/bin/python3", "/usr/bin/python3", "/bin/python3"]
        );
        let paths = prefetch_paths(&env("/bin"), Some(&["/opt/app/server".into()]));
        assert_eq!(paths[COMMON.len()..], ["/opt/app/server"]);
    }

    #[test]
    fn relative_programs_and_path_entries_and_duplicates_add_nothing() {
        let base = prefetch_paths(&BTreeMap::new(), None);
        assert_eq!(base.len(), COMMON.len());
        assert_eq!(prefetch_paths(&env("/bin"), Some(&["./run".into()])), base);
        assert_eq!(prefetch_paths(&env("/bin"), Some(&[String::new()])), base);
        assert_eq!(prefetch_paths(&env("/bin"), Some(&["sh".into()])), base);
        assert_eq!(prefetch_paths(&env("relative::"), Some(&["x".into()])), base);
    }

    #[test]
    fn bounded() {
        let long = (0..200).map(|i| format!("/d{i}")).collect::<Vec<_>>().join(":");
        let paths = prefetch_paths(&env(&long), Some(&["prog".into()]));
        assert_eq!(paths.len(), MAX_PATHS);
    }
}

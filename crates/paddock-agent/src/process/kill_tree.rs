//! Signalling a process tree: the process, everything in its session and process group (the agent
//! starts every process as a session leader, so its pid is its session id), and every descendant
//! found by walking `/proc/<pid>/stat` parent links.
//!
//! For `SIGKILL` the sweep is repeated until it finds nothing alive (at most [`KILL_SWEEPS`] times),
//! so children forked while the previous sweep ran are caught too. Limitation: a process that
//! double-forks *and* calls `setsid` leaves the tree (new session, re-parented to the agent) and
//! escapes this sweep, though never the sandbox: destroying the sandbox kills its whole PID
//! namespace.

use std::collections::HashSet;

use paddock_sys::reap::send_signal;

/// Maximum number of `SIGKILL` sweeps.
const KILL_SWEEPS: usize = 5;

/// One line of `/proc/<pid>/stat`, the fields that matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    pid: u32,
    state: u8,
    ppid: u32,
    pgrp: u32,
    session: u32,
}

/// Sends `signal` to the tree rooted at `root`. With `include_root` false (the root has exited and
/// been reaped, so its pid may belong to someone else), only session, group and descendant links of
/// the root's session are followed.
pub(crate) fn kill_tree(root: u32, signal: i32, include_root: bool) {
    let sweeps = if signal == libc::SIGKILL { KILL_SWEEPS } else { 1 };
    let me = std::process::id();
    for _ in 0..sweeps {
        let table = read_proc_table();
        let targets = tree_members(&table, root, include_root, me);
        if targets.is_empty() {
            break;
        }
        for pid in targets {
            // Gone already (or never ours to signal): nothing left to do for it.
            let _ = send_signal(pid, signal);
        }
    }
}

/// Live (non-zombie) members of the tree rooted at `root`, never the agent itself.
fn tree_members(table: &[ProcStat], root: u32, include_root: bool, me: u32) -> Vec<u32> {
    let mut members: HashSet<u32> = table
        .iter()
        .filter(|p| (include_root && p.pid == root) || p.session == root || p.pgrp == root)
        .map(|p| p.pid)
        .collect();
    if include_root {
        members.insert(root);
    }
    loop {
        let before = members.len();
        for p in table {
            if members.contains(&p.ppid) {
                members.insert(p.pid);
            }
        }
        if members.len() == before {
            break;
        }
    }
    let alive: HashSet<u32> = table
        .iter()
        .filter(|p| p.state != b'Z' && p.state != b'X')
        .map(|p| p.pid)
        .collect();
    let mut out: Vec<u32> = members
        .into_iter()
        .filter(|p| *p != me && *p != 1 && alive.contains(p))
        .collect();
    out.sort_unstable();
    out
}

/// Reads every process's `/proc/<pid>/stat`; processes that vanish meanwhile are skipped.
fn read_proc_table() -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|line| parse_stat(&line))
        .collect()
}

/// Parses `pid (comm) state ppid pgrp session ...`; `comm` may contain spaces and parentheses, so
/// the fields after it are found from the last `)`.
fn parse_stat(line: &str) -> Option<ProcStat> {
    let (head, tail) = line.rsplit_once(')')?;
    let pid = head.split_once('(')?.0.trim().parse().ok()?;
    let mut fields = tail.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    let session = fields.next()?.parse().ok()?;
    Some(ProcStat {
        pid,
        state,
        ppid,
        pgrp,
        session,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: u32, ppid: u32, pgrp: u32, session: u32) -> ProcStat {
        ProcStat {
            pid,
            state: b'S',
            ppid,
            pgrp,
            session,
        }
    }

    #[test]
    fn parses_stat_lines_with_odd_names() {
        let s = parse_stat("42 (a) b (c)) R 7 42 40 0 -1").expect("parses");
        assert_eq!(
            s,
            ProcStat {
                pid: 42,
                state: b'R',
                ppid: 7,
                pgrp: 42,
                session: 40
            }
        );
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn finds_session_group_and_descendants() {
        let table = vec![
            p(1, 0, 1, 1),
            p(10, 1, 10, 10),  // the root
            p(11, 10, 10, 10), // child
            p(12, 1, 12, 10),  // orphan still in the session
            p(13, 12, 13, 13), // child of the orphan that called setsid
            p(20, 1, 20, 20),  // unrelated
            ProcStat {
                pid: 14,
                state: b'Z',
                ppid: 10,
                pgrp: 10,
                session: 10,
            },
        ];
        assert_eq!(tree_members(&table, 10, true, 1), vec![10, 11, 12, 13]);
        assert_eq!(tree_members(&table, 10, false, 1), vec![10, 11, 12, 13]);
        assert_eq!(
            tree_members(&table, 20, true, 20),
            Vec::<u32>::new(),
            "never the agent itself"
        );
    }
}

//! The agent's shared state: the confined root, the default user, the process table, watches and
//! kernels. The agent
//! runs on one thread (a tokio current-thread runtime with a `LocalSet`), so the state lives in an
//! `Rc` with `RefCell`s, and no borrow is ever held across an `.await`.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;

use paddock_protocol::{AgentError, ErrorCode};
use paddock_sys::fs_in_root::{Owner, Root};

use crate::error_code::agent_error;
use crate::kernel::Kernels;
use crate::lookup_user::{lookup_user, User};
use crate::process::kill_tree::kill_tree;
use crate::process::table::{Process, ProcessTable};
use crate::watch::Watcher;

/// Everything the connections share.
#[derive(Debug)]
pub(crate) struct Agent {
    /// The directory file operations (and the user database) are confined to.
    pub(crate) root: Root,
    /// Its path from the agent's own root directory (`/` in a sandbox), canonical.
    pub(crate) root_path: PathBuf,
    default_user: String,
    /// Processes started through the agent.
    pub(crate) processes: RefCell<ProcessTable>,
    /// Directory watches.
    pub(crate) watcher: Watcher,
    /// Code kernels.
    pub(crate) kernels: Kernels,
    next_conn: Cell<u64>,
    /// The connections holding the sandbox ([`paddock_protocol::Request::Hold`]).
    holders: RefCell<std::collections::BTreeSet<u64>>,
}

impl Agent {
    pub(crate) fn new(root: Root, root_path: PathBuf, default_user: String) -> Self {
        Self {
            root,
            root_path,
            default_user,
            processes: RefCell::new(ProcessTable::default()),
            watcher: Watcher::default(),
            kernels: Kernels::default(),
            next_conn: Cell::new(1),
            holders: RefCell::default(),
        }
    }

    /// A fresh connection id.
    pub(crate) fn next_connection_id(&self) -> u64 {
        let id = self.next_conn.get();
        self.next_conn.set(id + 1);
        id
    }

    /// Looks up `name`, or the default user when `None`.
    pub(crate) fn user(&self, name: Option<&str>) -> Result<User, AgentError> {
        lookup_user(&self.root, name.unwrap_or(&self.default_user))
    }

    /// The owner for new files: `name`'s (or the default user's) uid and primary gid.
    pub(crate) fn owner(&self, name: Option<&str>) -> Result<Owner, AgentError> {
        let user = self.user(name)?;
        Ok(Owner {
            uid: user.uid,
            gid: user.gid,
        })
    }

    /// The process `pid`, if the agent started it (and still remembers it).
    pub(crate) fn process(&self, pid: u32) -> Result<Rc<Process>, AgentError> {
        self.processes.borrow().get(pid).ok_or_else(|| {
            agent_error(
                ErrorCode::ProcessNotFound,
                format!("no process {pid} was started by the agent"),
            )
        })
    }

    /// Moves `process` to the finished list once its exit is known and its output is complete.
    pub(crate) fn check_finished(&self, process: &Rc<Process>) {
        if process.take_finished() {
            self.processes.borrow_mut().mark_finished(process);
        }
    }

    /// Forgets connection `conn`: stops forwarding output to it and ends its watches.
    pub(crate) fn disconnect(&self, conn: u64) {
        let processes = self.processes.borrow().all();
        for process in processes {
            process.unsubscribe(conn);
        }
        self.watcher.disconnect(conn);
        let mut holders = self.holders.borrow_mut();
        if holders.remove(&conn) && holders.is_empty() {
            // The supervisor that held the sandbox is gone: so is the sandbox. The agent is its
            // PID 1, so its exit ends every process in it.
            tracing::info!(conn, "the last connection holding the sandbox closed: ending it");
            self.kill_all_processes();
            std::process::exit(0);
        }
    }

    /// Connection `conn` holds the sandbox until it closes ([`Self::disconnect`]).
    pub(crate) fn hold(&self, conn: u64) {
        self.holders.borrow_mut().insert(conn);
    }

    /// Kills every running process tree (shutdown).
    pub(crate) fn kill_all_processes(&self) {
        let processes = self.processes.borrow().all();
        for process in processes {
            kill_tree(process.pid(), libc::SIGKILL, process.exit_status().is_none());
        }
    }
}

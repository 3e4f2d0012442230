//! Processes started through the agent: spawning, output buffering and forwarding with
//! backpressure, stdin, reaping, and killing process trees.

pub(crate) mod attach;
pub(crate) mod kill_tree;
pub(crate) mod output;
pub(crate) mod reap;
pub(crate) mod spawn;
pub(crate) mod stdin;
pub(crate) mod table;

//! A hostile sandbox or tenant against the host: host-wide kernel budgets, btrfs interfaces, the
//! host's handling of files a sandbox wrote, and a server under attack at full speed.

mod budgets;
mod host_fs;
mod kernel;
mod under_attack;

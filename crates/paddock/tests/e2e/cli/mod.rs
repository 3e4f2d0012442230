//! The command line: `paddock run` as a tool, the client against a scripted server, the client
//! against a real `paddock serve`, and the approvals queue and approved executions driven from the
//! client.

mod approvals;
mod client;
mod executions;
mod run;
mod serve;

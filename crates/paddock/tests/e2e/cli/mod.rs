//! The command line: `paddock run` as a tool, the client against a scripted server, and the client
//! against a real `paddock serve`.

mod client;
mod run;
mod serve;

//! What operations hand back: streams of process output, collected output, file downloads and watch
//! events, and the conversion of agent events into them.
//!
//! It does not start or follow processes.

pub(crate) mod collect;
pub(crate) mod events;
pub(crate) mod streams;

//! What operations hand back: streams of process output (bytes until the front-end encodes them),
//! collected output, file downloads and watch events, and the conversion of agent events into them.
//!
//! It does not start or follow processes, and makes no wire form of output (`paddock-api` does).

pub(crate) mod collect;
pub(crate) mod events;
pub(crate) mod streams;

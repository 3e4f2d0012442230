//! paddock-protocol

//! paddock-runtime

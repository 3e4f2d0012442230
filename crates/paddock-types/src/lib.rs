//! paddock-types

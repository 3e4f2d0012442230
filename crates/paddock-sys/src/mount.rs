//! mount

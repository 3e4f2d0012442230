//! namespace

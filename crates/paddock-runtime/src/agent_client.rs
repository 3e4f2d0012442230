//! agent client (being written)

//! fs_in_root

//! btrfs

//! The local registry the tests pull from, and the images they push to it.

pub mod images;
pub mod registry;

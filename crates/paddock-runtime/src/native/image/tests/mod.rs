//! Tests of the image module that need its parts together.

mod layer;
mod layout;
mod model;

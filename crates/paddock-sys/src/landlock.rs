//! landlock

//! Crashes and restarts of `paddock serve`: at each crash point, at an exec's spawn and under load;
//! recovery of every kind of sandbox; paused and stopped ones kept; a full disk and a full pool.

mod exec;
mod full_disk;
mod load;
mod points;
mod recovery;
mod restart_states;
mod templates;

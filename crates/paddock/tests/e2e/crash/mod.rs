mod exec;
mod full_disk;
mod load;
mod points;
mod recovery;
mod restart_states;

mod adopt;
mod isolation;
mod limits;
mod network;
mod snapshots;
mod teardown;

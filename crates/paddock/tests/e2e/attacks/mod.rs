mod budgets;
mod host_fs;
mod kernel;
mod under_attack;

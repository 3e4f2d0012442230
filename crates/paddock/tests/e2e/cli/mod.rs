mod client;
mod run;
mod serve;

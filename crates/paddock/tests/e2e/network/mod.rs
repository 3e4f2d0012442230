mod audit;
mod egress;

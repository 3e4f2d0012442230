//! paddock-kube's tests, one binary: `job` (golden files, properties), `executor` (the executor
//! against a loopback API server, `fake_api`), `schema` (Kubernetes' schemas, offline) and
//! `cluster` (a real cluster, only when `KUBECONFIG` is set at build time; skipped otherwise).

mod cluster;
mod executor;
mod fake_api;
mod job;
mod schema;

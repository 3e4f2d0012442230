//! Turns the real-cluster test on when `KUBECONFIG` is set: `cfg(paddock_kube_cluster)`. Without
//! it the test is compiled `#[ignore]`d with a `SKIPPED: ...` reason, so test runners report it as
//! skipped rather than passed. Changing `KUBECONFIG` rebuilds.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(paddock_kube_cluster)");
    println!("cargo::rerun-if-env-changed=KUBECONFIG");
    if std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=paddock_kube_cluster");
    }
}

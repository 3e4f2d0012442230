#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, golden, property and end-to-end tests.
# Run as root on Debian 12 (the end-to-end tests create real sandboxes). Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/install-e2b-clients.sh
if ! command -v cargo-nextest >/dev/null; then
  cargo install cargo-nextest --locked
fi
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The end-to-end tests run the real binaries: build them all first.
cargo build --workspace --locked
# A test process killed from outside (a timeout, ^C) cannot run its cleanup: sweep what such runs left
# (their storage pools and parent cgroups) before starting.
for dir in /var/tmp/paddock-test-*; do
  [ -d "$dir" ] || continue
  name=$(basename "$dir")
  PADDOCK_STATE_DIR="$dir" PADDOCK_CGROUP_PARENT="$name" \
    PADDOCK_AGENT=target/x86_64-unknown-linux-gnu/debug/paddock-agent \
    target/x86_64-unknown-linux-gnu/debug/paddock pool destroy >/dev/null || true
  for h in /sys/fs/cgroup/*/"$name" /sys/fs/cgroup/"$name"; do [ -d "$h" ] && { rmdir "$h" 2>/dev/null || true; }; done
  rm -rf "$dir"
done
cargo nextest run --workspace --locked --no-fail-fast "$@"

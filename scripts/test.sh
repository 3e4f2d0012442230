#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, golden, property and end-to-end tests.
# Run as root on Debian 12 (the end-to-end tests create real sandboxes). Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if ! command -v cargo-nextest >/dev/null; then
  cargo install cargo-nextest --locked
fi
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The end-to-end tests run the real binaries: build them all first.
cargo build --workspace --locked
cargo nextest run --workspace --locked --no-fail-fast "$@"

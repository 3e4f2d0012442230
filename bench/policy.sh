#!/usr/bin/env bash
# decide() of an approval policy with 1,000 rules (issue 17's figure: at most 20 µs at p50 for an
# allowed exec). Prints JSON: p50, p99 and mean per call, and the policy's compile time.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run --quiet --release --locked -p paddock-policy --example decide_bench

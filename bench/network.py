#!/usr/bin/env python3
"""HTTPS requests from inside a sandbox: paddock (through its egress proxy) against bubblewrap with the
host's network (unfiltered), in one run.

Usage (as root, after `cargo build --release -p paddock && cargo build --release -p paddock-agent`):
    python3 bench/network.py [--requests 300] [--rounds 3]

Sets up its own "outside": a host-side veth pair with 198.51.100.254/32 (TEST-NET-2; nothing leaves the
machine) and a Python HTTPS server on it (HTTP/1.1, keep-alive) under a CA of its own. The same client
script (bench/network_client.py) runs:
  - `bwrap`: bubblewrap with `--share-net`, connecting straight to the server (the peer: no filtering);
  - `paddock proxy`: `paddock run --allow-domain bench.test`, through HTTPS_PROXY (CONNECT, relayed);
  - `paddock transparent`: the same sandbox, ignoring the proxy: the name resolved by paddock's DNS,
    the connection redirected by nftables to the transparent door (SNI checked against the DNS pin);
  - `paddock inject`: CONNECT to a host a secret is bound to: TLS terminated with the sandbox's CA, the
    placeholder in `Authorization` replaced, TLS to the server.
For each: a new connection per request (connect + TLS + one request) and requests on one kept-alive
connection; per-request p50/p90 in microseconds and the p50 added over the peer. Rounds alternate the
kinds so load elsewhere hits them alike. Everything it creates is removed at the end.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
PADDOCK = os.environ.get("PADDOCK_BIN", os.path.join(ROOT, "target/x86_64-unknown-linux-gnu/release/paddock"))
sys.path.insert(0, HERE)
from startup import BWRAP  # noqa: E402  (the same peer configuration as startup.py)

IP = "198.51.100.254"
IFACE = "pdkbench%d" % (os.getpid() % 10000)
SERVER = r'''
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall
    def do_GET(self):
        body = b"ok " + (self.headers.get("Authorization") or "-").encode() + b"\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer((sys.argv[1], 0), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain(sys.argv[2], sys.argv[3])
s.socket = c.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
'''


def sh(*argv, **kw):
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def make_certs(d):
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    sh("openssl", "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
       "-subj", "/CN=bench CA", cwd=d)
    sh("openssl", "req", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=bench.test", cwd=d)
    with open(os.path.join(d, "leaf.ext"), "w") as f:
        f.write("subjectAltName=DNS:bench.test,DNS:inject.test\nbasicConstraints=CA:FALSE\n"
                "extendedKeyUsage=serverAuth\n")
    sh("openssl", "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
       "-out", "leaf.pem", "-days", "2", "-extfile", "leaf.ext", cwd=d)


def summarize(xs, base=None):
    xs = sorted(xs)
    p50 = statistics.median(xs)
    p90 = xs[min(len(xs) - 1, int(round((len(xs) - 1) * 0.9)))]
    out = {"p50_us": round(p50), "p90_us": round(p90), "n": len(xs)}
    if base is not None:
        out["added_p50_us"] = round(p50 - base)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root")
    work = tempfile.mkdtemp(prefix="paddock-netbench-")
    os.chmod(work, 0o755)  # the sandboxes' user reads the client script (and the CA) from here
    state = tempfile.mkdtemp(prefix="paddock-netbench-", dir="/var/tmp")
    os.rmdir(state)
    cgroup = "paddock-netbench-%d" % os.getpid()
    server = None
    try:
        make_certs(work)
        # Both ends of a veth pair stay on the host (some kernels have no dummy interfaces).
        sh("ip", "link", "add", IFACE, "type", "veth", "peer", "name", IFACE + "p")
        sh("ip", "addr", "add", IP + "/32", "dev", IFACE)
        sh("ip", "link", "set", IFACE, "up")
        sh("ip", "link", "set", IFACE + "p", "up")
        server = subprocess.Popen([sys.executable, "-c", SERVER, IP, os.path.join(work, "leaf.pem"),
                                   os.path.join(work, "leaf.key")], stdout=subprocess.PIPE, text=True)
        port = int(server.stdout.readline())
        shutil.copy(os.path.join(HERE, "network_client.py"), os.path.join(work, "client.py"))
        config = os.path.join(work, "paddock.toml")
        with open(config, "w") as f:
            f.write("[egress]\nsystem_resolver = false\nupstream_ca_files = [%s]\n" %
                    json.dumps(os.path.join(work, "ca.pem")))
            f.write('[egress.hosts]\n"bench.test" = ["%s"]\n"inject.test" = ["%s"]\n' % (IP, IP))
            f.write('[[egress.allow]]\ncidr = "%s/32"\nports = [%d]\nreason = "benchmark server"\n' % (IP, port))
        env = dict(os.environ, PADDOCK_CGROUP_PARENT=cgroup, PADDOCK_LOG="error", TOKEN="bench-secret-value")
        n = str(args.requests)
        paddock = [PADDOCK, "--state-dir", state, "--config", config, "run", "--allow-domain", "bench.test",
                   "--allow-domain", "inject.test", "--secret", "TOKEN:inject.test",
                   "-v", work + ":/bench:ro", "--", "python3", "/bench/client.py"]
        peer = [*BWRAP[:2], "--share-net", *BWRAP[2:-1], "--ro-bind", work, "/bench",
                "--ro-bind", "/etc/hosts", "/etc/hosts", "--", "python3", "/bench/client.py"]
        peer_args = ["direct", IP, str(port), n, "/bench/ca.pem"]
        results = {}

        def collect(name, argv):
            out = subprocess.run(argv, capture_output=True, text=True, env=env)
            if out.returncode != 0:
                sys.exit("%s failed (%d): %s" % (name, out.returncode, out.stderr.strip()))
            got = json.loads(out.stdout.strip().splitlines()[-1])
            for kind, xs in got.items():
                results.setdefault((name, kind), []).extend(xs)

        for _ in range(args.rounds):
            collect("bwrap (direct)", [*peer, *peer_args])
            collect("paddock proxy", [*paddock, "proxy", "bench.test", str(port), n, "/bench/ca.pem"])
            collect("paddock transparent", [*paddock, "transparent", "bench.test", str(port), n, "/bench/ca.pem"])
            collect("paddock inject", [*paddock, "inject", "inject.test", str(port), n, ""])
        report = {}
        for kind in ("new", "keepalive"):
            base = statistics.median(results[("bwrap (direct)", kind)])
            for name in ("bwrap (direct)", "paddock proxy", "paddock transparent", "paddock inject"):
                xs = results[(name, kind)]
                report["%s, %s" % (name, kind)] = summarize(xs, None if name.startswith("bwrap") else base)
        print(json.dumps(report, indent=1))
    finally:
        if server:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", IFACE], stderr=subprocess.DEVNULL)
        if os.path.isdir(state):
            subprocess.run([PADDOCK, "--state-dir", state, "pool", "destroy"],
                           env=dict(os.environ, PADDOCK_CGROUP_PARENT=cgroup), stdout=subprocess.DEVNULL)
            shutil.rmtree(state, ignore_errors=True)
        for h in [os.path.join("/sys/fs/cgroup", c, cgroup) for c in os.listdir("/sys/fs/cgroup")]:
            if os.path.isdir(h):
                try:
                    os.rmdir(h)
                except OSError:
                    pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

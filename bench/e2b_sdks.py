#!/usr/bin/env python3
"""E2B's official SDKs against paddock's E2B front-end, beside paddock's own /v1 API, in one run.

Usage (as root, after `cargo build --release -p paddock && cargo build --release -p paddock-agent` and
`scripts/install-e2b-clients.sh`):
    python3 bench/e2b_sdks.py [--creates 100] [--runs 300] [--files 20] [--requests 300]

Starts its own `paddock serve` (own state directory and cgroup parent, `[e2b] domain =
"paddock.test"`, a warm pool of `--creates`+10 default sandboxes) and measures, all on 127.0.0.1:
  1. create -> output: `Sandbox.create()` then `commands.run("echo hi")` until it returns, `--creates`
     times, with the Python SDK (newest pinned) and the JavaScript SDK; beside them the same through
     /v1 (POST /v1/sandboxes, POST .../exec `echo hi`, Python http.client on one keep-alive
     connection). p50 and p99; the ratio SDK / v1 is the SDK's and the E2B door's overhead.
  2. `commands.run("true")` on a live sandbox, `--runs` times, each SDK; /v1 exec `true` beside them.
  3. 1 MiB file write + read back through the SDK (`files.write`, `files.read` as bytes), `--files`
     times; /v1 PUT + GET .../files beside it. Throughput in MiB/s of the pair (2 MiB moved).
  4. A port inside the sandbox: a small HTTP/1.1 server on port 8000 in the sandbox; `--requests` GETs
     through the E2B door's host form (`8000-<id>.paddock.test`, keep-alive to paddock) from the host,
     against the same client run inside the sandbox's network namespace (a sandbox process) to
     127.0.0.1:8000, once with a fresh connection per request (what the proxy does upstream) and once
     keep-alive. Added latency = proxied p50 - direct p50.
The SDK drivers are bench/e2b_driver.py and bench/e2b_driver.mjs (they print JSON). Everything created is
removed at the end (sandboxes, server, pool, cgroups).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from api import ROOT, Server, summary  # noqa: E402  (the same server harness and statistics)

DOMAIN = "paddock.test"
CLIENTS = os.path.join(ROOT, "crates/paddock/tests/e2b_clients")
VENV_PYTHON = os.path.join(ROOT, "target/e2b-clients/python-newest/bin/python")
MIB = 1 << 20


class E2bServer(Server):
    """`api.Server` with the E2B front-end under DOMAIN."""

    def write_config(self, f):
        super().write_config(f)
        f.write('[e2b]\ndomain = "%s"\n' % DOMAIN)

    def e2b_key(self):
        # A key's E2B spelling: pdk_<id>_<secret> -> e2b_<id><secret>.
        _, kid, secret = self.key.split("_", 2)
        return "e2b_%s%s" % (kid, secret)


def v1_create_run(server, n):
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        sb = server.json("POST", "/v1/sandboxes", {"timeout_secs": 600})
        out = server.json("POST", "/v1/sandboxes/%s/exec" % sb["id"], {"argv": ["echo", "hi"]})
        samples.append((time.perf_counter() - t) * 1000)
        assert out["exit"]["exit_code"] == 0, out
        server.json("DELETE", "/v1/sandboxes/" + sb["id"], ok=(204,))
    return samples


def v1_run_true(server, sandbox, n):
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        out = server.json("POST", "/v1/sandboxes/%s/exec" % sandbox, {"argv": ["true"]})
        samples.append((time.perf_counter() - t) * 1000)
        assert out["exit"]["exit_code"] == 0, out
    return samples


def v1_files(server, sandbox, n):
    data = os.urandom(MIB)
    samples = []
    for i in range(n):
        path = "/tmp/bench-%d.bin" % i
        t = time.perf_counter()
        r = server.request_raw("PUT", "/v1/sandboxes/%s/files?path=%s" % (sandbox, path), data)
        body = r.read()
        if r.status not in (200, 201, 204):
            raise RuntimeError("PUT files -> %d %s" % (r.status, body[:200]))
        r = server.request_raw("GET", "/v1/sandboxes/%s/files?path=%s" % (sandbox, path), None)
        back = r.read()
        samples.append((time.perf_counter() - t) * 1000)
        assert r.status == 200 and back == data, (r.status, len(back))
    return samples


def throughput(samples):
    """MiB/s of a write + read pair (2 MiB) at the median."""
    return round(2 * 1000 / statistics.median(samples), 1)


def run_driver(argv, server, args, what):
    env = dict(os.environ,
               E2B_API_URL="http://%s:%d" % server.addr,
               E2B_SANDBOX_URL="http://%s:%d" % server.addr,
               E2B_DOMAIN=DOMAIN,
               E2B_API_KEY=server.e2b_key(),
               BENCH_CREATES=str(args.creates),
               BENCH_RUNS=str(args.runs),
               BENCH_FILES=str(args.files),
               BENCH_REQUESTS=str(args.requests),
               BENCH_WHAT=what)
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (argv[-1], p.returncode, p.stderr[-2000:]))
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=100)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/e2b_sdks.py needs root")
    for need in (VENV_PYTHON, os.path.join(CLIENTS, "js/node_modules/e2b")):
        if not os.path.exists(need):
            sys.exit("%s is missing: run scripts/install-e2b-clients.sh" % need)
    here = os.path.dirname(os.path.abspath(__file__))
    python = [VENV_PYTHON, os.path.join(here, "e2b_driver.py")]
    js = ["node", os.path.join(here, "e2b_driver.mjs")]
    pool = args.creates + 10
    server = E2bServer(warm_pool=pool)
    results = {}
    try:
        server.wait_pool(pool)
        # Warm-up: page cache, the SDKs' imports, the connection.
        live = server.json("POST", "/v1/sandboxes", {"timeout_secs": 3600})["id"]
        v1_run_true(server, live, 20)
        run_driver(python, server, argparse.Namespace(creates=2, runs=20, files=1, requests=20), "warmup")
        server.wait_pool(pool)

        create = {}
        create["python_sdk"] = summary(run_driver(python, server, args, "create")["create_run"])
        server.wait_pool(pool)
        create["js_sdk"] = summary(run_driver(js, server, args, "create")["create_run"])
        server.wait_pool(pool)
        create["v1"] = summary(v1_create_run(server, args.creates))
        server.wait_pool(pool)
        results["create_to_run_echo"] = create

        live_py = run_driver(python, server, args, "live")
        live_js = run_driver(js, server, args, "live")
        results["run_true_round_trip"] = {
            "python_sdk": summary(live_py["run_true"]),
            "js_sdk": summary(live_js["run_true"]),
            "v1": summary(v1_run_true(server, live, args.runs)),
        }
        v1f = v1_files(server, live, args.files)
        results["file_1mib_write_read"] = {
            "python_sdk": dict(summary(live_py["files"]), mib_per_s=throughput(live_py["files"])),
            "js_sdk": dict(summary(live_js["files"]), mib_per_s=throughput(live_js["files"])),
            "v1": dict(summary(v1f), mib_per_s=throughput(v1f)),
        }
        ports = run_driver(python, server, args, "ports")
        proxied = summary(ports["proxied"])
        fresh = summary(ports["direct_fresh"])
        kept = summary(ports["direct_keepalive"])
        results["port_http_get"] = {
            "proxied": proxied,
            "direct_fresh_connection": fresh,
            "direct_keepalive": kept,
            "added_p50_ms_vs_fresh": round(proxied["p50_ms"] - fresh["p50_ms"], 3),
            "added_p50_ms_vs_keepalive": round(proxied["p50_ms"] - kept["p50_ms"], 3),
        }
        for k in ("create_to_run_echo", "run_true_round_trip", "file_1mib_write_read"):
            r = results[k]
            for sdk in ("python_sdk", "js_sdk"):
                r["ratio_%s_over_v1_p50" % sdk] = round(r[sdk]["p50_ms"] / r["v1"]["p50_ms"], 3)
    finally:
        server.stop()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

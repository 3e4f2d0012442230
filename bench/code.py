#!/usr/bin/env python3
"""Code contexts through the HTTP API (issue 15's figures), with a fresh `python3 -c` as the peer.

Usage (as root, after `cargo build --release -p paddock && cargo build --release -p paddock-agent` and
`scripts/install-deps.sh`, which installs python3-ipykernel):
    python3 bench/code.py [--burst 30] [--cells 300] [--idle 10]

Starts its own `paddock serve` (api.py's server) with a template `notebook` (the host's root) whose
warm pool of `--burst`+5 sandboxes starts a Python kernel ahead (`kernels = ["python"]`), and a warm
pool of the same size for `default`. Over one keep-alive HTTP/1.1 connection on 127.0.0.1:
  1. create (warm) -> first `run_code("1+1")` result: POST /v1/sandboxes then POST .../code
     (Accept: application/json, checked: the main result is `2`), timed from the create request to
     the answer; `--burst` times, p50 and p99. Peer, interleaved: create (warm `default`) -> exec
     `python3 -c "print(1+1)"` (NDJSON), timed to its first stdout line: a fresh Python in a fresh
     sandbox, what a cell costs without a kernel.
  2. `run_code("x += 1")` round trip on a live context, `--cells` times, p50 and p99 (checked: the
     last value is the count), for Python and for JavaScript (Deno). Peer, in the same run: the same
     cell sent by Jupyter's own Python client (`jupyter_client`, Debian's python3-jupyter-client)
     straight to the same ipykernel on the host, no sandbox and no HTTP: the kernel's floor.
  3. host memory per idle sandbox with a started Python kernel: `--idle` sandboxes of `notebook`
     claimed from a pool of that size (kernels started), after they are all up: the drop in
     MemAvailable divided by the count, and the median of their memory cgroups' usage.
Everything it creates is removed at the end.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import api  # noqa: E402
from startup import mem_available_kib  # noqa: E402


class CodeServer(api.Server):
    def __init__(self, warm_pool, notebook_pool):
        self.notebook_pool = notebook_pool
        super().__init__(warm_pool=warm_pool)

    def write_config(self, f):
        super().write_config(f)
        f.write('[templates.notebook]\nrootfs = "host"\nwarm_pool = %d\nkernels = ["python"]\n' % self.notebook_pool)

    def wait_template_pool(self, template, n, timeout=600):
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = self.request("GET", "/metrics", accept="text/plain").read().decode()
            for line in text.splitlines():
                if line.startswith('paddock_warm_pool_size{template="%s"}' % template) and int(float(line.split()[-1])) >= n:
                    return
            time.sleep(0.2)
        raise RuntimeError("the %s warm pool did not fill to %d" % (template, n))

    def cell(self, sid, code, language=None):
        body = {"code": code}
        if language:
            body["language"] = language
        r = self.request("POST", "/v1/sandboxes/%s/code" % sid, body, accept="application/json")
        doc = json.loads(r.read())
        if r.status != 200 or doc.get("status") != "ok":
            raise RuntimeError("cell %r -> %d %s" % (code, r.status, doc))
        return doc


def main_text(doc):
    for r in doc["results"]:
        if r.get("is_main_result"):
            return r.get("text")
    return None


def first_cell(server):
    t = time.perf_counter()
    sb = server.json("POST", "/v1/sandboxes", {"template": "notebook", "timeout_secs": 600})
    doc = server.cell(sb["id"], "1+1")
    ms = (time.perf_counter() - t) * 1000
    if main_text(doc) != "2":
        raise RuntimeError("1+1 gave %r" % doc)
    return ms, sb["id"]


def fresh_python(server):
    return api.create_then_first_stdout(server, {}, ["python3", "-c", "print(1+1)"], "2\n")


# Jupyter's own client against ipykernel on the host: the kernel's round trip without paddock.
DIRECT = r"""
import json, subprocess, sys, time, statistics
import jupyter_client
from jupyter_client.connect import write_connection_file
fn, _ = write_connection_file(ip="127.0.0.1")
p = subprocess.Popen([sys.executable, "-m", "ipykernel_launcher", "-f", fn, "--HistoryManager.enabled=False"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
kc = jupyter_client.BlockingKernelClient(connection_file=fn)
kc.load_connection_file(); kc.start_channels(); kc.wait_for_ready(timeout=60)
kc.execute_interactive("x = 0", timeout=10)
ts = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    kc.execute_interactive("x += 1", timeout=10, output_hook=lambda m: None)
    ts.append((time.perf_counter() - t) * 1000)
p.kill(); kc.stop_channels()
print(json.dumps(ts))
"""


def direct_ipykernel(cells):
    import subprocess
    out = subprocess.run(["/usr/bin/python3", "-c", DIRECT, str(cells)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def round_trips(server, sid, cells, language):
    server.cell(sid, "x = 0" if language == "python" else "var x = 0", language)
    rtt = []
    for _ in range(cells):
        t = time.perf_counter()
        server.cell(sid, "x += 1", language)
        rtt.append((time.perf_counter() - t) * 1000)
    last = main_text(server.cell(sid, "x", language))
    if last != str(cells):
        raise RuntimeError("%s: x is %r after %d cells" % (language, last, cells))
    return api.summary(rtt)


def cgroup_usage_kib(server, sid):
    for ctl in ("memory",):
        path = os.path.join("/sys/fs/cgroup", ctl, server.cgroup, sid, "memory.usage_in_bytes")
        if os.path.exists(path):
            with open(path) as f:
                return int(f.read()) // 1024
    path = os.path.join("/sys/fs/cgroup/unified", server.cgroup, sid, "memory.current")
    if os.path.exists(path):
        with open(path) as f:
            return int(f.read()) // 1024
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--burst", type=int, default=30)
    ap.add_argument("--cells", type=int, default=300)
    ap.add_argument("--idle", type=int, default=10)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/code.py needs root")
    results = {"load_avg_start": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count()}
    pool = args.burst + 5
    server = CodeServer(warm_pool=pool, notebook_pool=pool)
    try:
        server.wait_template_pool("notebook", pool)
        server.wait_pool(pool)
        # Warm-up, untimed: one of each.
        ids = [first_cell(server)[1], fresh_python(server)[1]]
        server.wait_template_pool("notebook", pool)
        server.wait_pool(pool)
        kernel, fresh = [], []
        for i in range(args.burst):
            for which in (("kernel", "fresh") if i % 2 == 0 else ("fresh", "kernel")):
                if which == "kernel":
                    ms, sid = first_cell(server)
                    kernel.append(ms)
                else:
                    ms, sid = fresh_python(server)
                    fresh.append(ms)
                ids.append(sid)
        claims = [r for r in server.json("GET", "/v1/audit?action=sandbox.create&limit=1000")["records"]
                  if r["detail"].get("source") == "pool"]
        if len(claims) != len(ids):
            raise RuntimeError("%d of %d creates were claims from the pools" % (len(claims), len(ids)))
        results["create_to_first_cell"] = {
            "paddock_run_code": api.summary(kernel),
            "fresh_python3_c": api.summary(fresh),
            "ratio_run_code_over_fresh_python_p50": round(statistics.median(kernel) / statistics.median(fresh), 3),
            "e2b_published_sandbox_start_ms": 150,
        }
        # Round trips on a live context, and the kernel's own floor beside them.
        sid = ids[0]
        results["run_code_round_trip"] = {
            "python": round_trips(server, sid, args.cells, "python"),
            "javascript": round_trips(server, sid, args.cells, "javascript"),
            "ipykernel_direct_jupyter_client": api.summary(direct_ipykernel(args.cells)),
        }
        for i in ids:
            server.json("DELETE", "/v1/sandboxes/" + i, ok=(204,))
    finally:
        server.stop()
    # Memory: a server whose notebook pool is exactly --idle; measured once they are all claimed.
    server = CodeServer(warm_pool=0, notebook_pool=0)
    try:
        time.sleep(1)
        before = mem_available_kib()
        ids = []
        for _ in range(args.idle):
            sb = server.json("POST", "/v1/sandboxes", {"template": "notebook", "timeout_secs": 600})
            server.cell(sb["id"], "1")
            ids.append(sb["id"])
        time.sleep(2)
        after = mem_available_kib()
        usage = [u for u in (cgroup_usage_kib(server, i) for i in ids) if u is not None]
        results["idle_with_python_kernel"] = {
            "sandboxes": args.idle,
            "host_kib_per_sandbox": (before - after) // args.idle,
            "cgroup_usage_kib_median": statistics.median(usage) if usage else None,
        }
        for i in ids:
            server.json("DELETE", "/v1/sandboxes/" + i, ok=(204,))
    finally:
        server.stop()
    results["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The control plane through its HTTP API, with bubblewrap as the peer, in one run.

Usage (as root, after `cargo build --release -p paddock && cargo build --release -p paddock-agent`):
    python3 bench/api.py [--burst 100] [--execs 500] [--idle 1000]

Starts its own `paddock serve` (own state directory and cgroup parent, a warm pool of `--burst`+10
sandboxes), then measures, over one keep-alive HTTP/1.1 connection on 127.0.0.1:
  1. create -> first exec output: POST /v1/sandboxes then POST .../exec `echo ready` (NDJSON), timed
     from the create request to the first stdout line; `--burst` times back to back, p50 and p99.
     Peer: `bwrap ... echo ready` (a fresh bubblewrap sandbox per command), same count.
  2. exec round trip of `true` on a live sandbox: POST .../exec (Accept: application/json), `--execs`
     times, p50 and p99. Peer: `bwrap ... true`.
  3. idle sandboxes: creates `--idle` sandboxes at once (no warm pool), reports host memory per sandbox
     (drop in MemAvailable) and the server's own RSS, then removes them.
Everything it creates is removed at the end (sandboxes, server, pool, cgroups).
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PADDOCK = os.environ.get("PADDOCK_BIN", os.path.join(ROOT, "target/x86_64-unknown-linux-gnu/release/paddock"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from startup import BWRAP, mem_available_kib  # noqa: E402  (same peer configuration as startup.py)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round((len(xs) - 1) * p)))]


def summary(xs):
    return {"p50_ms": round(statistics.median(xs), 3), "p99_ms": round(pct(xs, 0.99), 3), "n": len(xs)}


class Client:
    """One API key over one keep-alive connection."""

    def __init__(self, addr, key):
        self.addr, self.key = addr, key
        self.conn = http.client.HTTPConnection(*addr)

    def request(self, method, path, body=None, accept="application/json"):
        headers = {"Authorization": "Bearer " + self.key, "Accept": accept}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        return self.conn.getresponse()

    def json(self, method, path, body=None, ok=(200, 201, 202, 204)):
        r = self.request(method, path, body)
        data = r.read()
        if r.status not in ok:
            raise RuntimeError("%s %s -> %d %s" % (method, path, r.status, data[:300]))
        return json.loads(data) if data else None


class Server(Client):
    """`paddock serve` on its own state directory, as the admin key's client."""

    def __init__(self, warm_pool):
        self.state = tempfile.mkdtemp(prefix="paddock-bench-", dir="/var/tmp")
        os.rmdir(self.state)
        self.cgroup = "paddock-bench-%d" % os.getpid()
        config = os.path.join(tempfile.gettempdir(), "paddock-bench-%d.toml" % os.getpid())
        self.warm_pool = warm_pool
        with open(config, "w") as f:
            self.write_config(f)
        self.config = config
        env = dict(os.environ, PADDOCK_CGROUP_PARENT=self.cgroup, PADDOCK_LOG=os.environ.get("BENCH_LOG", "warn"))
        self.env = env
        self.proc = subprocess.Popen(
            [PADDOCK, "--state-dir", self.state, "serve", "--config", config],
            stderr=subprocess.PIPE, env=env, text=True)
        deadline = time.time() + 60
        self.addr = None
        while time.time() < deadline and self.addr is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("paddock serve exited before listening")
            m = re.search(r"listening on http://([0-9.]+):(\d+)", line)
            if m:
                self.addr = (m.group(1), int(m.group(2)))
        if self.addr is None:
            raise RuntimeError("paddock serve did not start listening")
        # Keep draining its stderr so it never blocks on a full pipe.
        import threading
        self.log = []
        threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stderr], daemon=True).start()
        with open(os.path.join(self.state, "admin.key")) as f:
            Client.__init__(self, self.addr, f.read().strip())

    def write_config(self, f):
        f.write('listen = "127.0.0.1:0"\ndefault_timeout = "1h"\n')
        f.write('[templates.default]\nrootfs = "host"\nwarm_pool = %d\n' % self.warm_pool)
        # The benchmark's one tenant (the admin) holds --burst or --idle sandboxes at once: more than
        # the default quota of 100.
        f.write('[quotas]\nmax_sandboxes = "unlimited"\n')

    def request_raw(self, method, path, data):
        """A request with a raw body (or none), answered as bytes."""
        headers = {"Authorization": "Bearer " + self.key}
        if data is not None:
            headers["Content-Type"] = "application/octet-stream"
        self.conn.request(method, path, body=data, headers=headers)
        return self.conn.getresponse()

    def wait_pool(self, n, timeout=300):
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.request("GET", "/metrics", accept="text/plain")
            text = r.read().decode()
            m = re.search(r'^paddock_warm_pool_size\{template="default"\} (\d+)', text, re.M)
            if m and int(m.group(1)) >= n:
                return
            time.sleep(0.2)
        raise RuntimeError("warm pool did not fill to %d" % n)

    def commit_stats(self):
        """The pool's btrfs transaction-commit counters (`commits`, `total_commit_ms`, ...), or {} when
        the kernel has none: a delta over a measurement says how many commits it caused."""
        try:
            out = subprocess.run(["btrfs", "filesystem", "show", "-m", os.path.join(self.state, "pool")],
                                 capture_output=True, text=True, check=True).stdout
            uuid = out.split("uuid: ")[1].split()[0]
            with open("/sys/fs/btrfs/%s/commit_stats" % uuid) as f:
                return {k: int(v) for k, v in (line.split() for line in f)}
        except (OSError, subprocess.CalledProcessError, IndexError, ValueError):
            return {}

    def rss_kib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        for sb in self.json("GET", "/v1/sandboxes?limit=1000")["sandboxes"]:
            self.json("DELETE", "/v1/sandboxes/" + sb["id"], ok=(204, 409))
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # Warm sandboxes outlive a graceful stop (a restart re-adopts them); reclaim everything.
        subprocess.run([PADDOCK, "--state-dir", self.state, "gc"], env=self.env, check=False,
                       stdout=subprocess.DEVNULL)
        subprocess.run([PADDOCK, "--state-dir", self.state, "pool", "destroy"], env=self.env, check=False,
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(self.state, ignore_errors=True)
        for ctl in os.listdir("/sys/fs/cgroup"):
            path = os.path.join("/sys/fs/cgroup", ctl, self.cgroup)
            if os.path.isdir(path):
                try:
                    os.rmdir(path)
                except OSError:
                    pass
        os.unlink(self.config)


def create_then_first_stdout(server, create_body, argv, expected):
    """Creates a sandbox and runs `argv` in it (NDJSON): the milliseconds from the create request to
    the first stdout event, and the sandbox's id. Checks that its whole stdout is `expected` and that
    it wrote nothing else."""
    t = time.perf_counter()
    sb = server.json("POST", "/v1/sandboxes", dict(create_body, timeout_secs=600))
    r = server.request("POST", "/v1/sandboxes/%s/exec" % sb["id"], {"argv": argv},
                       accept="application/x-ndjson")
    first = None
    out = ""
    while True:
        line = r.readline()
        if not line:
            break
        event = json.loads(line)
        if event["type"] == "stdout":
            if first is None:
                first = (time.perf_counter() - t) * 1000
            out += event.get("data") or ""
        elif event["type"] in ("stderr", "error"):
            raise RuntimeError("%s in %s: %s" % (argv, create_body or "a default sandbox", event))
    r.read()
    if first is None or out != expected:
        raise RuntimeError("%s in %s wrote %r" % (argv, create_body or "a default sandbox", out))
    return first, sb["id"]


def create_to_first_output(server, burst):
    samples = []
    ids = []
    for _ in range(burst):
        ms, sid = create_then_first_stdout(server, {}, ["echo", "ready"], "ready\n")
        samples.append(ms)
        ids.append(sid)
    return samples, ids


def exec_round_trips(server, sandbox, n):
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        result = server.json("POST", "/v1/sandboxes/%s/exec" % sandbox, {"argv": ["true"]})
        samples.append((time.perf_counter() - t) * 1000)
        assert result["exit"]["exit_code"] == 0, result
    return samples


def peer(argv, n):
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(BWRAP + argv, stdout=subprocess.DEVNULL, check=True)
        samples.append((time.perf_counter() - t) * 1000)
    return samples


def idle(n):
    server = Server(warm_pool=0)
    try:
        time.sleep(1)
        before = mem_available_kib()
        rss_before = server.rss_kib()
        t = time.perf_counter()
        for _ in range(n):
            server.json("POST", "/v1/sandboxes", {"timeout_secs": 3600})
        elapsed = time.perf_counter() - t
        time.sleep(2)
        after = mem_available_kib()
        listed = server.json("GET", "/v1/sandboxes?limit=1000")["sandboxes"]
        return {
            "sandboxes": n,
            "running_listed": len(listed),
            "create_all_s": round(elapsed, 1),
            "host_kib_per_sandbox": round((before - after) / n),
            "server_rss_kib_per_sandbox": round((server.rss_kib() - rss_before) / n, 1),
        }
    finally:
        server.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--burst", type=int, default=100)
    ap.add_argument("--execs", type=int, default=500)
    ap.add_argument("--idle", type=int, default=1000)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/api.py needs root")
    results = {}
    server = Server(warm_pool=args.burst + 10) if args.burst else None
    try:
        if server is None:
            raise StopIteration
        server.wait_pool(args.burst + 10)
        # Warm-up: one create and a few execs (page cache, connection).
        sb = server.json("POST", "/v1/sandboxes", {"timeout_secs": 3600})
        exec_round_trips(server, sb["id"], 20)
        server.wait_pool(args.burst + 10)
        samples, ids = create_to_first_output(server, args.burst)
        results["create_to_first_output"] = {
            "paddock": summary(samples),
            "bwrap_echo": summary(peer(["echo", "ready"], args.burst)),
        }
        # Let the pool refill first: its boots would otherwise compete with the exec measurement.
        server.wait_pool(args.burst + 10)
        results["exec_true_round_trip"] = {
            "paddock": summary(exec_round_trips(server, sb["id"], args.execs)),
            "bwrap_true": summary(peer(["true"], min(args.execs, 200))),
        }
        for k in results:
            r = results[k]
            peer_key = [x for x in r if x != "paddock"][0]
            r["ratio_paddock_over_peer_p50"] = round(r["paddock"]["p50_ms"] / r[peer_key]["p50_ms"], 3)
    except StopIteration:
        pass
    finally:
        if server is not None:
            server.stop()
    if args.idle:
        results["idle"] = idle(args.idle)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

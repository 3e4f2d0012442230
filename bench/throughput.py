#!/usr/bin/env python3
"""Create -> exec -> destroy throughput through the API, against bubblewrap, in one run (issue 18).

Usage (as root, after `cargo build --release -p paddock && cargo build --release -p paddock-agent`):
    python3 bench/throughput.py [--clients 100] [--rounds 5] [--warm-pool 0] [--busy]

paddock: `--clients` concurrent API clients (threads, one keep-alive connection each), each doing
`--rounds` times: `POST /v1/sandboxes` -> `POST .../exec {"argv": ["true"]}` (one JSON answer) ->
`DELETE /v1/sandboxes/{id}`. bwrap: `--clients` concurrent workers each running `--rounds` times
`bwrap ... true` (startup.py's sandbox, the closest a process wrapper comes to the same cycle).
Both report cycles per second over the whole run and each cycle's latency (p50, p99); paddock also
the pool's btrfs transaction commits during its phase and their total time. The target is at least
250 paddock cycles per second. `--busy` runs two busy loops (one per core here) during
both measurements.
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import api  # noqa: E402
from startup import BWRAP  # noqa: E402


def paddock_run(server, clients, rounds):
    latencies, errors = [], []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def client():
        conn = http.client.HTTPConnection(*server.addr, timeout=300)
        headers = {"Authorization": "Bearer " + server.key, "Content-Type": "application/json",
                   "Accept": "application/json"}

        def call(method, path, body=None):
            conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
            r = conn.getresponse()
            data = r.read()
            if r.status >= 300:
                raise RuntimeError("%s %s -> %d %s" % (method, path, r.status, data[:200]))
            return json.loads(data) if data else None

        start.wait()
        for _ in range(rounds):
            t = time.perf_counter()
            try:
                sid = call("POST", "/v1/sandboxes", {"timeout_secs": 600})["id"]
                result = call("POST", "/v1/sandboxes/%s/exec" % sid, {"argv": ["true"]})
                assert result["exit"]["exit_code"] == 0, result
                call("DELETE", "/v1/sandboxes/" + sid)
            except Exception as e:  # noqa: BLE001 - counted and shown, not hidden
                with lock:
                    errors.append(str(e)[:200])
                continue
            with lock:
                latencies.append((time.perf_counter() - t) * 1000)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return wall, latencies, errors


def bwrap_run(clients, rounds):
    latencies = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def worker():
        start.wait()
        for _ in range(rounds):
            t = time.perf_counter()
            subprocess.run(BWRAP + ["/usr/bin/true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
            with lock:
                latencies.append((time.perf_counter() - t) * 1000)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, latencies


def commit_delta(before, after, key):
    """`after[key] - before[key]` of two `Server.commit_stats()` readings, or None if either lacks it."""
    if key not in before or key not in after:
        return None
    return after[key] - before[key]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warm-pool", type=int, default=0)
    ap.add_argument("--busy", action="store_true", help="two busy loops during both measurements")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/throughput.py needs root")
    results = {"load_avg_start": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count(),
               "clients": args.clients, "rounds": args.rounds, "warm_pool": args.warm_pool, "busy": args.busy}
    busy = []
    server = api.Server(warm_pool=args.warm_pool)
    try:
        # Warm-up, untimed: the first sandboxes pay the pool's and page cache's first touches.
        paddock_run(server, 4, 2)
        bwrap_run(4, 2)
        if args.busy:
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        b_wall, b_lat = bwrap_run(args.clients, args.rounds)
        commits_before = server.commit_stats()
        p_wall, p_lat, errors = paddock_run(server, args.clients, args.rounds)
        commits_after = server.commit_stats()
        cycles = args.clients * args.rounds
        results["paddock_create_exec_destroy"] = {
            "per_second": round(len(p_lat) / p_wall, 1), "wall_s": round(p_wall, 3),
            "cycle": api.summary(p_lat) if p_lat else None, "errors": len(errors), "first_errors": errors[:3],
            # The pool's transaction commits during the phase, and how long one was running in all
            # (null where the kernel has no counters, rather than a zero that reads as a measurement).
            "btrfs_commits": commit_delta(commits_before, commits_after, "commits"),
            "btrfs_commit_ms": commit_delta(commits_before, commits_after, "total_commit_ms"),
        }
        results["bwrap_true"] = {
            "per_second": round(cycles / b_wall, 1), "wall_s": round(b_wall, 3), "cycle": api.summary(b_lat),
        }
        results["target_paddock_per_second"] = 250
    finally:
        for p in busy:
            p.kill()
            p.wait()
        server.stop()
    results["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

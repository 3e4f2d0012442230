#!/usr/bin/env python3
"""Destroy latency through the API: a networked sandbox against a plain one, in one run (issue 18).

Usage (as root, after `cargo build --release -p paddock && cargo build --release -p paddock-agent`):
    python3 bench/teardown.py [--rounds 40] [--busy]

Each round creates a plain sandbox and a networked one (`{"network": {"allow": [{"domain":
"bench.test"}]}}`: a link, a firewall table, an egress proxy listener; nothing is ever sent), runs
`true` in each (so both are fully up), then times `DELETE /v1/sandboxes/{id}` of each, alternating
which goes first. Reports medians and p90 (ms) and the networked sandbox's addition over the plain
one: the target is at most +3 ms on the caller's path. `--busy` runs two busy loops meanwhile.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import api  # noqa: E402  (the server harness)


def timed_delete(server, sid):
    t = time.perf_counter()
    server.json("DELETE", "/v1/sandboxes/" + sid)
    return (time.perf_counter() - t) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--busy", action="store_true", help="two busy loops during the measurement")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root")
    server = api.Server(0)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)] if args.busy else []
    try:
        times = {"plain": [], "networked": []}
        bodies = {"plain": {}, "networked": {"network": {"allow": [{"domain": "bench.test"}]}}}
        for i in range(args.rounds):
            ids = {}
            for kind, body in bodies.items():
                sid = server.json("POST", "/v1/sandboxes", body)["id"]
                server.json("POST", "/v1/sandboxes/%s/exec" % sid, {"argv": ["true"]})
                ids[kind] = sid
            order = ["plain", "networked"] if i % 2 == 0 else ["networked", "plain"]
            for kind in order:
                times[kind].append(timed_delete(server, ids[kind]))
        med = {k: statistics.median(v) for k, v in times.items()}
        p90 = {k: sorted(v)[int(len(v) * 0.9)] for k, v in times.items()}
        print(json.dumps({
            "rounds": args.rounds,
            "busy": args.busy,
            "delete_p50_ms": med,
            "delete_p90_ms": p90,
            "networked_added_p50_ms": med["networked"] - med["plain"],
        }, indent=2))
    finally:
        for p in loops:
            p.kill()
        server.stop()


if __name__ == "__main__":
    main()

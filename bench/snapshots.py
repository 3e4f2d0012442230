#!/usr/bin/env python3
"""Checkpoint, rollback and fork latency through the API, with a plain `btrfs subvolume snapshot`
of the same volume as the peer, in one run.

Usage (as root, after `cargo build --release -p paddock && cargo build --release -p paddock-agent`):
    python3 bench/snapshots.py [--runs 20] [--forks 7] [--busy]

For a sandbox holding 10 MB and one holding 1 GB, each in 10,000 files:
  checkpoint: POST .../checkpoint, an agent step (`--step-ms` of think time), POST .../commit (only
              the checkpoint is timed), `--runs` times;
  rollback:   POST .../checkpoint, write one file, the rest of the step, POST .../rollback (timed: the
              rollback only). A checkpoint prepares its rollback in the background (a copy of the
              sandbox booted on it, a few milliseconds of work): a step shorter than that makes the
              rollback wait for it; `--step-ms 0` measures that worst case;
  fork:       POST .../fork {"count": 10}, timed whole, then the copies are removed (`--forks`
              times, 7 by default);
  peer:       `btrfs subvolume snapshot -r` of the sandbox's volume (CLI start included).
Reports medians (ms).
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


def timed(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def fill(server, sid, files, size_bytes):
    script = (
        "mkdir -p /home/user/data && cd /home/user/data && "
        f"head -c {size_bytes} /dev/urandom > blob && "
        f"for i in $(seq 1 {files}); do echo $i > f$i; done"
    )
    r = server.json("POST", f"/v1/sandboxes/{sid}/exec", {"shell": script, "timeout_ms": 600000})
    assert r["exit"]["exit_code"] == 0, r


def measure(server, sid, runs, step_s, fork_runs):
    cp, rb = [], []
    for _ in range(runs):
        cp.append(timed(lambda: server.json("POST", f"/v1/sandboxes/{sid}/checkpoint")))
        time.sleep(step_s)
        server.json("POST", f"/v1/sandboxes/{sid}/commit")
        time.sleep(step_s)
    for i in range(runs):
        server.json("POST", f"/v1/sandboxes/{sid}/checkpoint")
        server.json("POST", f"/v1/sandboxes/{sid}/exec", {"shell": f"echo {i} > /home/user/step"})
        time.sleep(step_s)
        rb.append(timed(lambda: server.json("POST", f"/v1/sandboxes/{sid}/rollback", {})))
    forks = []
    for _ in range(fork_runs):
        result = {}
        forks.append(timed(lambda: result.update(server.json("POST", f"/v1/sandboxes/{sid}/fork", {"count": 10}))))
        for copy in result["sandboxes"]:
            server.json("DELETE", f"/v1/sandboxes/{copy['id']}")
    # The sandbox's volume: `sandboxes/<id>/volume`, or `sandboxes/<id>` itself for an older paddock.
    volume = os.path.join(server.state, "pool", "sandboxes", sid)
    if os.path.isdir(os.path.join(volume, "volume")) and os.stat(volume).st_ino != 256:
        volume = os.path.join(volume, "volume")
    peer = []
    for i in range(runs):
        target = os.path.join(server.state, "pool", "snapshots", f"peer-{i}")
        peer.append(timed(lambda: subprocess.run(["btrfs", "subvolume", "snapshot", "-r", volume, target],
                                                 stdout=subprocess.DEVNULL, check=True)))
        subprocess.run(["btrfs", "subvolume", "delete", target], stdout=subprocess.DEVNULL, check=True)
    med = lambda xs: round(statistics.median(xs), 2)
    return {"checkpoint_p50_ms": med(cp), "rollback_p50_ms": med(rb), "fork_10_p50_ms": med(forks),
            "peer_btrfs_snapshot_cli_p50_ms": med(peer)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--step-ms", type=float, default=100.0,
                    help="think time of an agent step between checkpoint and commit/rollback")
    ap.add_argument("--forks", type=int, default=7, help="forks of 10 timed per sandbox")
    ap.add_argument("--busy", action="store_true",
                    help="two busy loops (one per core here) during the measurements (not while filling)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/snapshots.py needs root")
    server = api.Server(warm_pool=0)
    results = {}
    try:
        for label, files, size in (("10MB_10k_files", 10000, 10 << 20), ("1GB_10k_files", 10000, 1 << 30)):
            sb = server.json("POST", "/v1/sandboxes", {"timeout_secs": 3600, "limits": {"disk": "4G"}})
            fill(server, sb["id"], files, size)
            subprocess.run(["sync"], check=True)
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if args.busy else 0)]
            try:
                results[label] = measure(server, sb["id"], args.runs, args.step_ms / 1000, args.forks)
            finally:
                for p in busy:
                    p.kill()
                    p.wait()
    finally:
        server.stop()
        if os.environ.get("BENCH_LOG_FILE"):
            with open(os.environ["BENCH_LOG_FILE"], "w") as f:
                f.writelines(server.log)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

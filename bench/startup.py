#!/usr/bin/env python3
"""Startup latency and idle memory of `paddock run` against bubblewrap, side by side in one run.

Usage (as root, after `cargo build --release -p paddock && cargo build --release -p paddock-agent`):
    python3 bench/startup.py [--runs 200] [--idle 50] [--baseline OTHER_BUILD/paddock] [--busy] [--keep-ready]

Latency: whole-process wall time of `CMD -- true` and `CMD -- python3 -c pass`, runs interleaved
(bare, bwrap, paddock, bare, ...), reported as medians, p90 and the paddock/bwrap ratio. With `--baseline`, another paddock build (an
older commit's) runs in the same rounds, on its own state dir, swapping places with this one every
round, and the paddock/baseline ratio is reported: a regression check within one run. With
`--keep-ready`, `paddock run --keep-ready` runs in the same rounds too (each run takes the sandbox the
previous one's maker made; the next timed run waits, untimed, until that maker is done), and then back
to back, where a run may start while the previous one's maker is still at work.
Memory: starts N idle sandboxes (`sleep`) of each kind and reports the host memory they add per sandbox
(drop in MemAvailable, which includes kernel objects but moves with the page cache and the host's
free-page reporting), the memory they pin (anonymous and shared pages, page tables, kernel stacks,
unreclaimable kernel objects), and the PSS of the processes each one keeps.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PADDOCK = os.path.join(ROOT, "target/x86_64-unknown-linux-gnu/release/paddock")
BWRAP = [
    "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
    "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
    # The same curated /etc paddock gives its sandboxes, so both run the same configuration.
    *[arg for name in ("ssl", "ca-certificates", "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
                       "localtime", "nsswitch.conf", "passwd", "group", "python3", "python3.11", "terminfo")
      for arg in ("--ro-bind-try", f"/etc/{name}", f"/etc/{name}")],
    "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/home/user", "--chdir", "/home/user",
    "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/home/user",
    "--uid", "1000", "--gid", "1000", "--cap-drop", "ALL", "--",
]


ENV = dict(os.environ)


# Environments of kinds that need their own (a baseline paddock gets its own state dir and cgroup).
KIND_ENV = {}


def timed(argv, env=None):
    t = time.perf_counter()
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True, env=env or ENV)
    return (time.perf_counter() - t) * 1000


def wait_for_makers():
    """Until no `paddock make-ready` is at work (its lock is free): a `--keep-ready` run's maker
    (making the next sandbox, tearing down the run's) then does not run beside the next timed run."""
    import fcntl
    path = os.path.join(KIND_ENV["paddock_ready"]["PADDOCK_STATE_DIR"], "ready.lock")
    if not os.path.exists(path):
        return
    with open(path) as f:
        fcntl.flock(f, fcntl.LOCK_SH)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def latency(runs, paddock, baseline=None, ready=None):
    results = {}
    # Absolute paths, so every kind runs the same Debian binaries (not a pyenv shim on the host).
    for workload in (["/usr/bin/true"], ["/usr/bin/python3", "-c", "pass"]):
        kinds = {"bare": workload, "bwrap": BWRAP + workload, "paddock": paddock + workload}
        if baseline:
            kinds["baseline"] = baseline + workload
        if ready:
            kinds["paddock_ready"] = ready + workload
        samples = {k: [] for k in kinds}
        for k, argv in kinds.items():  # warm-up (page cache, pool, template)
            for _ in range(5):
                timed(argv, KIND_ENV.get(k))
        for i in range(runs):
            # With a baseline, paddock and the baseline swap places every run, so neither always
            # follows the other's teardown.
            order = list(kinds.items())
            if baseline and i % 2:
                order = [(k, a) for k, a in order if k != "paddock"] + [("paddock", kinds["paddock"])]
            for k, argv in order:
                samples[k].append(timed(argv, KIND_ENV.get(k)))
                if k == "paddock_ready":
                    wait_for_makers()
        name = " ".join(workload).replace("/usr/bin/", "")
        results[name] = {k: {"p50_ms": statistics.median(v), "p90_ms": pct(v, 0.9)} for k, v in samples.items()}
        results[name]["ratio_paddock_over_bwrap"] = (
            results[name]["paddock"]["p50_ms"] / results[name]["bwrap"]["p50_ms"])
        if baseline:
            results[name]["ratio_paddock_over_baseline"] = (
                results[name]["paddock"]["p50_ms"] / results[name]["baseline"]["p50_ms"])
        if ready:
            results[name]["ratio_ready_over_bwrap"] = (
                results[name]["paddock_ready"]["p50_ms"] / results[name]["bwrap"]["p50_ms"])
            # Back to back, with nothing in between: the next run may start before the sandbox made
            # for it is ready (it then makes its own, as without --keep-ready).
            back = [timed(ready + workload, KIND_ENV["paddock_ready"]) for _ in range(max(20, runs // 4))]
            results[name]["paddock_ready_back_to_back"] = {
                "p50_ms": statistics.median(back), "p90_ms": pct(back, 0.9)}
    return results


def mem_available_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable")


# Memory a sandbox pins, user and kernel side, and no cache: its processes' anonymous and shared memory,
# their page tables and kernel stacks, and the kernel objects that cannot be reclaimed (namespaces,
# cgroups, sockets, mounts). MemAvailable also moves with the page cache and with the host's free-page
# reporting (it has risen while sandboxes started here), so both are reported.
PINNED = ("AnonPages", "Shmem", "PageTables", "KernelStack", "SUnreclaim", "Percpu")


def pinned_kib():
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            fields[key] = int(value.split()[0])
    return sum(fields.get(k, 0) for k in PINNED)


def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def descendants(pid):
    out, frontier = [], [pid]
    children = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(p))
        except OSError:
            pass
    while frontier:
        p = frontier.pop()
        out.append(p)
        frontier.extend(children.get(p, []))
    return out


def idle_memory(n, argv_prefix, ready_check):
    subprocess.run(["sync"])
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    time.sleep(1)
    before, pinned_before = mem_available_kib(), pinned_kib()
    procs = [subprocess.Popen(argv_prefix + ["sleep", "600"], stdin=subprocess.DEVNULL, env=ENV) for _ in range(n)]
    deadline = time.time() + 60
    while time.time() < deadline and not ready_check(procs):
        time.sleep(0.2)
    time.sleep(2)
    after, pinned_after = mem_available_kib(), pinned_kib()
    pss = statistics.median(sum(pss_kib(p) for p in descendants(proc.pid)) for proc in procs)
    # What each supervisor is by now: a long `paddock run` hands over to `paddock-wait`.
    exes = {}
    for proc in procs:
        try:
            exe = os.path.basename(os.readlink(f"/proc/{proc.pid}/exe"))
        except OSError:
            exe = "?"
        exes[exe] = exes.get(exe, 0) + 1
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()
    return {"sandboxes": n, "host_kib_per_sandbox": (before - after) / n,
            "pinned_kib_per_sandbox": (pinned_after - pinned_before) / n, "pss_kib_per_sandbox": pss,
            "supervisors": exes}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--idle", type=int, default=50)
    ap.add_argument("--baseline", metavar="PADDOCK_BINARY",
                    help="another paddock build (say, of an older commit) to time in the same runs; its "
                         "paddock-agent must sit next to it")
    ap.add_argument("--busy", action="store_true",
                    help="two busy loops (one per core here) during the latency runs")
    ap.add_argument("--keep-ready", action="store_true",
                    help="also time `paddock run --keep-ready` (a sandbox made ahead by the previous "
                         "such run) in the same rounds, and back to back")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root")
    state = tempfile.mkdtemp(prefix="paddock-bench-", dir="/var/tmp")
    # Set in the environment of every child (not through env(1), which would add an exec to paddock's
    # runs only).
    ENV.update(PADDOCK_STATE_DIR=state, PADDOCK_CGROUP_PARENT="paddock-bench")
    paddock = [PADDOCK, "run", "--"]
    baseline = [os.path.abspath(args.baseline), "run", "--"] if args.baseline else None
    if args.keep_ready:
        # A pool of its own: its makers take the spare volumes the plain runs make for each other.
        KIND_ENV["paddock_ready"] = dict(
            ENV, PADDOCK_STATE_DIR=tempfile.mkdtemp(prefix="paddock-bench-ready-", dir="/var/tmp"),
            PADDOCK_CGROUP_PARENT="paddock-bench-ready")
    if baseline:
        KIND_ENV["baseline"] = dict(
            ENV, PADDOCK_STATE_DIR=tempfile.mkdtemp(prefix="paddock-bench-baseline-", dir="/var/tmp"),
            PADDOCK_CGROUP_PARENT="paddock-bench-baseline")
    try:
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if args.busy else 0)]
        try:
            ready = [PADDOCK, "run", "--keep-ready", "--"] if args.keep_ready else None
            report = {"latency": latency(args.runs, paddock, baseline, ready), "busy": args.busy}
        finally:
            for p in busy:
                p.kill()
                p.wait()

        def all_have(n_min):
            return lambda procs: all(len(descendants(p.pid)) >= n_min for p in procs)

        report["idle_memory"] = {
            "bwrap": idle_memory(args.idle, BWRAP, all_have(2)),
            "paddock": idle_memory(args.idle, paddock, all_have(2)),
        }
        print(json.dumps(report, indent=2))
    finally:
        subprocess.run([PADDOCK, "pool", "destroy"], check=False, env=ENV, stdout=subprocess.DEVNULL)
        if args.keep_ready:
            ready_env = KIND_ENV["paddock_ready"]
            subprocess.run([PADDOCK, "pool", "destroy"], check=False, env=ready_env, stdout=subprocess.DEVNULL)
            subprocess.run(["rm", "-rf", ready_env["PADDOCK_STATE_DIR"]], check=False)
        if baseline:
            base_env = KIND_ENV["baseline"]
            subprocess.run([baseline[0], "pool", "destroy"], check=False, env=base_env, stdout=subprocess.DEVNULL)
            subprocess.run(["rm", "-rf", base_env["PADDOCK_STATE_DIR"]], check=False)
        # Every hierarchy paddock made its parent in (blkio included, where the host has it).
        for h in os.listdir("/sys/fs/cgroup"):
            for parent in ("paddock-bench", "paddock-bench-baseline", "paddock-bench-ready"):
                try:
                    os.rmdir(f"/sys/fs/cgroup/{h}/{parent}")
                except OSError:
                    pass
        subprocess.run(["rm", "-rf", state], check=False)


if __name__ == "__main__":
    main()

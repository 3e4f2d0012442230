#!/usr/bin/env python3
"""Another tenant's latency while one tenant attacks `paddock serve` at full speed (issue 11).

Usage (as root):
    python3 bench/under_attack.py [--rounds 3] [--sets 3 4 5 6 3,4,5,6]

Runs the end-to-end test `attacks::under_attack` (`crates/paddock/tests/e2e/attacks/under_attack.rs`)
on a release build (`cargo nextest run --cargo-profile release`), `--rounds` times. Each round starts its own `paddock serve`, measures the
other tenant alone for 5 s (the peer: the same server, quiet, in the same run), then for 30 s while the
attacker runs one set of issue 11's attacks (`UNDER_ATTACK_CLASSES`): by default each class alone, then
all four at once:
  - 3: from inside its networked sandbox, as many TCP connections as it can hold to its resolver (DNS
       over TCP) and its HTTP proxy, a question every 2 s on each, reopened as soon as one is closed;
  - 4: a thousand half-sent request heads from its own address (127.0.0.2), reopened at once;
  - 5: execs answered as one JSON document writing 17 MB of NULs to each stream, four at a time;
  - 6: two processes sending UDP DNS questions as fast as they can.
The other tenant alternately reads its sandbox and runs `true` in it (JSON), one request every 50 ms.
Its client runs on a thread and runtime of its own. Reports p50 and p99 of its requests (all, reads,
execs) quiet and under attack, per round and as the median over rounds, and the ratio. The test itself asserts only that every request was answered (tests never assert times).
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = re.compile(
    r"FIGURES (quiet|under attack)( \((?:reads|execs)\))?: (\d+) requests, p50 ([\d.]+) ms, "
    r"p99 ([\d.]+) ms, max ([\d.]+) ms"
)
PHASES = ["quiet", "under attack", "under attack (reads)", "under attack (execs)"]


def one_round(classes):
    cmd = [
        "cargo", "nextest", "run", "--cargo-profile", "release", "-p", "paddock", "--test", "e2e",
        "--retries", "0", "--no-capture", "attacks::under_attack::",
    ]
    env = dict(os.environ, UNDER_ATTACK_CLASSES=classes)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        sys.stderr.write(text)
        raise SystemExit(f"the under-attack test failed (classes {classes})")
    figures = {
        m.group(1) + (m.group(2) or ""): tuple(float(x) for x in m.group(3, 4, 5, 6))
        for m in FIGURES.finditer(text)
    }
    if not set(PHASES) <= set(figures):
        sys.stderr.write(text)
        raise SystemExit("no figures in the test's output")
    extra = [line for line in text.splitlines() if line.startswith("the attacker")]
    return figures, extra


def med(xs):
    return sorted(xs)[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sets", nargs="+", default=["3", "4", "5", "6", "3,4,5,6"],
                    help="attack sets to measure, each a comma-separated list of classes")
    args = ap.parse_args()
    # Two builds: the agent's dependencies keep their own features (see scripts/paddock.sh).
    for package in ("paddock", "paddock-agent"):
        subprocess.run(["cargo", "build", "--release", "-p", package], cwd=ROOT, check=True)
    table = []
    for classes in args.sets:
        rows = []
        for i in range(args.rounds):
            figures, extra = one_round(classes)
            rows.append(figures)
            q, a = figures["quiet"], figures["under attack"]
            print(f"classes {classes}, round {i + 1}: quiet p50 {q[1]:.1f} ms p99 {q[2]:.1f} ms "
                  f"({q[0]:.0f} requests); under attack p50 {a[1]:.1f} ms p99 {a[2]:.1f} ms "
                  f"max {a[3]:.1f} ms ({a[0]:.0f} requests)", flush=True)
            for line in extra:
                print("    " + line)
        table.append((classes, {p: (med([r[p][1] for r in rows]), med([r[p][2] for r in rows])) for p in PHASES}))
    print()
    print(f"median of {args.rounds} rounds per set")
    print()
    print("| attack classes | quiet p50 / p99 (peer) | under attack p50 / p99 | reads p99 | execs p99 | p99 ratio |")
    print("|---|---|---|---|---|---|")
    for classes, m in table:
        q, a = m["quiet"], m["under attack"]
        print(f"| {classes} | {q[0]:.1f} / {q[1]:.1f} ms | {a[0]:.1f} / {a[1]:.1f} ms | "
              f"{m['under attack (reads)'][1]:.1f} ms | {m['under attack (execs)'][1]:.1f} ms | {a[1] / q[1]:.1f} |")
    print()
    for classes, m in table:
        a99 = m["under attack"][1]
        print(f"target p99 under attack < 100 ms, classes {classes}: {'met' if a99 < 100 else 'not met'} ({a99:.1f} ms)")


if __name__ == "__main__":
    main()

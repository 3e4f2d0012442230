#!/usr/bin/env python3
"""Issue 17's figures, in one run against a release `paddock serve` (api.py's server):

1. The exec round trip of `true` with and without an approval policy: two sandboxes of one
   tenant, one with a 1,000-rule policy (every kind of rule, as bench/policy.sh's, none matching
   `true`, default allow) and one with none, `--calls` execs each over keep-alive connections,
   interleaved. The difference of the medians is what checking the policy adds (target: at most
   20 us at p50).
2. Approve -> first output of a held exec: a third sandbox's policy asks before `echo`; a thread
   starts `echo approved` (NDJSON stream) and waits; the approver sees it pending, takes the time,
   approves, and the thread takes the time of the first stdout event. `--approvals` rounds.
3. Approve -> result of an approved execution (`/v1/executions`, the sandbox executor: a fresh
   sandbox made, the command run, its logs recorded, the sandbox removed): the time from the
   approve call to the execution read back final. `--executions` rounds.

Usage (as root, after `cargo build --release -p paddock && cargo build --release -p paddock-agent`):
    python3 bench/approvals.py [--calls 500] [--approvals 30] [--executions 20]
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import api  # noqa: E402


def big_policy():
    """1,000 rules like bench/policy.sh's, none of which matches `true`; default allow."""
    rules = []
    for i in range(999):
        kind = i % 6
        if kind == 0:
            rules.append({"verdict": "ask", "exec": {"command": {"regex": "^tool%d (deploy|push)( |$)" % i}}})
        elif kind == 1:
            rules.append({"verdict": "deny", "exec": {"program": {"glob": "/opt/bin%d/*" % i}}})
        elif kind == 2:
            rules.append({"verdict": "ask", "exec": {"program": {"glob": "cli%d" % i},
                                                      "args": {"regex": "--env[= ]prod%d" % i}}})
        elif kind == 3:
            rules.append({"verdict": "ask", "exec": {"cwd": {"glob": "/srv/app%d/**" % i}, "user": "root"}})
        elif kind == 4:
            rules.append({"verdict": "deny", "file": {"ops": ["delete"], "path": {"glob": "/data/%d/**" % i}}})
        else:
            rules.append({"verdict": "ask", "network": {"host": {"glob": "*.host%d.example" % i}, "ports": [443]}})
    rules.append({"verdict": "allow", "exec": {"program": {"glob": "python3"}}})
    return {"default": "allow", "rules": rules}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--approvals", type=int, default=30)
    ap.add_argument("--executions", type=int, default=20)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/approvals.py needs root")
    results = {"load_avg_start": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count()}
    server = api.Server(warm_pool=0)
    try:
        admin = api.Client(server.addr, server.key)
        agent_key = admin.json("POST", "/v1/keys", {"tenant": "bench", "name": "agent"})["key"]
        person_key = admin.json("POST", "/v1/keys", {"tenant": "bench", "name": "person", "approver": True})["key"]
        admin.json("PUT", "/v1/tenants/bench/quota", {})
        agent = api.Client(server.addr, agent_key)
        person = api.Client(server.addr, person_key)
        plain = agent.json("POST", "/v1/sandboxes", {"timeout_secs": 3600})["id"]
        guarded = agent.json("POST", "/v1/sandboxes", {"timeout_secs": 3600})["id"]
        person.json("PUT", "/v1/sandboxes/%s/policy" % guarded, {"policy": big_policy()})

        # 1. exec round trip with and without the policy.
        def run(sid):
            r = agent.json("POST", "/v1/sandboxes/%s/exec" % sid, {"shell": "true"})
            assert r["exit"]["exit_code"] == 0, r

        for _ in range(20):  # warm-up, untimed (the first call compiles the policy)
            run(plain)
            run(guarded)
        samples = {"plain": [], "guarded": []}
        for i in range(args.calls):
            order = (("plain", plain), ("guarded", guarded)) if i % 2 == 0 else (("guarded", guarded), ("plain", plain))
            for name, sid in order:
                t = time.perf_counter()
                run(sid)
                samples[name].append((time.perf_counter() - t) * 1000)
        results["exec_true_round_trip"] = {
            "without_policy": api.summary(samples["plain"]),
            "with_1000_rule_policy": api.summary(samples["guarded"]),
            "policy_added_p50_us": round((statistics.median(samples["guarded"]) - statistics.median(samples["plain"])) * 1000, 1),
            "target_added_p50_us": 20,
        }

        # 2. approve -> first output of a held exec.
        held = agent.json("POST", "/v1/sandboxes", {"timeout_secs": 3600})["id"]
        person.json("PUT", "/v1/sandboxes/%s/policy" % held, {"policy": {
            "default": "allow", "rules": [{"verdict": "ask", "exec": {"program": {"glob": "echo"}}}]}})
        waits = []
        for _ in range(args.approvals):
            first = {}

            def requester():
                c = api.Client(server.addr, agent_key)
                r = c.request("POST", "/v1/sandboxes/%s/exec" % held,
                          {"argv": ["echo", "approved"], "approval_wait_ms": 60000}, accept="application/x-ndjson")
                assert r.status == 200, (r.status, r.read()[:300])
                while True:
                    line = r.readline()
                    if not line:
                        break
                    event = json.loads(line)
                    if event.get("type") == "stdout" and "t" not in first:
                        first["t"] = time.perf_counter()
                    if event.get("type") in ("exit", "error"):
                        break
                r.read()

            t = threading.Thread(target=requester)
            t.start()
            approval = None
            while approval is None:
                listed = person.json("GET", "/v1/approvals?state=pending&sandbox_id=%s" % held)["approvals"]
                approval = listed[0]["id"] if listed else None
                if approval is None:
                    time.sleep(0.002)
            t0 = time.perf_counter()
            person.json("POST", "/v1/approvals/%s/approve" % approval, {})
            t.join(60)
            assert "t" in first, "no output after the approval"
            waits.append((first["t"] - t0) * 1000)
        results["approve_to_first_output_held_exec"] = api.summary(waits)

        # 3. approve -> result of an approved execution (sandbox executor).
        ends = []
        for i in range(args.executions):
            ex = agent.json("POST", "/v1/executions", {"command": ["echo", "done %d" % i], "description": "bench"})
            t0 = time.perf_counter()
            person.json("POST", "/v1/approvals/%s/approve" % ex["approval_id"], {})
            while True:
                info = agent.json("GET", "/v1/executions/%s" % ex["id"])
                if info["state"] not in ("pending_approval", "running"):
                    break
                time.sleep(0.001)
            assert info["state"] == "succeeded" and "done" in info["logs"], info
            ends.append((time.perf_counter() - t0) * 1000)
        results["approve_to_result_execution_sandbox_executor"] = api.summary(ends)
    finally:
        server.stop()
    results["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

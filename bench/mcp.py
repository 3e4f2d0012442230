#!/usr/bin/env python3
"""MCP's `tools/call run_command` over Streamable HTTP, beside the same command through `/v1`, in
one run (issue 16's figure).

Usage (as root, after `cargo build --release -p paddock && cargo build --release -p paddock-agent`):
    python3 bench/mcp.py [--calls 300]

Starts its own `paddock serve` (api.py's server), creates one sandbox, then over one keep-alive
HTTP/1.1 connection each: `--calls` times `tools/call run_command {"command": "true"}` on `/mcp`
(an `initialize`-based session, as most clients open one; the answer's SSE event read to its end
and checked: exit code 0), and `--calls` times `POST /v1/sandboxes/{id}/exec {"shell": "true"}`
(JSON answer), interleaved. Prints p50 and p99 of each and the difference of the medians (target:
MCP adds at most 0.5 ms at p50).
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import api  # noqa: E402


class Mcp:
    """A minimal MCP client over one connection: a legacy session, tools/call answered as SSE."""

    def __init__(self, addr, key):
        self.conn = http.client.HTTPConnection(*addr)
        self.headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream"}
        self.next_id = 0
        init = self.call("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                        "clientInfo": {"name": "bench", "version": "1"}})
        assert "result" in init, init
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, message):
        self.conn.request("POST", "/mcp", body=json.dumps(message), headers=self.headers)
        r = self.conn.getresponse()
        body = r.read()
        if r.status not in (200, 202):
            raise RuntimeError("POST /mcp -> %d %s" % (r.status, body[:300]))
        session = r.getheader("mcp-session-id")
        if session:
            self.headers["Mcp-Session-Id"] = session
        return body

    def call(self, method, params):
        self.next_id += 1
        body = self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        for line in body.decode().splitlines():
            if line.startswith("data:") and line[5:].strip():
                message = json.loads(line[5:])
                if message.get("id") == self.next_id:
                    return message
        raise RuntimeError("no answer to %s in %r" % (method, body[:300]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/mcp.py needs root")
    results = {"load_avg_start": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count()}
    server = api.Server(warm_pool=1)
    try:
        sid = server.json("POST", "/v1/sandboxes", {"timeout_secs": 600})["id"]
        mcp = Mcp(server.addr, server.key)
        tool = {"name": "run_command", "arguments": {"sandbox_id": sid, "command": "true"}}

        def over_mcp():
            answer = mcp.call("tools/call", tool)
            assert answer["result"]["structuredContent"]["exit_code"] == 0, answer

        def over_v1():
            result = server.json("POST", "/v1/sandboxes/%s/exec" % sid, {"shell": "true"})
            assert result["exit"]["exit_code"] == 0, result

        for _ in range(10):  # warm-up, untimed
            over_mcp()
            over_v1()
        samples = {"mcp": [], "v1": []}
        for i in range(args.calls):
            for name, f in ((("mcp", over_mcp), ("v1", over_v1)) if i % 2 == 0 else (("v1", over_v1), ("mcp", over_mcp))):
                t = time.perf_counter()
                f()
                samples[name].append((time.perf_counter() - t) * 1000)
        results["run_command_true"] = {
            "mcp_tools_call": api.summary(samples["mcp"]),
            "v1_exec": api.summary(samples["v1"]),
            "mcp_added_p50_ms": round(statistics.median(samples["mcp"]) - statistics.median(samples["v1"]), 3),
            "target_added_p50_ms": 0.5,
        }
        server.json("DELETE", "/v1/sandboxes/" + sid, ok=(204,))
    finally:
        server.stop()
    results["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

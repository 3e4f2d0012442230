"""The official MCP Python SDK (`mcp` on PyPI, pinned in requirements-mcp.txt) driving paddock's MCP
server in both protocol generations (`initialize`-based 2025-11-25 and stateless 2026-07-28): list
tools, call each one (its structured result checked, by this script and by the SDK against the
tool's output schema), a non-zero exit as data, failures as `isError`, progress while a command
runs, tenancy, and the transport's own refusals.

Transports (the first argument):
- `http` (default): `paddock serve`'s `/mcp` at PADDOCK_MCP_URL, with PADDOCK_API_KEY and
  PADDOCK_OTHER_KEY (another tenant's key); also the endpoint's refusals (no key, a foreign Origin
  or Host).
- `stdio`: `$PADDOCK_BIN mcp` relaying to PADDOCK_URL with either key.
- `local`: `$PADDOCK_BIN mcp --local` (one user, no other tenant); also that a session's
  sandboxes are gone once its client disconnects.

Run by the e2e tests in `tests/e2e/mcp/`; exits non-zero on the first failed check.
"""

import asyncio
import json
import os
import sys

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

TRANSPORT = sys.argv[1] if len(sys.argv) > 1 else "http"
KEY = os.environ.get("PADDOCK_API_KEY", "")
OTHER = os.environ.get("PADDOCK_OTHER_KEY")
# The tools the agent's scenario calls (every other listed tool gets one call too).
USED = {"checkpoint", "file_edit", "file_list", "file_read", "file_write", "rollback", "run_command",
        "sandbox_create", "sandbox_kill", "sandbox_list"}


def client(key, mode):
    if TRANSPORT == "http":
        http = httpx2.AsyncClient(headers={"Authorization": "Bearer " + key}, timeout=60)
        return Client(streamable_http_client(os.environ["PADDOCK_MCP_URL"], http_client=http), mode=mode)
    env = dict(os.environ, PADDOCK_API_KEY=key)
    args = ["mcp", "--local"] if TRANSPORT == "local" else ["mcp"]
    return Client(StdioServerParameters(command=os.environ["PADDOCK_BIN"], args=args, env=env), mode=mode)


def ok(result):
    assert not result.is_error, result
    assert result.structured_content is not None, result
    assert json.loads(result.content[0].text) == result.structured_content, result
    return result.structured_content


def error_text(result):
    assert result.is_error, result
    return result.content[0].text


class Recording:
    """A client that notes the name of every tool called through it."""

    def __init__(self, inner):
        self.inner = inner
        self.called = set()

    async def call_tool(self, name, arguments=None, **kwargs):
        self.called.add(name)
        return await self.inner.call_tool(name, arguments, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def until(c, tool, args, done, what):
    """Calls `tool` until `done` holds of its result (paced; a minute's deadline as a safety net)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        result = ok(await c.call_tool(tool, args))
        if done(result):
            return result
        assert loop.time() < deadline, (what, result)
        await asyncio.sleep(0.05)


def ok_or_error(result, codes):
    """A result, or a failure with one of `codes` (what this server's setup may answer)."""
    if result.is_error:
        text = error_text(result)
        assert text.split(":")[0] in codes, text
        return None
    return ok(result)


async def every_other_tool(c, sid):
    """One call of each tool the scenario does not call, each checked (the SDK also checks every
    structured result against the tool's output schema)."""
    info = ok(await c.call_tool("sandbox_info", {"sandbox_id": sid}))
    assert info["state"] == "running" and info["sandbox_id"] == sid, info
    ok(await c.call_tool("sandbox_extend", {"sandbox_id": sid, "timeout_secs": 600}))
    # A background process: stdin written and closed, output read from offsets, exit seen.
    pid = ok(await c.call_tool("process_start", {"sandbox_id": sid, "command": "cat", "stdin_open": True}))["pid"]
    ok(await c.call_tool("process_write", {"sandbox_id": sid, "pid": pid, "data": "hello\n", "close": True}))
    read = {"sandbox_id": sid, "pid": pid, "stdout_from": 0, "stderr_from": 0}
    ended = await until(c, "process_read", read, lambda r: not r["running"], "cat's end")
    assert (ended["stdout"], ended["exit_code"]) == ("hello\n", 0), ended
    sleeper = ok(await c.call_tool("process_start", {"sandbox_id": sid, "command": "sleep 600"}))["pid"]
    assert sleeper in [p["pid"] for p in ok(await c.call_tool("process_list", {"sandbox_id": sid}))["processes"]]
    ok(await c.call_tool("process_signal", {"sandbox_id": sid, "pid": sleeper, "signal": "TERM"}))
    read = {"sandbox_id": sid, "pid": sleeper, "stdout_from": 0, "stderr_from": 0}
    killed = await until(c, "process_read", read, lambda r: not r["running"], "the sleeper's end")
    assert killed["exit_code"] == 143, killed
    # Paths.
    assert ok(await c.call_tool("file_stat", {"sandbox_id": sid, "path": "/home/user/proj/main.py"}))["kind"] == "file"
    ok(await c.call_tool("file_mkdir", {"sandbox_id": sid, "path": "/home/user/proj/sub"}))
    ok(await c.call_tool("file_move", {"sandbox_id": sid, "from": "/home/user/proj/main.py", "to": "/home/user/proj/sub/main.py"}))
    ok(await c.call_tool("file_remove", {"sandbox_id": sid, "path": "/home/user/proj/sub", "recursive": True}))
    # State: a named snapshot, a checkpoint committed, a fork (removed again).
    snap = ok(await c.call_tool("snapshot_create", {"sandbox_id": sid, "name": "s1"}))
    listed = ok(await c.call_tool("snapshot_list", {"sandbox_id": sid}))
    assert snap["snapshot_id"] in [s["snapshot_id"] for s in listed["snapshots"]], listed
    ok(await c.call_tool("checkpoint", {"sandbox_id": sid}))
    ok(await c.call_tool("commit", {"sandbox_id": sid}))
    ok(await c.call_tool("snapshot_delete", {"snapshot_id": snap["snapshot_id"]}))
    listed = ok(await c.call_tool("snapshot_list", {"sandbox_id": sid}))
    assert snap["snapshot_id"] not in [s["snapshot_id"] for s in listed["snapshots"]], listed
    forks = ok(await c.call_tool("sandbox_fork", {"sandbox_id": sid, "count": 1}))["sandboxes"]
    assert len(forks) == 1, forks
    ok(await c.call_tool("sandbox_kill", {"sandbox_id": forks[0]["sandbox_id"]}))
    # A code cell on the host's kernels.
    cell = ok(await c.call_tool("run_code", {"sandbox_id": sid, "code": "6 * 7"}))
    assert cell["results"][0]["text"] == "42", cell
    # This sandbox has no network: the network tools and URL transfers answer with a failure
    # (a URL on the sandbox's own loopback, so nothing could leave it anyway).
    ok_or_error(await c.call_tool("network_get", {"sandbox_id": sid}), {"invalid_request"})
    ok_or_error(await c.call_tool("network_set", {"sandbox_id": sid, "policy": {"allow": []}}),
                {"invalid_request", "unsupported"})
    url = ok_or_error(await c.call_tool("port_url", {"sandbox_id": sid, "port": 8000}), {"unsupported"})
    if url is not None:
        assert url["url"].endswith(f"/v1/sandboxes/{sid}/ports/8000/http/"), url
    for tool, args in [("file_download_url", {"url": "http://127.0.0.1:9/x", "path": "/tmp/x"}),
                       ("file_upload_url", {"url": "http://127.0.0.1:9/x", "path": "/home/user/proj/calc.py"})]:
        failed = error_text(await c.call_tool(tool, dict(args, sandbox_id=sid)))
        assert failed.split(":")[0] in ("unavailable", "unsupported"), failed


async def scenario(mode):
    async with client(KEY, mode) as plain:
        c = Recording(plain)
        tools = (await c.list_tools()).tools
        assert USED <= {t.name for t in tools}, [t.name for t in tools]
        assert all(t.output_schema for t in tools), tools
        created = ok(await c.call_tool("sandbox_create", {"timeout_secs": 300}))
        sid = created["sandbox_id"]
        assert created["state"] == "running", created
        seen = []

        async def progressed(progress, total, message):
            seen.append((progress, total, message))

        ran = ok(await c.call_tool("run_command", {"sandbox_id": sid, "command": "echo hi; echo oops >&2; exit 3"},
                                   progress_callback=progressed))
        assert (ran["exit_code"], ran["stdout"], ran["stderr"], ran["timed_out"]) == (3, "hi\n", "oops\n", False), ran
        # The first output is reported as progress before the result: the time limit is the total.
        assert seen and seen[0][1] == 60 and seen[0][2] in ("hi", "oops"), seen
        ok(await c.call_tool("file_write", {"sandbox_id": sid, "path": "/home/user/proj/main.py", "content": "print(6 * 7)\n"}))
        read = ok(await c.call_tool("file_read", {"sandbox_id": sid, "path": "/home/user/proj/main.py"}))
        assert read["content"] == "print(6 * 7)\n", read
        ran = ok(await c.call_tool("run_command", {"sandbox_id": sid, "command": "python3 main.py", "cwd": "/home/user/proj"}))
        assert ran["stdout"] == "42\n", ran
        assert error_text(await c.call_tool("file_read", {"sandbox_id": sid, "path": "/nope"})).startswith("file_not_found:")
        # An agent's loop: a project with a failing test; checkpoint; a wrong fix; roll back; the
        # right fix; the tests pass.
        ok(await c.call_tool("file_write", {"sandbox_id": sid, "path": "/home/user/proj/calc.py",
                                             "content": "def add(a, b):\n    return a - b\n"}))
        ok(await c.call_tool("file_write", {"sandbox_id": sid, "path": "/home/user/proj/test_calc.py",
                                             "content": "from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('passed')\n"}))
        # (-B: no bytecode cache, whose one-second source timestamps cannot tell edits made within
        # the same second apart.)
        test = {"sandbox_id": sid, "command": "python3 -B test_calc.py", "cwd": "/home/user/proj"}
        assert ok(await c.call_tool("run_command", test))["exit_code"] == 1
        ok(await c.call_tool("checkpoint", {"sandbox_id": sid}))
        edit = {"sandbox_id": sid, "path": "/home/user/proj/calc.py", "old_text": "return a - b"}
        ok(await c.call_tool("file_edit", dict(edit, new_text="return a * b")))
        assert ok(await c.call_tool("run_command", test))["exit_code"] == 1
        ok(await c.call_tool("rollback", {"sandbox_id": sid}))
        assert "return a - b" in ok(await c.call_tool("file_read", {"sandbox_id": sid, "path": "/home/user/proj/calc.py"}))["content"]
        ok(await c.call_tool("file_edit", dict(edit, new_text="return a + b")))
        passed = ok(await c.call_tool("run_command", test))
        assert (passed["exit_code"], passed["stdout"]) == (0, "passed\n"), passed
        names = [e["name"] for e in ok(await c.call_tool("file_list", {"sandbox_id": sid, "path": "/home/user/proj"}))["entries"]]
        assert {"calc.py", "main.py", "test_calc.py"} <= set(names), names
        await every_other_tool(c, sid)
        if OTHER is not None:
            # Another key's tenant: the sandbox is not there.
            async with client(OTHER, mode) as other:
                assert ok(await other.call_tool("sandbox_list", {}))["sandboxes"] == []
                refused = await other.call_tool("run_command", {"sandbox_id": sid, "command": "true"})
                assert error_text(refused).startswith("sandbox_not_found:")
        listed = ok(await c.call_tool("sandbox_list", {}))
        assert [s["sandbox_id"] for s in listed["sandboxes"]] == [sid], listed
        ok(await c.call_tool("sandbox_kill", {"sandbox_id": sid}))
        assert ok(await c.call_tool("sandbox_list", {}))["sandboxes"] == []
        # Every tool the server lists was called.
        assert c.called == {t.name for t in tools}, sorted({t.name for t in tools} - c.called)
    print("ok:", mode, flush=True)


async def refusals():
    URL = os.environ["PADDOCK_MCP_URL"]
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "check", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx2.AsyncClient(timeout=30) as http:
        r = await http.post(URL, json=initialize, headers=accept)
        assert r.status_code == 401 and r.json()["code"] == "unauthorized", (r.status_code, r.text)
        auth = dict(accept, Authorization="Bearer " + KEY)
        r = await http.post(URL, json=initialize, headers=dict(auth, Origin="https://evil.example"))
        assert r.status_code == 403, (r.status_code, r.text)
        r = await http.post(URL, json=initialize, headers=dict(auth, Host="evil.example"))
        assert r.status_code == 403, (r.status_code, r.text)
        r = await http.post(URL, json=initialize, headers=auth)
        assert r.status_code == 200, (r.status_code, r.text)
    print("ok: refusals", flush=True)


async def left_behind():
    """`--local`: a sandbox the client did not kill goes when the client disconnects."""
    async with client(KEY, "legacy") as c:
        ok(await c.call_tool("sandbox_create", {"timeout_secs": 300}))
    async with client(KEY, "legacy") as c:
        assert ok(await c.call_tool("sandbox_list", {}))["sandboxes"] == []
    print("ok: left behind", flush=True)


async def main():
    if TRANSPORT == "http":
        await refusals()
    for mode in ("legacy", "2026-07-28"):
        await scenario(mode)
    if TRANSPORT == "local":
        await left_behind()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except AssertionError as e:
        print("FAILED:", repr(e), file=sys.stderr)
        raise

"""E2B's own Python SDK (unchanged, from PyPI) driving paddock: every call goes through the real
client library to a real `paddock serve` and real sandboxes. Runs under e2b 2.45.x and the newest
2.x (the Rust test runs this file once per pinned version).

Waiting is for conditions (a file appearing, an event arriving) with a deadline as a safety net,
never a sleep standing in for synchronisation.
"""

import base64
import hashlib
import json
import os
import shlex
import socket
import time
import urllib.request

import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    FileType,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxQuery,
    TimeoutException,
)
from e2b.sandbox.filesystem.filesystem import WriteEntry

DEADLINE = 30.0
MISSING = "sb-00000000000000ff"


def until(what, predicate):
    end = time.monotonic() + DEADLINE
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def raw_get(listener, host, path, headers=None):
    """GET through the listener with an explicit Host (a per-sandbox host without DNS)."""
    req = urllib.request.Request(f"http://{listener[0]}:{listener[1]}{path}", headers={"Host": host, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=DEADLINE) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ---- commands ----------------------------------------------------------------------------------


def test_foreground_output_exit_code_env_cwd_user(sandbox):
    r = sandbox.commands.run("echo hi; echo err >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("hi\n", "err\n", 0)
    with pytest.raises(CommandExitException) as e:
        sandbox.commands.run("echo out; exit 3")
    assert e.value.exit_code == 3 and e.value.stdout == "out\n"
    assert sandbox.commands.run("echo $FOO", envs={"FOO": "bar baz"}).stdout == "bar baz\n"
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sandbox.commands.run("pwd").stdout == "/home/user\n"
    assert sandbox.commands.run("whoami").stdout == "user\n"
    assert sandbox.commands.run("whoami", user="root").stdout == "root\n"
    outs = []
    sandbox.commands.run("printf 'a\\nb\\n'", on_stdout=outs.append)
    assert "".join(outs) == "a\nb\n"


def test_create_time_env_vars():
    sbx = Sandbox.create(envs={"SANDBOX_WIDE": "yes"}, timeout=60)
    try:
        assert sbx.commands.run("echo $SANDBOX_WIDE").stdout == "yes\n"
    finally:
        sbx.kill()


def test_a_command_timeout_raises_timeout(sandbox):
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)


def test_background_stdin_list_reconnect_and_kill(sandbox):
    h = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(h.pid, "hello\n")
    sandbox.commands.close_stdin(h.pid)
    assert h.wait().stdout == "hello\n"

    # A background process that prints only once told to: connect first, then tell it.
    w = sandbox.commands.run(
        "while [ ! -e /tmp/go ]; do sleep 0.02; done; echo done", background=True
    )
    assert w.pid in [p.pid for p in sandbox.commands.list()]
    again = sandbox.commands.connect(w.pid)
    sandbox.files.write("/tmp/go", "")
    assert again.wait().stdout == "done\n"

    k = sandbox.commands.run("sleep 600", background=True)
    assert sandbox.commands.kill(k.pid) is True
    with pytest.raises(CommandExitException):
        k.wait()
    assert k.pid not in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(k.pid) is False


def test_pty_output_input_and_resize(sandbox):
    data = bytearray()
    h = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(h.pid, b"echo pty-$((6*7))\n")
    sandbox.pty.resize(h.pid, PtySize(rows=30, cols=101))
    sandbox.pty.send_stdin(h.pid, b"tput cols\nexit\n")
    result = h.wait(on_pty=lambda d: data.extend(d))
    assert result.exit_code == 0
    text = data.decode(errors="replace")
    assert "pty-42" in text
    assert "101" in text


# ---- files -------------------------------------------------------------------------------------


def test_files_read_write_list_stat_rename_remove(sandbox):
    info = sandbox.files.write("notes/a.txt", "hello")
    assert info.path == "/home/user/notes/a.txt"
    assert sandbox.files.read("notes/a.txt") == "hello"
    blob = bytes(range(256)) * 16
    sandbox.files.write("/tmp/blob.bin", blob)
    assert bytes(sandbox.files.read("/tmp/blob.bin", format="bytes")) == blob
    paths = [f"/home/user/many/{i}.txt" for i in range(5)]
    written = sandbox.files.write_files([WriteEntry(path=p, data=f"file {i}") for i, p in enumerate(paths)])
    assert sorted(w.path for w in written) == paths
    assert sandbox.files.read("/home/user/many/3.txt") == "file 3"

    assert sandbox.files.make_dir("/home/user/tree/sub") is True
    assert sandbox.files.make_dir("/home/user/tree/sub") is False
    sandbox.files.write("/home/user/tree/sub/deep.txt", "x")
    shallow = {e.path for e in sandbox.files.list("/home/user/tree")}
    assert shallow == {"/home/user/tree/sub"}
    deep = {e.path for e in sandbox.files.list("/home/user/tree", depth=2)}
    assert deep == {"/home/user/tree/sub", "/home/user/tree/sub/deep.txt"}

    st = sandbox.files.get_info("/home/user/notes/a.txt")
    assert (st.name, st.type, st.size) == ("a.txt", FileType.FILE, 5)
    assert sandbox.files.get_info("/home/user/tree").type == FileType.DIR

    moved = sandbox.files.rename("/home/user/notes/a.txt", "/home/user/moved/b.txt")
    assert moved.path == "/home/user/moved/b.txt"
    assert sandbox.files.exists("/home/user/moved/b.txt")
    assert not sandbox.files.exists("/home/user/notes/a.txt")
    sandbox.files.remove("/home/user/moved")
    assert not sandbox.files.exists("/home/user/moved/b.txt")
    sandbox.files.remove("/home/user/never-was")  # no error, as envd
    with pytest.raises(NotFoundException):
        sandbox.files.read("/home/user/never-was")


def test_watch_reports_events(sandbox):
    sandbox.files.make_dir("/home/user/watched")
    handle = sandbox.files.watch_dir("/home/user/watched")
    try:
        sandbox.files.write("/home/user/watched/new.txt", "data")
        seen = []

        def got():
            seen.extend(handle.get_new_events())
            return any(e.name == "new.txt" for e in seen)

        until("a watch event for new.txt", got)
    finally:
        handle.stop()


def test_signed_urls(sandbox, listener):
    sandbox.files.write("/home/user/shared.txt", "signed")
    domain = os.environ["E2B_DOMAIN"]
    host = f"49983-{sandbox.sandbox_id}.{domain}"
    url = sandbox.download_url("/home/user/shared.txt", use_signature_expiration=600)
    path = url[url.index("/files"):]
    assert raw_get(listener, host, path) == (200, b"signed")
    tampered = path.replace("signature=v1_", "signature=v1_x")
    assert raw_get(listener, host, tampered)[0] == 401
    expired = sandbox.download_url("/home/user/shared.txt", use_signature_expiration=-10)
    status, body = raw_get(listener, host, expired[expired.index("/files"):])
    assert status == 401 and b"signature is already expired" in body


# ---- lifecycle ---------------------------------------------------------------------------------


def test_info_timeout_list_and_paging():
    tag = hashlib.sha256(os.urandom(8)).hexdigest()[:12]
    a = Sandbox.create(metadata={"run": tag, "n": "1"}, timeout=60)
    b = Sandbox.create(metadata={"run": tag, "n": "2"}, timeout=60)
    try:
        info = a.get_info()
        assert info.sandbox_id == a.sandbox_id
        assert info.metadata == {"run": tag, "n": "1"}
        before = info.end_at
        a.set_timeout(600)
        assert a.get_info().end_at > before

        pages = Sandbox.list(query=SandboxQuery(metadata={"run": tag}), limit=1)
        ids = []
        while pages.has_next:
            ids.extend(s.sandbox_id for s in pages.next_items())
        assert ids == [b.sandbox_id, a.sandbox_id]  # newest first, one per page
        only = Sandbox.list(query=SandboxQuery(metadata={"run": tag, "n": "2"})).next_items()
        assert [s.sandbox_id for s in only] == [b.sandbox_id]
    finally:
        a.kill()
        b.kill()
    assert Sandbox.kill(a.sandbox_id) is False
    assert not a.is_running()


def test_pause_resume_and_metrics(sandbox):
    sandbox.files.write("/home/user/kept.txt", "kept")
    assert sandbox.get_metrics(), "a running sandbox has a metrics sample"
    sandbox.pause()
    assert not sandbox.is_running()
    listed = Sandbox.list(query=SandboxQuery(metadata={"suite": "python"})).next_items()
    assert any(s.sandbox_id == sandbox.sandbox_id and s.state.value == "paused" for s in listed)
    resumed = Sandbox.connect(sandbox.sandbox_id)
    assert resumed.is_running()
    assert resumed.files.read("/home/user/kept.txt") == "kept"


def test_errors_for_missing_sandbox_and_bad_key():
    with pytest.raises(NotFoundException):
        Sandbox.connect(MISSING)
    with pytest.raises(NotFoundException):
        Sandbox.get_info(MISSING)
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 76)


def test_another_tenant_sees_nothing(sandbox, other_key, listener):
    with pytest.raises(NotFoundException):
        Sandbox.connect(sandbox.sandbox_id, api_key=other_key)
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, api_key=other_key)
    listed = Sandbox.list(api_key=other_key).next_items()
    assert sandbox.sandbox_id not in [s.sandbox_id for s in listed]
    assert Sandbox.kill(sandbox.sandbox_id, api_key=other_key) is False
    assert sandbox.is_running()
    # Without the sandbox's own token, envd answers nothing.
    domain = os.environ["E2B_DOMAIN"]
    status, _ = raw_get(listener, f"49983-{sandbox.sandbox_id}.{domain}", "/envs", {"X-Access-Token": "0" * 64})
    assert status == 401


# ---- network ------------------------------------------------------------------------------------


def v1_network(listener, sandbox_id):
    """The sandbox's egress policy as paddock's own API shows it (status, JSON)."""
    req = urllib.request.Request(f"http://{listener[0]}:{listener[1]}/v1/sandboxes/{sandbox_id}/network",
                                 headers={"Authorization": "Bearer " + os.environ["E2B_API_KEY"]})
    try:
        with urllib.request.urlopen(req, timeout=DEADLINE) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def in_sandbox(sbx, code):
    """Runs Python in the sandbox; its last line (or the error's name) and the exit code."""
    r = sbx.commands.run(f"python3 -c {shlex.quote(code)} 2>&1; echo rc=$?")
    return r.stdout.strip().splitlines()[-2:]


def test_network_allow_and_deny_lists(listener):
    sbx = Sandbox.create(timeout=120, network={"allow_out": ["allowed.test", "192.0.2.0/24"], "deny_out": ["0.0.0.0/0"]})
    try:
        status, net = v1_network(listener, sbx.sandbox_id)
        assert status == 200, net
        allowed = json.dumps(net["policy"]["allow"])
        assert "allowed.test" in allowed and "192.0.2.0/24" in allowed, net
        assert net["policy"].get("deny", []) == [], net
        # Names off the list are refused by the sandbox's own resolver (no question leaves it).
        lookup = "import socket\ntry:\n    socket.getaddrinfo('denied.test', 80)\n    print('RESOLVED')\nexcept OSError as e:\n    print('REFUSED', e)"
        assert in_sandbox(sbx, lookup)[0].startswith("REFUSED"), in_sandbox(sbx, lookup)
        # update_network replaces the lists.
        sbx.update_network({"allow_out": ["other.test"], "deny_out": ["0.0.0.0/0"]})
        status, net = v1_network(listener, sbx.sandbox_id)
        allowed = json.dumps(net["policy"]["allow"])
        assert "other.test" in allowed and "allowed.test" not in allowed, net
    finally:
        sbx.kill()


def test_no_internet_access_means_no_network():
    sbx = Sandbox.create(timeout=120, allow_internet_access=False)
    try:
        # No link at all: nothing but loopback inside.
        connect = "import socket\ntry:\n    socket.create_connection(('192.0.2.1', 80), timeout=5)\n    print('CONNECTED')\nexcept OSError as e:\n    print('UNREACHABLE', e)"
        out = in_sandbox(sbx, connect)
        assert out[0].startswith("UNREACHABLE") and "unreachable" in out[0].lower(), out
    finally:
        sbx.kill()


# ---- ports -------------------------------------------------------------------------------------


def test_get_host_reaches_a_web_server_inside(sandbox, listener):
    sandbox.files.write("/home/user/www/index.html", "from inside")
    sandbox.commands.run("cd /home/user/www && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
    host = sandbox.get_host(8000)
    assert host == f"8000-{sandbox.sandbox_id}.{os.environ['E2B_DOMAIN']}"
    status, body = until("the web server", lambda: (lambda r: r if r[0] == 200 else None)(raw_get(listener, host, "/index.html")))
    assert body == b"from inside"
    status, body = raw_get(listener, sandbox.get_host(8001), "/")
    assert status == 502 and b"port is not open" in body


def test_websocket_through_get_host(sandbox, listener):
    server = r'''
import base64, hashlib, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8765)); s.listen(1)
c, _ = s.accept(); req = b""
while b"\r\n\r\n" not in req: req += c.recv(4096)
key = [l.split(b":", 1)[1].strip() for l in req.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key")][0]
acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
h = c.recv(2); n = h[1] & 127; mask = c.recv(4); data = bytes(b ^ mask[i % 4] for i, b in enumerate(c.recv(n)))
c.sendall(bytes([0x81, len(data)]) + data.upper())
'''
    sandbox.files.write("/tmp/ws.py", server)
    sandbox.commands.run("python3 /tmp/ws.py", background=True)
    host = sandbox.get_host(8765)

    def handshake():
        s = socket.create_connection(listener, timeout=DEADLINE)
        key = base64.b64encode(os.urandom(16))
        s.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        if not head.startswith(b"HTTP/1.1 101"):
            s.close()
            return None
        return s

    s = until("the WebSocket server", handshake)
    mask = os.urandom(4)
    payload = b"echo me"
    s.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    frame = s.recv(2 + len(payload))
    assert frame[2:] == b"ECHO ME"
    s.close()

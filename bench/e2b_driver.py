"""Driver of bench/e2b_sdks.py for E2B's Python SDK (runs in the SDK's virtual environment).

Reads E2B_* (the SDK's own configuration) and BENCH_* from the environment, does what BENCH_WHAT
names and prints one JSON object of samples in milliseconds:
  create  {"create_run": [...]}         Sandbox.create() then commands.run("echo hi"), BENCH_CREATES times
  live    {"run_true": [...], "files": [...]}
                                        commands.run("true") BENCH_RUNS times; 1 MiB files.write + read
                                        BENCH_FILES times (checked byte for byte)
  ports   {"proxied": [...], "direct_fresh": [...], "direct_keepalive": [...]}
                                        BENCH_REQUESTS GETs to a server on the sandbox's port 8000: from
                                        here through paddock (host form, keep-alive), and from a process
                                        in the sandbox to 127.0.0.1:8000 (fresh connections; keep-alive)
  warmup  all of the above, few times, nothing printed but {}
Each sandbox it creates is killed before it exits.
"""
import http.client
import json
import os
import sys
import time
import urllib.parse

from e2b import Sandbox

MIB = 1 << 20
PORT = 8000
SERVER = r'''
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", %d), H).serve_forever()
''' % PORT
CLIENT = r'''
import http.client, json, sys, time
n, mode = int(sys.argv[1]), sys.argv[2]
out = []
conn = http.client.HTTPConnection("127.0.0.1", %d)
for _ in range(n):
    if mode == "fresh":
        conn = http.client.HTTPConnection("127.0.0.1", %d)
    t = time.perf_counter()
    conn.request("GET", "/")
    r = conn.getresponse()
    assert r.read() == b"ok"
    out.append((time.perf_counter() - t) * 1000)
    if mode == "fresh":
        conn.close()
print(json.dumps(out))
''' % (PORT, PORT)


def ms(t):
    return (time.perf_counter() - t) * 1000


def create_run(n):
    out = []
    for _ in range(n):
        t = time.perf_counter()
        sbx = Sandbox.create(timeout=600)
        r = sbx.commands.run("echo hi")
        out.append(ms(t))
        assert r.stdout == "hi\n", r
        sbx.kill()
    return out


def live(runs, files):
    sbx = Sandbox.create(timeout=600)
    try:
        run_true = []
        for _ in range(runs):
            t = time.perf_counter()
            r = sbx.commands.run("true")
            run_true.append(ms(t))
            assert r.exit_code == 0, r
        data = os.urandom(MIB)
        moved = []
        for i in range(files):
            path = "/tmp/bench-%d.bin" % i
            t = time.perf_counter()
            sbx.files.write(path, data)
            back = sbx.files.read(path, format="bytes")
            moved.append(ms(t))
            assert bytes(back) == data, len(back)
        return {"run_true": run_true, "files": moved}
    finally:
        sbx.kill()


def ports(n):
    sbx = Sandbox.create(timeout=600)
    try:
        sbx.files.write("/tmp/bench_server.py", SERVER)
        sbx.files.write("/tmp/bench_client.py", CLIENT)
        sbx.commands.run("python3 /tmp/bench_server.py", background=True)
        api = urllib.parse.urlparse(os.environ["E2B_API_URL"])
        host = "%d-%s.%s" % (PORT, sbx.sandbox_id, os.environ["E2B_DOMAIN"])
        conn = http.client.HTTPConnection(api.hostname, api.port)
        # Readiness: the server answers through the door (502 until it listens); a safety deadline.
        deadline = time.time() + 30
        while True:
            conn.request("GET", "/", headers={"Host": host})
            r = conn.getresponse()
            body = r.read()
            if r.status == 200:
                break
            if time.time() > deadline:
                raise RuntimeError("the sandbox's server never answered: %d %r" % (r.status, body))
            time.sleep(0.05)
        proxied = []
        for _ in range(n):
            t = time.perf_counter()
            conn.request("GET", "/", headers={"Host": host})
            r = conn.getresponse()
            body = r.read()
            proxied.append(ms(t))
            assert r.status == 200 and body == b"ok", (r.status, body)
        direct = {}
        for mode in ("fresh", "keepalive"):
            r = sbx.commands.run("python3 /tmp/bench_client.py %d %s" % (n, mode))
            direct[mode] = json.loads(r.stdout)
        return {"proxied": proxied, "direct_fresh": direct["fresh"], "direct_keepalive": direct["keepalive"]}
    finally:
        sbx.kill()


def main():
    what = os.environ["BENCH_WHAT"]
    creates, runs = int(os.environ["BENCH_CREATES"]), int(os.environ["BENCH_RUNS"])
    files, requests = int(os.environ["BENCH_FILES"]), int(os.environ["BENCH_REQUESTS"])
    if what == "create":
        out = {"create_run": create_run(creates)}
    elif what == "live":
        out = live(runs, files)
    elif what == "ports":
        out = ports(requests)
    elif what == "warmup":
        create_run(creates)
        live(runs, files)
        ports(requests)
        out = {}
    else:
        sys.exit("unknown BENCH_WHAT %r" % what)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

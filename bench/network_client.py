"""The client of bench/network.py, run inside a sandbox (or on the host).

    client.py MODE HOST PORT N CAFILE

MODE: `direct` (connect to HOST, an address, with SNI bench.test), `proxy` (CONNECT HOST:PORT through
HTTPS_PROXY), `transparent` (resolve HOST and connect, ignoring the proxy), `inject` (like proxy, with
`Authorization: Bearer $TOKEN`, TOKEN holding a paddock placeholder). CAFILE: the trust bundle (empty:
the default, which honours SSL_CERT_FILE). Prints one JSON line: per-request microseconds for `new`
(a new connection each time) and `keepalive` (one connection).
"""
import http.client
import json
import os
import socket
import ssl
import sys
import time
import urllib.parse

mode, host, port, n, cafile = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ctx = ssl.create_default_context(cafile=cafile or None)
headers = {"Authorization": "Bearer " + os.environ.get("TOKEN", "")} if mode == "inject" else {}


class Direct(http.client.HTTPSConnection):
    """Connects to an address while presenting the server's name."""

    def connect(self):
        sock = socket.create_connection((host, port), timeout=10)
        self.sock = ctx.wrap_socket(sock, server_hostname="bench.test")


def connection():
    if mode == "direct":
        return Direct(host, port, context=ctx, timeout=10)
    if mode in ("proxy", "inject"):
        proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
        c = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=ctx, timeout=10)
        c.set_tunnel(host, port)
        return c
    return http.client.HTTPSConnection(host, port, context=ctx, timeout=10)


def request(c):
    c.request("GET", "/", headers=headers)
    body = c.getresponse().read()
    if not body.startswith(b"ok"):
        raise SystemExit("unexpected answer %r" % body)
    if mode == "inject" and b"bench-secret-value" not in body:
        raise SystemExit("the secret was not injected: %r" % body)


out = {"new": [], "keepalive": []}
for _ in range(3):  # warm-up: DNS pins, leaf certificates
    c = connection()
    request(c)
    c.close()
for _ in range(n):
    t = time.perf_counter()
    c = connection()
    request(c)
    out["new"].append((time.perf_counter() - t) * 1e6)
    c.close()
c = connection()
request(c)
for _ in range(n):
    t = time.perf_counter()
    request(c)
    out["keepalive"].append((time.perf_counter() - t) * 1e6)
c.close()
print(json.dumps(out))

#!/usr/bin/env python3
"""A webhook receiver for the approvals tests: a real HTTP server on 127.0.0.1.

Usage: webhook_receiver.py KEY_FILE FAILURES

It answers the first FAILURES requests with 503, then 200. For every request it prints one JSON
line on stdout: the path, the Paddock-* headers, the body (parsed), the attempt number, and whether
the Paddock-Signature verifies under the key (recomputed here with Python's own hmac module, an
implementation independent of the server's) and its time is within five minutes. The first line it
prints is `listening <port>`.
"""

import hashlib
import hmac
import http.server
import json
import sys
import threading
import time

KEY = open(sys.argv[1], "rb").read().strip()
FAILURES = int(sys.argv[2])
LOCK = threading.Lock()
SEEN = [0]


def verify(header, body):
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        t = int(parts["t"])
        expected = hmac.new(KEY, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, parts["v1"]) and abs(time.time() - t) < 300
    except Exception:
        return False


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        with LOCK:
            SEEN[0] += 1
            n = SEEN[0]
        status = 503 if n <= FAILURES else 200
        record = {
            "n": n,
            "status": status,
            "path": self.path,
            "event": self.headers.get("Paddock-Event"),
            "delivery": self.headers.get("Paddock-Delivery"),
            "valid": verify(self.headers.get("Paddock-Signature", ""), body),
            "tampered_valid": verify(self.headers.get("Paddock-Signature", ""), body + b" "),
            "body": json.loads(body or b"null"),
        }
        with LOCK:
            print(json.dumps(record), flush=True)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(f"listening {server.server_address[1]}", flush=True)
server.serve_forever()

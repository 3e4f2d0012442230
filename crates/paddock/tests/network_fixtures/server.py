# The test's stand-in for the outside world, on an address of a dummy interface the test created:
# plain HTTP and HTTPS on free ports. Files under ROOT are served (a package index); /echo answers
# with the request's Authorization and Host headers, /reflect with its whole request line and every
# header (as many APIs' echo endpoints do). Prints "ready HTTP_PORT HTTPS_PORT".
import http.server
import ssl
import sys
import threading

ip, root, cert, key = sys.argv[1:5]


class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=root, **kwargs)

    def do_GET(self):
        if self.path.startswith("/reflect"):
            body = (self.requestline + "\n" + str(self.headers)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path.startswith("/echo"):
            body = "auth={} host={}\n".format(
                self.headers.get("Authorization"), self.headers.get("Host")
            ).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            super().do_GET()

    def log_message(self, *args):
        pass


plain = http.server.ThreadingHTTPServer((ip, 0), Handler)
tls = http.server.ThreadingHTTPServer((ip, 0), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
tls.socket = context.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
print("ready", plain.server_address[1], tls.server_address[1], flush=True)
plain.serve_forever()

# A WebSocket echo server on 127.0.0.1:PORT, with nothing but the standard library: the handshake,
# then every text or binary frame (up to 64 KiB) sent back; a close frame is answered and ends it.
import base64, hashlib, socket, struct, sys, threading

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

def serve(c):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(4096)
        if not chunk:
            return
        data += chunk
    keys = [l.split(b":", 1)[1].strip() for l in data.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")]
    if not keys:
        c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        return
    accept = base64.b64encode(hashlib.sha1(keys[0] + GUID).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    f = c.makefile("rb")
    while True:
        h = f.read(2)
        if len(h) < 2:
            return
        op, n = h[0] & 0x0F, h[1] & 0x7F
        if n == 126:
            n = struct.unpack(">H", f.read(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", f.read(8))[0]
        mask = f.read(4) if h[1] & 0x80 else b"\0\0\0\0"
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))
        if op == 8:
            c.sendall(b"\x88\x00")
            return
        if op in (1, 2):
            size = bytes([len(payload)]) if len(payload) < 126 else bytes([126]) + struct.pack(">H", len(payload))
            c.sendall(bytes([0x80 | op]) + size + payload)

s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
while True:
    conn, _ = s.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()

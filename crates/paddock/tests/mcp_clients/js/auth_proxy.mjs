// A loopback reverse proxy that adds `Authorization: Bearer $PADDOCK_API_KEY` to every request and
// forwards it to $PADDOCK_UPSTREAM (`http://127.0.0.1:PORT`), streaming the response (SSE
// included) back. It presents the upstream as itself, as a reverse proxy does: a `Host` or `Origin`
// naming the proxy's own address is rewritten to the upstream's; every other header (a foreign
// Host or Origin included), the method, path and body go through unchanged.
//
// The MCP conformance suite's server runner cannot send headers (no option, no environment
// variable), and paddock's /mcp refuses requests without a key; the suite talks to this proxy
// instead, so paddock's authentication stays as it is. Run by the e2e tests
// mcp::npm_clients::conformance_*; it prints `listening on PORT` once it accepts connections.
import http from "node:http";

const upstream = new URL(process.env.PADDOCK_UPSTREAM);
const auth = "Bearer " + process.env.PADDOCK_API_KEY;

const server = http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: auth };
  const self = `127.0.0.1:${server.address().port}`;
  if (headers.host === self) {
    headers.host = upstream.host;
  }
  if (headers.origin === `http://${self}`) {
    headers.origin = upstream.origin;
  }
  const out = http.request(
    {
      host: upstream.hostname,
      port: upstream.port,
      method: req.method,
      path: req.url,
      headers,
    },
    (reply) => {
      res.writeHead(reply.statusCode, reply.statusMessage, reply.rawHeaders);
      res.flushHeaders();
      reply.pipe(res);
    },
  );
  out.on("error", (e) => {
    if (!res.headersSent) {
      res.writeHead(502, { "content-type": "text/plain" });
    }
    res.end(`auth_proxy: ${e.message}\n`);
  });
  // The client going away ends the upstream request too (an abandoned SSE stream).
  res.on("close", () => out.destroy());
  req.pipe(out);
});

server.listen(0, "127.0.0.1", () => {
  console.log(`listening on ${server.address().port}`);
});

// node_http.js: Node.js http server and keep-alive client for the
// application tier (test/apps/run.sh).
//
//   node node_http.js server PORT
//       serves GET /N/SEED: a body of N bytes, a function of SEED and the
//       offset; POST /echo: the request body. Prints READY once listening;
//       exits (closing the listener) on SIGTERM or SIGINT.
//   node node_http.js client PORT REQUESTS SOCKETS
//       makes REQUESTS requests (GETs of assorted sizes up to 1 MiB, and
//       POSTs echoed back) over a keep-alive agent of at most SOCKETS
//       sockets, every body checked. Prints "RESULT requests=R ok=K
//       sockets=S" (S: distinct sockets used) and exits 0 iff every request
//       came back whole over at most SOCKETS sockets.
'use strict';
const http = require('http');

function body(n, seed) {
  const b = Buffer.allocUnsafe(n);
  let x = (seed * 2654435761) >>> 0;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    b[i] = x >>> 24;
  }
  return b;
}

const [role, portArg, reqArg, sockArg] = process.argv.slice(2);
const port = Number(portArg);

if (role === 'server') {
  const server = http.createServer({keepAliveTimeout: 30000}, (req, res) => {
    if (req.method === 'POST' && req.url === '/echo') {
      const parts = [];
      req.on('data', (c) => parts.push(c));
      req.on('end', () => {
        const b = Buffer.concat(parts);
        res.writeHead(200, {'Content-Length': b.length});
        res.end(b);
      });
      return;
    }
    const m = /^\/(\d+)\/(\d+)$/.exec(req.url);
    if (req.method !== 'GET' || !m) {
      res.writeHead(404);
      res.end();
      return;
    }
    const b = body(Number(m[1]), Number(m[2]));
    res.writeHead(200, {'Content-Length': b.length});
    res.end(b);
  });
  server.listen(port, '127.0.0.1', () => console.log('READY'));
  const stop = () => {
    server.close();
    server.closeAllConnections();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
} else if (role === 'client') {
  const requests = Number(reqArg);
  const maxSockets = Number(sockArg);
  const agent = new http.Agent({keepAlive: true, maxSockets});
  const sockets = new Set();
  const sizes = [0, 1, 100, 4096, 65537, 1 << 20];
  let ok = 0;
  let done = 0;
  const finish = () => {
    agent.destroy();
    console.log(`RESULT requests=${requests} ok=${ok} sockets=${sockets.size}`);
    process.exitCode = ok === requests && sockets.size <= maxSockets ? 0 : 1;
  };
  for (let i = 0; i < requests; i++) {
    const post = i % 3 === 2;
    const want = post ? body(sizes[i % sizes.length] + 7, i + 1000) : body(sizes[i % sizes.length], i);
    const req = http.request(
        {host: '127.0.0.1', port, agent, method: post ? 'POST' : 'GET',
         path: post ? '/echo' : `/${want.length}/${i}`,
         headers: post ? {'Content-Length': want.length} : {}},
        (res) => {
          const parts = [];
          res.on('data', (c) => parts.push(c));
          res.on('end', () => {
            const got = Buffer.concat(parts);
            if (res.statusCode === 200 && got.equals(want)) ok++;
            else console.error(`request ${i}: status ${res.statusCode}, ${got.length} of ${want.length} bytes, equal=${got.equals(want)}`);
            if (++done === requests) finish();
          });
        });
    req.on('socket', (s) => sockets.add(s));
    req.on('error', (e) => {
      console.error(`request ${i}: ${e.message}`);
      if (++done === requests) finish();
    });
    req.end(post ? want : undefined);
  }
} else {
  console.error('usage: node node_http.js server PORT | client PORT REQUESTS SOCKETS');
  process.exit(2);
}

#!/usr/bin/env python3
"""A socketserver.ThreadingTCPServer and its concurrent clients, for the
application tier (test/apps/run.sh).

  py_threading.py server PORT CONNECTIONS
      serves CONNECTIONS connections on 127.0.0.1:PORT, a thread each: every
      line "N SEED" is answered with N pseudo-random bytes (a function of
      SEED) and a newline; "BYE" ends the connection. Prints READY once
      listening, then "SERVED connections=C" and exits 0 when all ended.
  py_threading.py client PORT CONNECTIONS ROUNDS
      CONNECTIONS threads at once, each on its own connection, ask ROUNDS
      questions of assorted sizes (up to 256 KiB) and check every answer.
      Prints "RESULT connections=C ok=K answers=A" and exits 0 iff every
      thread got every answer right.
Every socket has a 60 s timeout: a lost byte is an error, not a hang.
"""
import random
import socket
import socketserver
import sys
import threading


def answer(n, seed):
    return random.Random(seed).randbytes(n)


class Handler(socketserver.StreamRequestHandler):
    timeout = 60

    def handle(self):
        while True:
            line = self.rfile.readline()
            if not line or line == b"BYE\n":
                break
            n, seed = (int(x) for x in line.split())
            self.wfile.write(answer(n, seed) + b"\n")
        self.server.ended += 1


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = False
    block_on_close = True
    ended = 0


def client(port, ident, rounds, results):
    sizes = [1, 17, 4096, 65536, 262144]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            f = s.makefile("rb")
            for r in range(rounds):
                n, seed = sizes[(ident + r) % len(sizes)], ident * 100000 + r
                s.sendall(b"%d %d\n" % (n, seed))
                got = f.read(n + 1)
                if got != answer(n, seed) + b"\n":
                    print(f"client {ident}: round {r}: wrong answer ({len(got)} of {n + 1} bytes)",
                          file=sys.stderr)
                    return
            s.sendall(b"BYE\n")
            results[ident] = rounds
    except OSError as e:
        print(f"client {ident}: {e}", file=sys.stderr)


def main():
    role, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if role == "server":
        with Server(("127.0.0.1", port), Handler) as srv:
            print("READY", flush=True)
            for _ in range(count):
                srv.handle_request()
            srv.server_close()  # joins the handler threads (block_on_close)
            print(f"SERVED connections={srv.ended}", flush=True)
            return 0 if srv.ended == count else 1
    rounds = int(sys.argv[4])
    results = [0] * count
    threads = [threading.Thread(target=client, args=(port, i, rounds, results)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = sum(1 for r in results if r == rounds)
    print(f"RESULT connections={count} ok={ok} answers={sum(results)}")
    return 0 if ok == count else 1


if __name__ == "__main__":
    sys.exit(main())

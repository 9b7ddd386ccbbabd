#!/usr/bin/env python3
"""A socketserver.ThreadingTCPServer and its concurrent clients, for the
application tier (test/apps/run.sh) and the `py-threaded` row of `make bench`.

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
  py_threading.py echo-server PORT CONNECTIONS
      echoes what each of CONNECTIONS connections sends, a thread each
      (recv of up to 64 KiB, sendall); READY and SERVED as above.
  py_threading.py echo-client PORT CONNECTIONS MESSAGES SIZE
      CONNECTIONS threads at once, each on its own connection: MESSAGES
      times, sends SIZE pseudo-random bytes whole and only then reads the
      SIZE bytes of the echo back, checking them. Prints "RESULT
      connections=C ok=K bytes=B seconds=S MBps=M" (B: bytes echoed back to
      all threads; S: from the moment all are connected to the last byte)
      and exits 0 iff every thread got its echo right. The `py-threaded`
      row of `make bench` (benchmarks/apps.sh) and the apps case
      `python-echo-1m`.
Every socket has a 60 s timeout: a lost byte is an error, not a hang.
"""
import random
import socket
import socketserver
import sys
import threading
import time


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


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self):
        self.request.settimeout(60)
        while True:
            data = self.request.recv(65536)
            if not data:
                break
            self.request.sendall(data)
        self.server.ended += 1


def echo_client(port, ident, messages, size, results, start):
    payload = random.Random(ident).randbytes(size)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            start.wait()
            buf = bytearray(size)
            view = memoryview(buf)
            for m in range(messages):
                s.sendall(payload)
                got = 0
                while got < size:
                    n = s.recv_into(view[got:], size - got)
                    if n == 0:
                        print(f"client {ident}: message {m}: EOF after {got} bytes", file=sys.stderr)
                        return
                    got += n
                if buf != payload:
                    print(f"client {ident}: message {m}: wrong echo", file=sys.stderr)
                    return
            results[ident] = messages * size
    except (OSError, threading.BrokenBarrierError) as e:
        print(f"client {ident}: {e!r}", file=sys.stderr)
        start.abort()  # the others and the clock do not wait for this one


def serve(handler, port, count):
    with Server(("127.0.0.1", port), handler) as srv:
        print("READY", flush=True)
        for _ in range(count):
            srv.handle_request()
        srv.server_close()  # joins the handler threads (block_on_close)
        print(f"SERVED connections={srv.ended}", flush=True)
        return 0 if srv.ended == count else 1


def echo_clients(port, count, messages, size):
    results = [0] * count
    # Every thread connects first; the clock starts when all may send.
    start = threading.Barrier(count + 1)
    threads = [threading.Thread(target=echo_client, args=(port, i, messages, size, results, start))
               for i in range(count)]
    for t in threads:
        t.start()
    try:
        start.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass  # a thread failed; it said why
    t0 = time.monotonic()
    for t in threads:
        t.join()
    secs = time.monotonic() - t0
    ok = sum(1 for r in results if r)
    total = sum(results)
    print(f"RESULT connections={count} ok={ok} bytes={total} seconds={secs:.3f} "
          f"MBps={total / secs / 1e6:.1f}", flush=True)
    return 0 if ok == count else 1


def main():
    role, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if role == "server":
        return serve(Handler, port, count)
    if role == "echo-server":
        return serve(EchoHandler, port, count)
    if role == "echo-client":
        return echo_clients(port, count, int(sys.argv[4]), int(sys.argv[5]))
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

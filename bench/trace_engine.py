#!/usr/bin/env python3
"""A tracing proxy for the engine's socket: every HTTP request a client makes, with when
it started (ms since the proxy's first request) and how long until the engine's answer
began, one line each on standard error.

  bench/trace_engine.py /tmp/trace.sock [/var/run/docker.sock] &
  DOCKER_HOST=unix:///tmp/trace.sock cibox batch run ...

Used to see where a batch's time goes (issue 44): which engine calls it makes, how many,
and how long each takes. Streams (attach, logs, events) show their time to the first byte.
"""
import os, socket, sys, threading, time

LISTEN = sys.argv[1]
UPSTREAM = sys.argv[2] if len(sys.argv) > 2 else "/var/run/docker.sock"
T0 = [None]
LOCK = threading.Lock()


def now_ms():
    t = time.perf_counter()
    with LOCK:
        if T0[0] is None:
            T0[0] = t
    return (t - T0[0]) * 1000


def pump_up(client, up, pending):
    """Client to engine: notes each request line as it passes."""
    buf = b""
    try:
        while True:
            data = client.recv(65536)
            if not data:
                break
            buf += data
            # A request line starts a message; bodies pass through (good enough for a trace).
            while b"\r\n" in buf:
                line, buf = buf.split(b"\r\n", 1)
                parts = line.split(b" ")
                if len(parts) == 3 and parts[2].startswith(b"HTTP/1.") and parts[0].isalpha():
                    pending.append((now_ms(), line.decode(errors="replace")))
                if len(buf) > 65536:
                    buf = b""
            up.sendall(data)
    except OSError:
        pass
    try:
        up.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def pump_down(up, client, pending):
    """Engine to client: each answer's status line closes the oldest open request."""
    try:
        while True:
            data = up.recv(65536)
            if not data:
                break
            i = 0
            while True:
                j = data.find(b"HTTP/1.1 ", i)
                if j < 0:
                    break
                if pending:
                    start, req = pending.pop(0)
                    status = data[j + 9:j + 12].decode(errors="replace")
                    end = now_ms()
                    sys.stderr.write(f"{start:9.1f} ms  {end - start:7.1f} ms  {status}  {req}\n")
                    sys.stderr.flush()
                i = j + 9
            client.sendall(data)
    except OSError:
        pass
    try:
        client.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def serve(client):
    up = socket.socket(socket.AF_UNIX)
    up.connect(UPSTREAM)
    pending = []
    a = threading.Thread(target=pump_up, args=(client, up, pending), daemon=True)
    b = threading.Thread(target=pump_down, args=(up, client, pending), daemon=True)
    a.start(); b.start(); a.join(); b.join()
    client.close(); up.close()


def main():
    if os.path.exists(LISTEN):
        os.unlink(LISTEN)
    s = socket.socket(socket.AF_UNIX)
    s.bind(LISTEN)
    s.listen(64)
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


if __name__ == "__main__":
    main()

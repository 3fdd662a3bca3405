#!/usr/bin/env python3
"""soak.py — `make soak`: one `lumen serve` on the embedded model (models/lumen-tiny-kjv), on
127.0.0.1 with an ephemeral port, under mixed traffic for N minutes (default 2):

  valid      chat (plain and streamed), completions, Anthropic messages, /health, /v1/models,
             /metrics: every one must be answered 200 with a well-formed body;
  malformed  bad JSON, wrong types, unknown roles, invalid UTF-8, unknown paths, wrong methods,
             an oversized body, reserved chat_template_kwargs: every one must get a 4xx;
  abandoned  streams dropped after the first bytes, requests cut in the headers or the body,
             non-streamed generations whose client leaves at once;
  slow       connections that trickle one header line a second (reopened when the server drops
             them).

The server's RSS and open descriptors are sampled every 2 s; after the load stops they must be
back near the level seen after warm-up (RSS within 64 MB, descriptors within 16), with the peak
RSS within 256 MB of it. Exits 0 when every check holds, 1 otherwise. Standard library only;
loopback only; every loop ends at the deadline.
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"


def log(*a):
    print("soak:", *a, flush=True)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.n = {}
        self.fail = []

    def ok(self, kind):
        with self.lock:
            self.n[kind] = self.n.get(kind, 0) + 1

    def bad(self, kind, why):
        with self.lock:
            self.n[kind + "_failed"] = self.n.get(kind + "_failed", 0) + 1
            if len(self.fail) < 20:
                self.fail.append(f"{kind}: {why}")


def request(port, method, path, body=None, headers="", timeout=60.0, raw=None):
    """One HTTP/1.1 request with Connection: close; returns (status, head, body bytes)."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    try:
        if raw is not None:
            s.sendall(raw)
        else:
            b = body if isinstance(body, bytes) else (body or "").encode()
            head = (f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n"
                    f"Content-Type: application/json\r\n{headers}Content-Length: {len(b)}\r\n\r\n")
            try:
                s.sendall(head.encode() + b)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before the body was read (413): the answer is still there
        data = b""
        while True:
            try:
                k = s.recv(65536)
            except ConnectionResetError:
                if data:
                    break
                raise
            if not k:
                break
            data += k
    finally:
        s.close()
    sep = data.find(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.\d (\d+)", data)
    if sep < 0 or not m:
        raise IOError(f"no HTTP response ({len(data)} bytes)")
    head, body = data[:sep].decode("latin-1"), data[sep + 4:]
    if "chunked" in head.lower():
        out, i = b"", 0
        while i < len(body):
            j = body.find(b"\r\n", i)
            if j < 0:
                break
            n = int(body[i:j].split(b";")[0], 16)
            if n == 0:
                break
            out += body[j + 2:j + 2 + n]
            i = j + 4 + n
        body = out
    return int(m.group(1)), head, body


CHAT = {"messages": [{"role": "user", "content": "Who are you?"}], "max_tokens": 12}


def valid_one(port, rng):
    kind = rng.choice(["chat", "chat_stream", "completions", "anthropic", "health", "models",
                       "metrics"])
    if kind == "chat":
        st, _, b = request(port, "POST", "/v1/chat/completions", json.dumps(CHAT))
        ok = st == 200 and json.loads(b)["choices"][0]["message"] is not None
    elif kind == "chat_stream":
        st, _, b = request(port, "POST", "/v1/chat/completions", json.dumps({**CHAT, "stream": True}))
        ok = st == 200 and b.rstrip().endswith(b"data: [DONE]")
    elif kind == "completions":
        st, _, b = request(port, "POST", "/v1/completions",
                           json.dumps({"prompt": "In the beginning", "max_tokens": 8}))
        ok = st == 200 and "text" in json.loads(b)["choices"][0]
    elif kind == "anthropic":
        st, _, b = request(port, "POST", "/v1/messages",
                           json.dumps({"max_tokens": 8,
                                       "messages": [{"role": "user", "content": "Hi"}]}))
        ok = st == 200 and json.loads(b)["type"] == "message"
    elif kind == "health":
        st, _, b = request(port, "GET", "/health")
        ok = st == 200 and json.loads(b)["status"] == "ok"
    elif kind == "models":
        st, _, b = request(port, "GET", "/v1/models")
        ok = st == 200 and json.loads(b)["data"]
    else:
        st, _, b = request(port, "GET", "/metrics")
        ok = st == 200 and b"lumen_requests_total" in b
    return kind, ok, st


MALFORMED = [
    ("POST", "/v1/chat/completions", b'{"messages":'),
    ("POST", "/v1/chat/completions", b'{"messages":[{"role":"wizard","content":"x"}]}'),
    ("POST", "/v1/chat/completions", b'{"messages":[{"role":"user","content":5}]}'),
    ("POST", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"\xe2\x28\xa1"}]}'),
    ("POST", "/v1/chat/completions",
     b'{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":[]}}'),
    ("POST", "/v1/chat/completions", b'{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}'),
    ("POST", "/v1/completions", b'{"prompt":[1,-2]}'),
    ("POST", "/v1/messages", b'{"messages":[]}'),
    ("GET", "/v1/chat/completions", None),
    ("DELETE", "/v1/models", None),
    ("GET", "/nope", None),
]


def malformed_one(port, rng):
    if rng.random() < 0.1:  # over the body cap
        st, _, _ = request(port, "POST", "/v1/chat/completions", b" " * (9 << 20))
        return "too_large", st == 413, st
    m, p, b = rng.choice(MALFORMED)
    st, _, body = request(port, m, p, b)
    ok = 400 <= st < 500 and b"error" in body
    return "malformed", ok, st


def abandoned_one(port, rng):
    kind = rng.choice(["stream", "headers", "body", "nonstream"])
    s = socket.create_connection((HOST, port), timeout=10)
    try:
        if kind == "stream":
            b = json.dumps({**CHAT, "max_tokens": 64, "stream": True}).encode()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                      + str(len(b)).encode() + b"\r\n\r\n" + b)
            s.recv(256)
        elif kind == "headers":
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        elif kind == "body":
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                      b"\r\n{\"messages\":[")
        else:
            b = json.dumps({**CHAT, "max_tokens": 64}).encode()
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                      + str(len(b)).encode() + b"\r\n\r\n" + b)
            time.sleep(0.05)
    finally:
        s.close()
    return kind


def worker(fn, kind, port, stats, deadline, seed):
    rng = random.Random(seed)
    while time.time() < deadline:
        try:
            if kind == "abandoned":
                stats.ok("abandoned_" + fn(port, rng))
                time.sleep(0.05)
                continue
            k, ok, st = fn(port, rng)
            if ok:
                stats.ok(k)
            else:
                stats.bad(k, f"status {st}")
            if kind == "malformed":
                time.sleep(0.01)  # valid traffic keeps most of the server
        except Exception as e:  # a valid request that is not answered is a failure
            stats.bad(kind, repr(e))


def dripper(port, n, deadline, stats):
    socks = []
    while time.time() < deadline:
        while len(socks) < n and time.time() < deadline:
            try:
                s = socket.create_connection((HOST, port), timeout=2)
                s.setblocking(False)
                s.send(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                socks.append(s)
                stats.ok("slow_opened")
            except OSError:
                time.sleep(0.01)
        t = time.time()
        for s in list(socks):
            try:
                if s.recv(4096) == b"":
                    raise ConnectionResetError
            except BlockingIOError:
                pass
            except OSError:
                socks.remove(s)
                s.close()
                stats.ok("slow_dropped")
                continue
            try:
                s.send(b"X-Slow: 1\r\n")
            except OSError:
                pass
        time.sleep(max(0.0, 1.0 - (time.time() - t)))
    for s in socks:
        s.close()


def sample(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lumen", default="build/lumen")
    ap.add_argument("--model", default="models/lumen-tiny-kjv")
    ap.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 2)))
    ap.add_argument("--valid", type=int, default=4, help="threads of valid requests")
    ap.add_argument("--malformed", type=int, default=2)
    ap.add_argument("--abandoned", type=int, default=2)
    ap.add_argument("--slow", type=int, default=100, help="trickling connections")
    ap.add_argument("--max-connections", type=int, default=0)
    a = ap.parse_args()
    args = [a.lumen, "serve", a.model, "--host", HOST, "--port", "0", "--parallel", "4",
            "--timeout", "60"]
    if a.max_connections:
        args += ["--max-connections", str(a.max_connections)]
    srv = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = None
    t0 = time.time()
    while time.time() - t0 < 60:
        line = srv.stdout.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line or "")
        if m:
            port = int(m.group(1))
            break
        if not line and srv.poll() is not None:
            break
    if not port:
        log("the server did not start")
        srv.kill()
        return 1
    stats = Stats()
    deadline = time.time() + a.minutes * 60
    threads = [threading.Thread(target=dripper, args=(port, a.slow, deadline, stats))]
    for i in range(a.valid):
        threads.append(threading.Thread(target=worker, args=(valid_one, "valid", port, stats,
                                                              deadline, i)))
    for i in range(a.malformed):
        threads.append(threading.Thread(target=worker, args=(malformed_one, "malformed", port,
                                                              stats, deadline, 100 + i)))
    for i in range(a.abandoned):
        threads.append(threading.Thread(target=worker, args=(abandoned_one, "abandoned", port,
                                                              stats, deadline, 200 + i)))
    for t in threads:
        t.start()
    base = None
    peak_rss = peak_fd = 0
    warm = time.time() + min(10.0, a.minutes * 60 / 4)
    while any(t.is_alive() for t in threads):
        time.sleep(2)
        rss, fds = sample(srv.pid)
        if time.time() >= warm and base is None:
            base = (rss, fds)
        peak_rss, peak_fd = max(peak_rss, rss), max(peak_fd, fds)
    for t in threads:
        t.join()
    time.sleep(12)  # trickling connections reach their deadline; abandoned ones are reaped
    rss, fds = sample(srv.pid)
    srv.send_signal(signal.SIGTERM)
    try:
        rc = srv.wait(30)
    except subprocess.TimeoutExpired:
        srv.kill()
        rc = -1
    base = base or (rss, fds)
    log(f"{a.minutes:g} min: " + ", ".join(f"{k} {v}" for k, v in sorted(stats.n.items())))
    log(f"RSS: {base[0]} MB after warm-up, peak {peak_rss} MB, {rss} MB at the end; "
        f"descriptors: {base[1]} after warm-up, peak {peak_fd}, {fds} at the end; exit {rc}")
    bad = list(stats.fail)
    if rss > base[0] + 64:
        bad.append(f"RSS grew by {rss - base[0]} MB")
    if peak_rss > base[0] + 256:
        bad.append(f"peak RSS {peak_rss - base[0]} MB above the warm-up level")
    if fds > base[1] + 16:
        bad.append(f"descriptors grew by {fds - base[1]}")
    if rc != 0:
        bad.append(f"the server exited {rc} on SIGTERM")
    if not stats.n.get("chat") or not stats.n.get("health"):
        bad.append("no valid request was answered")
    for b in bad:
        log("FAIL:", b)
    if not bad:
        log("ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

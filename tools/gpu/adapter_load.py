#!/usr/bin/env python3
"""tools/gpu/adapter_load.py PORT ADAPTER_DIR — against a running `lumen serve`: one stream decodes
while POST /v1/adapters mounts ADAPTER_DIR; prints the load time and the stream's token gaps
(median, and the longest during the load). Standard library only."""
import json, sys, threading, time, urllib.request
port, adir = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}"
times = []
def stream():
    body = json.dumps({"prompt": "In the beginning", "max_tokens": 600, "ignore_eos": True,
                       "temperature": 0, "stream": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            if line.startswith(b"data: {"):
                times.append(time.monotonic())
t = threading.Thread(target=stream); t.start()
while len(times) < 100: time.sleep(0.01)
t0 = time.monotonic()
req = urllib.request.Request(base + "/v1/adapters", json.dumps({"name": "hot", "path": adir}).encode(),
                             {"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=300) as r:
    info = json.loads(r.read())
t1 = time.monotonic()
t.join()
gaps = [b - a for a, b in zip(times, times[1:])]
during = [b - a for a, b in zip(times, times[1:]) if t0 - 0.05 <= b <= t1 + 0.05]
gs = sorted(gaps)
print(f"adapter: {info.get('bytes',0)/1e6:.1f} MB, {info.get('modules')} modules, rank {info.get('max_rank')}; "
      f"POST answered in {1e3*(t1-t0):.0f} ms (load_ms {info.get('load_ms')}, mount_ms {info.get('mount_ms')})")
print(f"stream: {len(times)} tokens, median gap {1e3*gs[len(gs)//2]:.2f} ms, max gap {1e3*max(gaps):.2f} ms, "
      f"max gap during the load {1e3*max(during) if during else 0:.2f} ms")

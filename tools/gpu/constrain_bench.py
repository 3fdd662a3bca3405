#!/usr/bin/env python3
"""constrain_bench.py — the cost of constrained decoding at many concurrent streams.

Against a running `lumen serve` (e.g. the synthetic E4B of tools/gpu/serve_bench.sh on the H200
GPU machine), sends CLIENTS concurrent chat requests in alternating rounds: unconstrained, then
each with the same JSON schema (response_format json_schema), both at temperature 1 with
max_tokens N, and prints per round the aggregate tok/s, the engine's ms per step and rows per
step, and the server's /stats constraint counters (host time of the masks per token, its share
of the busy time, and the time steps waited for masks filled during their forward).

Like for like (--long, the default): the schema asks for an array of at least 60 objects, so no
answer can finish within 128 tokens, and the unconstrained requests set ignore_eos: every round
runs CLIENTS rows in every step, and the ms per step compare directly.

    python3 tools/gpu/constrain_bench.py --port 8080 --clients 64 --tokens 128 --rounds 3
"""
import argparse, json, threading, time, urllib.request

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8},
        "kind": {"enum": ["person", "place", "thing"]},
        "notes": {"type": "string"},
    },
    "required": ["name", "age", "tags", "kind", "notes"],
    "additionalProperties": False,
}

LONG_SCHEMA = {
    "type": "object",
    "properties": {"items": {"type": "array", "minItems": 60, "items": {
        "type": "object",
        "properties": {"kind": {"enum": ["person", "place", "thing"]},
                       "n": {"type": "integer", "minimum": 0, "maximum": 999},
                       "label": {"type": "string", "maxLength": 40}},
        "required": ["kind", "n", "label"], "additionalProperties": False}}},
    "required": ["items"],
    "additionalProperties": False,
}


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def stats(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=60) as r:
        return json.loads(r.read())


def run(port, clients, tokens, constrained, long=True):
    out = [None] * clients

    def one(i):
        body = {"messages": [{"role": "user", "content": f"Describe item {i} as JSON."}],
                "max_tokens": tokens, "temperature": 1.0, "seed": i}
        if constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "item", "schema": LONG_SCHEMA if long else SCHEMA}}
        elif long:
            body["ignore_eos"] = True
        out[i] = post(port, "/v1/chat/completions", body)

    before = stats(port)
    t0 = time.time()
    th = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    dt = time.time() - t0
    after = stats(port)
    gen = sum(o["usage"]["completion_tokens"] for o in out if o)
    valid = 0
    for o in out:
        try:
            if o["choices"][0]["finish_reason"] == "stop":
                json.loads(o["choices"][0]["message"]["content"])
                valid += 1
        except Exception:
            pass
    return gen, dt, valid, before, after


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--short", action="store_true",
                    help="the five-property schema, no ignore_eos (answers end at their own time)")
    a = ap.parse_args()
    run(a.port, min(a.clients, 8), 8, False)  # warm up the graphs and the caches
    run(a.port, min(a.clients, 8), 8, True, not a.short)
    for constrained in (False, True) * a.rounds:
        gen, dt, valid, b, e = run(a.port, a.clients, a.tokens, constrained, not a.short)
        c0, c1 = b.get("batch", {}).get("constraint", {}), e.get("batch", {}).get("constraint", {})
        busy = e["batch"]["busy_s"] - b["batch"]["busy_s"]
        steps = e["batch"]["steps"] - b["batch"]["steps"]
        rows = e["batch"]["step_rows"] - b["batch"]["step_rows"]
        cs = (c1.get("seconds", 0) - c0.get("seconds", 0)) if c1 else 0
        ct = (c1.get("tokens", 0) - c0.get("tokens", 0)) if c1 else 0
        print(json.dumps({"constrained": constrained, "clients": a.clients, "tokens": gen,
                          "seconds": round(dt, 3), "tok_s": round(gen / dt, 1),
                          "busy_s": round(busy, 3), "steps": steps,
                          "ms_per_step": round(1e3 * busy / steps, 2) if steps else None,
                          "rows_per_step": round(rows / steps, 1) if steps else None, "constraint_s": round(cs, 4),
                          "constraint_tokens": ct,
                          "constraint_share": round(cs / busy, 4) if busy > 0 else None,
                          "us_per_token": round(1e6 * cs / ct, 2) if ct else None,
                          "wait_s": round(c1.get("wait_seconds", 0) - c0.get("wait_seconds", 0), 4)
                          if c1 else None,
                          "valid_json_of_stopped": valid if constrained else None}), flush=True)


if __name__ == "__main__":
    main()

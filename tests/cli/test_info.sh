#!/usr/bin/env bash
# test_info.sh — `lumen info` on the embedded model: the cache plan, and with --backend the
# memory a session takes (weights, KV for --ctx, workspace) in text and JSON; on a machine
# with a GPU the CUDA report adds the device's free memory. Bad flags are refused.
set -euo pipefail
LUMEN=${LUMEN_BIN:?}
M=models/lumen-tiny-kjv
fail() { echo "FAIL: $*"; exit 1; }

out=$("$LUMEN" info "$M")
grep -q "cache plan:" <<<"$out" || fail "no cache plan: $out"
out=$("$LUMEN" info "$M" --backend cpu --ctx 2048)
grep -q "memory on cpu (one sequence, 2048 tokens" <<<"$out" || fail "no memory report: $out"
json=$("$LUMEN" info "$M" --backend cpu --ctx 2048 --json)
python3 - "$json" <<'PY'
import json, sys
m = json.loads(sys.argv[1])["memory"]
assert m["backend"] == "cpu" and m["context"] == 2048, m
assert m["weights"] > 20e6 and m["kv"] > 0 and m["workspace"] > 0, m
PY
if "$LUMEN" info "$M" --backend tpu >/dev/null 2>&1; then fail "--backend tpu accepted"; fi
if "$LUMEN" info "$M" --ctx 0 >/dev/null 2>&1; then fail "--ctx 0 accepted"; fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  out=$("$LUMEN" info "$M" --backend cuda --ctx 4096) || fail "cuda report failed: $out"
  grep -q "device free" <<<"$out" || fail "no device memory in: $out"
fi
echo "test_info: ok"

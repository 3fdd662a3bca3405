#!/usr/bin/env bash
# test_structured_target.sh — the structured-output target of the embedded model (issue: "the grammar
# must carry it"): tests/server/structured_target.mjs against `lumen serve --parallel 8` — 200 random
# bounded schemas from a seeded generator at temperature 1 (every finished answer parses and validates,
# >= 95% finish within max_tokens 600) and 60 requests of random tools (every call names an offered tool
# and validates) — and prints the numbers, then the constraints' share of the engine's busy time from
# /stats. Installs npm ajv@8.17.1 (with openai, zod) into its own $LM_BUILD_DIR/node-structured-target:
# test_structured_output.sh runs at the same time under ctest -j, and two npm installs into one prefix
# make one of them fail. Skipped (77) without node/npm or the registry.
set -euo pipefail
: "${LUMEN_BIN:?LUMEN_BIN is not set}" "${LM_BUILD_DIR:?LM_BUILD_DIR is not set}"
fail() { echo "test_structured_target: $*" >&2; exit 1; }
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W="$LM_BUILD_DIR/tmp/test_structured_target"
rm -rf "$W" && mkdir -p "$W"

lm_need_node test_structured_target
ND="$LM_BUILD_DIR/node-structured-target"
lm_npm_install "$ND" openai@6.30.1 zod@4.1.12 ajv@8.17.1 >/dev/null 2>&1 \
  || { echo "test_structured_target: npm install failed (no registry?)" >&2; exit 77; }

PID=
cleanup() { kill "$PID" 2>/dev/null || true; }
trap cleanup EXIT
lm_serve_start "$W/out" "$W/log" 30 "$ROOT/models/lumen-tiny-kjv" --host 127.0.0.1 --port 0 --parallel 8 \
  --timeout 300
rc=0
NODE_DIR="$ND" timeout 600 node "$ROOT/tests/server/structured_target.mjs" "http://127.0.0.1:$PORT" \
  ${STRUCTURED_SEED:-} || rc=$?
python3 - "$(curl -s "http://127.0.0.1:$PORT/stats")" <<'PY'
import json, sys
b = json.loads(sys.argv[1])["batch"]
c = b["constraint"]
print(f"  constraints: {c['tokens']} tokens, {c['us_per_token']:.1f} us per token, "
      f"{100 * c['share_of_busy']:.2f}% of the engine's busy time ({b['busy_s']:.1f} s, "
      f"{b['mean_rows_per_step']:.1f} rows per step)")
PY
[ $rc -eq 0 ] || fail "the target was missed (server log: $(tail -3 "$W/log"))"
lm_serve_stop TERM || true
trap - EXIT
echo "test_structured_target: ok"

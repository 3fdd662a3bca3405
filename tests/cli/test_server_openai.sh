#!/usr/bin/env bash
# test_server_openai.sh — conformance with the official OpenAI Node client: installs npm openai@6.30.1
# into $LM_BUILD_DIR/node-openai (never committed), starts `lumen serve` over the embedded model on
# 127.0.0.1 with an ephemeral port, and runs tests/server/conformance.mjs against it (chat, streaming,
# tool calls, completions, errors, model_not_found, n = 2, the Responses API plain / streamed / with
# function calls and previous_response_id, an aborted stream). Also checks the verb's --help, its
# startup lines, a bad flag, and a clean exit on SIGTERM. Skipped (77) without node/npm or the registry.
set -euo pipefail
: "${LUMEN_BIN:?LUMEN_BIN is not set}" "${LM_BUILD_DIR:?LM_BUILD_DIR is not set}"
fail() { echo "test_server_openai: $*" >&2; exit 1; }
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W="$LM_BUILD_DIR/tmp/test_server_openai"
rm -rf "$W" && mkdir -p "$W"

# ---- the verb itself ------------------------------------------------------------------------------
help=$("$LUMEN_BIN" serve --help)
for flag in --model --host --port --parallel --ctx --memory-budget --api-key --kv-quant --backend --max-tokens \
            --temp --top-p --top-k --queue-size --timeout; do
  grep -q -- "$flag" <<<"$help" || fail "serve --help does not document $flag"
done
rc=0; "$LUMEN_BIN" serve "$ROOT/models/lumen-tiny-kjv" --parallel zero >/dev/null 2>"$W/err" || rc=$?
[ $rc -eq 2 ] || fail "a bad --parallel exited $rc, want 2"
rc=0; "$LUMEN_BIN" serve "$W/no-such-model" --port 0 >/dev/null 2>"$W/err" || rc=$?
[ $rc -eq 1 ] || fail "a missing model directory exited $rc, want 1"

# ---- the server -----------------------------------------------------------------------------------
PID=
cleanup() { kill "$PID" 2>/dev/null || true; }
trap cleanup EXIT
lm_serve_start "$W/out" "$W/log" 30 "$ROOT/models/lumen-tiny-kjv" --host 127.0.0.1 --port 0 --parallel 4 \
  --timeout 120
grep -q 'model lumen-tiny-kjv (gemma4' "$W/out" || fail "the startup lines do not say what was loaded: $(cat "$W/out")"
[ "$(curl -s "http://127.0.0.1:$PORT/health")" = '{"status":"ok"}' ] || fail "/health"

lm_need_node test_server_openai "the conformance part"
OD="$LM_BUILD_DIR/node-openai"
lm_npm_install "$OD" openai@6.30.1 >/dev/null 2>&1 \
  || { echo "test_server_openai: npm install openai@6.30.1 failed (no registry?)" >&2; exit 77; }
OPENAI_DIR="$OD" timeout 180 node "$ROOT/tests/server/conformance.mjs" "http://127.0.0.1:$PORT/v1" \
  || fail "the OpenAI client conformance test failed (server log: $(tail -5 "$W/log"))"

# ---- a clean shutdown -----------------------------------------------------------------------------
rc=0; lm_serve_stop TERM || rc=$?
trap - EXIT
[ $rc -eq 0 ] || fail "the server exited $rc on SIGTERM"
echo "test_server_openai: ok"

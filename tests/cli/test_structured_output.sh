#!/usr/bin/env bash
# test_structured_output.sh — structured output through `lumen serve` with the official OpenAI Node
# client and zod: installs npm openai@6.30.1, zod@4.1.12 and ajv@8.17.1 into $LM_BUILD_DIR/node-structured
# (never committed; test_structured_target.sh has its own), starts the server over the embedded model on
# 127.0.0.1 with an ephemeral port and runs tests/server/structured.mjs against it (zodResponseFormat
# plain and streamed, a strict zodFunction with tool_choice required, json_object, a GBNF grammar,
# tool_choice none, the Anthropic endpoint, the 400s). Also checks that `run` follows --json-schema and
# --grammar and refuses a bad schema before generating. Skipped (77) without node/npm or the registry.
set -euo pipefail
: "${LUMEN_BIN:?LUMEN_BIN is not set}" "${LM_BUILD_DIR:?LM_BUILD_DIR is not set}"
fail() { echo "test_structured_output: $*" >&2; exit 1; }
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL="$ROOT/models/lumen-tiny-kjv"
W="$LM_BUILD_DIR/tmp/test_structured_output"
rm -rf "$W" && mkdir -p "$W"

# ---- the command line ------------------------------------------------------------------------------
for verb in run generate; do
  help=$("$LUMEN_BIN" $verb --help)
  for flag in --json-schema --grammar; do
    grep -q -- "$flag" <<<"$help" || fail "$verb --help does not document $flag"
  done
done
cat >"$W/schema.json" <<'JSON'
{"type": "object", "properties": {"book": {"type": "string", "enum": ["Genesis", "John"]},
 "chapter": {"type": "integer", "minimum": 1, "maximum": 50}}, "required": ["book", "chapter"],
 "additionalProperties": false}
JSON
out=$("$LUMEN_BIN" run "$MODEL" "Name a book." --json-schema "$W/schema.json" --temp 1 --seed 4 \
  --max-tokens 200 2>"$W/err") || fail "run --json-schema failed: $(cat "$W/err")"
python3 - "$out" <<'PY' || fail "run --json-schema printed what does not validate: $out"
import json, sys
v = json.loads(sys.argv[1])
assert set(v) == {"book", "chapter"} and v["book"] in ("Genesis", "John") and 1 <= v["chapter"] <= 50
PY
printf 'root ::= " and " ("God" | "Moses") " said"\n' >"$W/g.gbnf"
out=$("$LUMEN_BIN" run "$MODEL" "In the beginning" --raw --grammar "$W/g.gbnf" --temp 1 2>"$W/err") \
  || fail "run --grammar failed: $(cat "$W/err")"
[[ "$out" =~ ^\ and\ (God|Moses)\ said$ ]] || fail "run --grammar printed '$out'"
echo '{"type": "object", "patternProperties": {}}' >"$W/bad.json"
rc=0; "$LUMEN_BIN" run "$MODEL" "x" --json-schema "$W/bad.json" >"$W/out" 2>"$W/err" || rc=$?
[ $rc -eq 1 ] || fail "an unsupported schema exited $rc, want 1"
grep -q 'json_schema: .*patternProperties' "$W/err" || fail "the error does not name the keyword: $(cat "$W/err")"
[ ! -s "$W/out" ] || fail "an unsupported schema printed an answer"
rc=0; "$LUMEN_BIN" run "$MODEL" "x" --json-schema "$W/missing.json" >/dev/null 2>"$W/err" || rc=$?
[ $rc -eq 1 ] && grep -q -- '--json-schema' "$W/err" || fail "a missing schema file: rc $rc, $(cat "$W/err")"

# ---- the server ------------------------------------------------------------------------------------
lm_need_node test_structured_output "the client part"
ND="$LM_BUILD_DIR/node-structured"
lm_npm_install "$ND" openai@6.30.1 zod@4.1.12 ajv@8.17.1 >/dev/null 2>&1 \
  || { echo "test_structured_output: npm install failed (no registry?)" >&2; exit 77; }

PID=
cleanup() { kill "$PID" 2>/dev/null || true; }
trap cleanup EXIT
lm_serve_start "$W/out" "$W/log" 30 "$MODEL" --host 127.0.0.1 --port 0 --parallel 4 --timeout 120
NODE_DIR="$ND" timeout 300 node "$ROOT/tests/server/structured.mjs" "http://127.0.0.1:$PORT/v1" \
  || fail "the structured-output client test failed (server log: $(tail -5 "$W/log"))"
rc=0; lm_serve_stop TERM || rc=$?
trap - EXIT
[ $rc -eq 0 ] || fail "the server exited $rc on SIGTERM"
echo "test_structured_output: ok"

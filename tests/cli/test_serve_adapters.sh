#!/usr/bin/env bash
# test_serve_adapters.sh — LoRA adapters in `lumen serve`, as curl sees them: two PEFT adapters for
# the embedded model (tests/util/make_lora_adapter.py) mounted with POST /v1/adapters and listed by
# GET /v1/adapters and /v1/models (BASE:NAME); a greedy completion with "adapter": NAME differs from
# the base's, model BASE:NAME gives the same as the field, weight 0 (list form) gives the base's, a
# stack with a weight-0 second adapter gives the first alone; chat, Responses, Messages and
# count_tokens take the field; the errors: an unknown adapter (404, OpenAI and Anthropic shapes), an
# unknown base, a bad name, too many adapters, the field and the model id disagreeing, a duplicate
# name (409), a missing directory (404) or one that is no adapter (400); DELETE unmounts (200, then
# 404 for requests naming it); a clean exit on SIGTERM. CPU backend, 127.0.0.1, an ephemeral port.
set -euo pipefail
: "${LUMEN_BIN:?LUMEN_BIN is not set}"
M=models/lumen-tiny-kjv
ID=lumen-tiny-kjv
D=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT
fail() { echo "test_serve_adapters: $*" >&2; exit 1; }
command -v curl >/dev/null || { echo "test_serve_adapters: curl missing" >&2; exit 77; }
command -v python3 >/dev/null || { echo "test_serve_adapters: python3 missing" >&2; exit 77; }
. "$(dirname "$0")/lib.sh"

python3 tests/util/make_lora_adapter.py "$M" "$D/kv" || fail "writing the adapter failed"
python3 tests/util/make_lora_adapter.py "$M" "$D/other" --seed 2 --modules q_proj,o_proj ||
  fail "writing the second adapter failed"
mkdir "$D/empty"

# no prompt cache: every request prefills its whole prompt, so equal choices give equal logprobs
lm_serve_start "$D/out" "$D/log" 30 "$M" --host 127.0.0.1 --port 0 --parallel 2 --backend cpu \
  --prompt-cache 0
B="http://127.0.0.1:$PORT"

# call METHOD PATH [BODY]: the body into $D/b, the status on stdout
call() {
  local args=(-s -o "$D/b" -w '%{http_code}' -X "$1" "$B$2")
  [ $# -gt 2 ] && args+=(-H 'content-type: application/json' -d "$3")
  curl "${args[@]}"
}
# expect STATUS METHOD PATH [BODY]: call, failing on another status
expect() {
  local want=$1 got
  shift
  got=$(call "$@")
  [ "$got" = "$want" ] || fail "$1 $2 ${3:-}: $got, want $want: $(cat "$D/b")"
}
# js EXPR: a Python expression over d, the last answer's JSON
js() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); v=($1); print(v)" "$D/b"; }
# gen [FIELDS]: a greedy completion with FIELDS added; prints its text, then its tokens' logprobs
# (the same choice must give both again; weight 0 only the text, the arithmetic may differ)
P='"prompt":"In the beginning God created","temperature":0,"max_tokens":8,"ignore_eos":true,"logprobs":0'
gen() {
  expect 200 POST /v1/completions "{$P${1:+,$1}}"
  js 'repr(d["choices"][0]["text"]) + "\n" + repr(d["choices"][0]["logprobs"]["token_logprobs"])'
}
text() { head -1 <<<"$1"; }

# ---- mounting and listing ---------------------------------------------------------------------------
expect 200 GET /v1/adapters
[ "$(js 'd["object"], len(d["data"])')" = "('list', 0)" ] || fail "adapters before any: $(cat "$D/b")"
expect 200 POST /v1/adapters "{\"name\":\"kv\",\"path\":\"$D/kv\"}"
[ "$(js 'd["object"], d["name"], d["format"], d["max_rank"], d["model"]')" = \
  "('adapter', 'kv', 'peft', 4, '$ID:kv')" ] || fail "the mounted adapter: $(cat "$D/b")"
js 'd["modules"] > 0 and d["bytes"] > 0 and d["load_ms"] >= 0 and d["path"].endswith("/kv")' | grep -q True ||
  fail "the adapter's sizes: $(cat "$D/b")"
expect 200 POST /v1/adapters "{\"name\":\"other\",\"adapter_path\":\"$D/other\"}"
expect 200 GET /v1/adapters
[ "$(js '[a["name"] for a in d["data"]]')" = "['kv', 'other']" ] || fail "GET /v1/adapters: $(cat "$D/b")"
expect 200 GET /v1/adapters/kv
[ "$(js 'd["name"]')" = kv ] || fail "GET /v1/adapters/kv: $(cat "$D/b")"
expect 200 GET /v1/models
[ "$(js '[m["id"] for m in d["data"]]')" = "['$ID', '$ID:kv', '$ID:other']" ] ||
  fail "/v1/models: $(cat "$D/b")"
expect 200 GET "/v1/models/$ID:kv"
[ "$(js 'd["id"], d["parent"]')" = "('$ID:kv', '$ID')" ] || fail "/v1/models/$ID:kv: $(cat "$D/b")"

# ---- choosing them ----------------------------------------------------------------------------------
base=$(gen)
ad=$(gen '"adapter":"kv"')
[ "$(text "$ad")" != "$(text "$base")" ] || fail "the adapter changes nothing: $ad"
[ "$(gen "\"model\":\"$ID:kv\"")" = "$ad" ] || fail "model $ID:kv differs from adapter kv"
[ "$(gen "\"model\":\"$ID:kv\",\"adapter\":[\"kv\"]")" = "$ad" ] || fail "model and adapter both kv"
[ "$(gen '"adapter":[{"name":"kv","weight":1}]')" = "$ad" ] || fail "the list form at weight 1"
[ "$(text "$(gen '"adapter":[{"name":"kv","weight":0}]')")" = "$(text "$base")" ] ||
  fail "adapter kv at weight 0 is not the base"
[ "$(gen '"adapter":[]')" = "$base" ] || fail "adapter [] is not the base"
stack=$(gen '"adapter":"kv+other"')
[ "$(text "$stack")" != "$(text "$ad")" ] || fail "stacking a second adapter changes nothing: $stack"
[ "$(gen "\"model\":\"$ID:kv+other\"")" = "$stack" ] || fail "model $ID:kv+other differs from kv+other"
[ "$(text "$(gen '"adapter":["kv",{"name":"other","weight":0}]')")" = "$(text "$ad")" ] ||
  fail "kv with other at weight 0 is not kv"

CHAT='"messages":[{"role":"user","content":"Who are you?"}],"temperature":0,"max_tokens":6'
expect 200 POST /v1/chat/completions "{$CHAT,\"adapter\":\"kv\"}"
expect 200 POST /v1/chat/completions "{$CHAT,\"model\":\"$ID:kv\",\"stream\":true}"
grep -q 'data: \[DONE\]' "$D/b" || fail "a stream with an adapter did not end: $(cat "$D/b")"
expect 200 POST /v1/responses '{"input":"Who are you?","max_output_tokens":6,"adapter":"other"}'
expect 200 POST /v1/messages '{"max_tokens":6,"adapter":"kv","messages":[{"role":"user","content":"Hi"}]}'
expect 200 POST /v1/messages/count_tokens '{"messages":[{"role":"user","content":"Who are you?"}]}'
n=$(js 'd["input_tokens"]')
expect 200 POST /v1/messages/count_tokens \
  "{\"model\":\"$ID:other\",\"messages\":[{\"role\":\"user\",\"content\":\"Who are you?\"}]}"
[ "$(js 'd["input_tokens"]')" = "$n" ] || fail "count_tokens with an adapter: $(cat "$D/b")"

# ---- errors -----------------------------------------------------------------------------------------
expect 404 POST /v1/completions "{$P,\"adapter\":\"nope\"}"
[ "$(js 'd["error"]["code"], d["error"]["param"]')" = "('adapter_not_found', 'adapter')" ] ||
  fail "an unknown adapter: $(cat "$D/b")"
grep -q nope "$D/b" || fail "the 404 does not name the adapter: $(cat "$D/b")"
expect 404 POST /v1/completions "{$P,\"model\":\"$ID:nope\"}"
[ "$(js 'd["error"]["code"]')" = model_not_found ] || fail "an unknown BASE:ADAPTER: $(cat "$D/b")"
expect 404 POST /v1/completions "{$P,\"model\":\"gpt-4o:kv\"}"
[ "$(js 'd["error"]["code"]')" = model_not_found ] || fail "an unknown base: $(cat "$D/b")"
expect 404 POST /v1/messages '{"max_tokens":6,"adapter":"nope","messages":[{"role":"user","content":"Hi"}]}'
[ "$(js 'd["type"], d["error"]["type"]')" = "('error', 'not_found_error')" ] ||
  fail "an unknown adapter (Anthropic): $(cat "$D/b")"
expect 400 POST /v1/completions "{$P,\"adapter\":\"a b\"}"
expect 400 POST /v1/completions "{$P,\"adapter\":42}"
expect 400 POST /v1/completions "{$P,\"adapter\":[{\"name\":\"kv\",\"weight\":\"x\"}]}"
expect 400 POST /v1/completions "{$P,\"adapter\":\"kv+kv+kv+kv+kv+kv+kv+kv+kv\"}"
grep -q 'at most 8' "$D/b" || fail "too many adapters: $(cat "$D/b")"
expect 400 POST /v1/completions "{$P,\"model\":\"$ID:kv\",\"adapter\":\"other\"}"
[ "$(js 'd["error"]["param"]')" = adapter ] || fail "model and adapter disagreeing: $(cat "$D/b")"
expect 409 POST /v1/adapters "{\"name\":\"kv\",\"path\":\"$D/other\"}"
expect 404 POST /v1/adapters "{\"name\":\"gone\",\"path\":\"$D/no-such-dir\"}"
expect 400 POST /v1/adapters "{\"name\":\"empty\",\"path\":\"$D/empty\"}"
expect 400 POST /v1/adapters "{\"name\":\"bad name\",\"path\":\"$D/kv\"}"
expect 400 POST /v1/adapters "{\"path\":\"$D/kv\"}"
expect 400 POST /v1/adapters '{"name":"x"}'
expect 200 GET /v1/adapters
[ "$(js '[a["name"] for a in d["data"]]')" = "['kv', 'other']" ] || fail "a failed load mounted something"

# ---- unmounting -------------------------------------------------------------------------------------
expect 200 DELETE /v1/adapters/kv
[ "$(js 'd["object"], d["name"], d["deleted"]')" = "('adapter', 'kv', True)" ] || fail "DELETE: $(cat "$D/b")"
expect 404 DELETE /v1/adapters/kv
expect 404 GET /v1/adapters/kv
expect 404 POST /v1/completions "{$P,\"adapter\":\"kv\"}"
expect 404 GET "/v1/models/$ID:kv"
expect 200 GET /v1/models
[ "$(js '[m["id"] for m in d["data"]]')" = "['$ID', '$ID:other']" ] || fail "/v1/models after DELETE"
[ "$(gen)" = "$base" ] || fail "the base changed after mounting and unmounting"
expect 200 POST /v1/adapters "{\"name\":\"kv\",\"dir\":\"$D/kv\"}" # the name is free again
[ "$(gen '"adapter":"kv"')" = "$ad" ] || fail "the adapter mounted again answers differently"

rc=0; lm_serve_stop TERM || rc=$?
[ $rc -eq 0 ] || fail "the server exited $rc on SIGTERM"
echo "test_serve_adapters: ok"

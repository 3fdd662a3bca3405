#!/usr/bin/env bash
# test_serve_http.sh — `lumen serve` as curl sees it: the served names (--served-model-name, --alias
# and --model-id, repeatable) listed and answered, another name a 404 model_not_found in the OpenAI
# and the Anthropic shapes; --cors preflights (no API key needed) and the CORS headers on answers,
# errors and streams; without --cors OPTIONS is 204 with no CORS headers; the request log
# (--log-requests: method, path, status, tokens, time) and no libmicrohttpd warning at startup;
# Anthropic-style count_tokens; a bad --cors refused. Servers on 127.0.0.1 with ephemeral ports.
set -euo pipefail
LUMEN=${LUMEN_BIN:?}
M=models/lumen-tiny-kjv
D=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT
fail() { echo "test_serve_http: $*" >&2; exit 1; }
command -v curl >/dev/null || { echo "test_serve_http: curl missing" >&2; exit 77; }
. "$(dirname "$0")/lib.sh"

start() { # start ARGS...: a server in the background, PORT and B set
  lm_serve_start "$D/out" "$D/log" 30 "$M" --host 127.0.0.1 --port 0 --parallel 2 "$@"
  B="http://127.0.0.1:$PORT"
}
stop() { lm_serve_stop || true; }
logged() { # logged REGEX: the request log gets a matching line (it is written as requests complete)
  for _ in $(seq 1 50); do grep -Eq "$1" "$D/log" && return 0; sleep 0.1; done
  fail "no log line matching '$1' in: $(cat "$D/log")"
}
CHAT='"messages":[{"role":"user","content":"Who are you?"}],"temperature":0,"max_tokens":30'

# ---- served names, the log, CORS with an API key ----------------------------------------------------
start --served-model-name kjv --alias bible --model-id holy --log-requests --api-key k \
  --cors 'http://app.example, http://localhost:3000'
A=(-H "Authorization: Bearer k")
if grep -Eqi 'MHD|microhttpd|EXTERNAL_LOGGER' "$D/log"; then fail "warnings at startup: $(cat "$D/log")"; fi
grep -q 'model kjv (gemma4' "$D/out" || fail "the banner does not name the first served id: $(cat "$D/out")"
grep -q 'also served as bible, holy, lumen-tiny-kjv' "$D/out" || fail "the banner lacks the other ids"
grep -q 'CORS: http://app.example, http://localhost:3000' "$D/out" || fail "the banner lacks the CORS origins"
ids=$(curl -s "${A[@]}" "$B/v1/models" | grep -o '"id":"[^"]*"' | tr '\n' ' ')
[ "$ids" = '"id":"kjv" "id":"bible" "id":"holy" "id":"lumen-tiny-kjv" ' ] || fail "/v1/models lists: $ids"
out=$(curl -s "${A[@]}" "$B/v1/chat/completions" -d "{\"model\":\"holy\",$CHAT}")
grep -q '"model":"holy"' <<<"$out" || fail "the model named is not echoed: $out"
grep -q '"content":"I am lumen-tiny-kjv' <<<"$out" || fail "chat: $out"
out=$(curl -s -w ' %{http_code}' "${A[@]}" "$B/v1/chat/completions" -d "{\"model\":\"gpt-4o\",$CHAT}")
grep -q '"code":"model_not_found".* 404$' <<<"$out" || fail "an unknown model: $out"
out=$(curl -s -w ' %{http_code}' -H 'x-api-key: k' -H 'anthropic-version: 2023-06-01' "$B/v1/messages" \
  -d '{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}')
grep -q '"type":"error","error":{"type":"not_found_error".* 404$' <<<"$out" || fail "an unknown Anthropic model: $out"
logged '^lumen: POST /v1/chat/completions 200 prompt=14 cached=[0-9]+ generated=[0-9]+ [0-9.]+s$'
logged '^lumen: POST /v1/chat/completions 404 [0-9.]+s$'

# Anthropic count_tokens
out=$(curl -s -H 'x-api-key: k' -H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' \
  "$B/v1/messages/count_tokens" -d '{"model":"kjv","messages":[{"role":"user","content":"Who are you?"}]}')
[ "$out" = '{"input_tokens":14}' ] || fail "count_tokens: $out"
logged '^lumen: POST /v1/messages/count_tokens 200 [0-9.]+s$'

# a preflight: no key, 204, the CORS headers
curl -s -D "$D/h" -o "$D/b" -X OPTIONS -H 'Origin: http://app.example' -H 'Access-Control-Request-Method: POST' \
  -H 'Access-Control-Request-Headers: authorization, content-type' "$B/v1/chat/completions"
head -1 "$D/h" | grep -q ' 204' || fail "preflight: $(cat "$D/h")"
grep -qi '^Access-Control-Allow-Origin: http://app.example' "$D/h" || fail "preflight origin: $(cat "$D/h")"
grep -qi '^Access-Control-Allow-Methods: .*POST' "$D/h" || fail "preflight methods"
grep -qi '^Access-Control-Allow-Headers: Authorization, Content-Type, x-api-key, anthropic-version' "$D/h" ||
  fail "preflight headers: $(cat "$D/h")"
grep -qi '^Access-Control-Max-Age: ' "$D/h" || fail "preflight max-age"
[ ! -s "$D/b" ] || fail "a preflight has no body"
logged '^lumen: OPTIONS /v1/chat/completions 204 [0-9.]+s$'
# another origin gets no allowance
curl -s -D "$D/h" -o /dev/null -X OPTIONS -H 'Origin: http://evil.example' "$B/v1/chat/completions"
if grep -qi '^Access-Control-Allow-Origin' "$D/h"; then fail "an origin not listed was allowed"; fi
# answers, errors (401 here) and streams carry the header
for body in "{\"model\":\"kjv\",$CHAT}" "{\"stream\":true,$CHAT}"; do
  curl -s -D "$D/h" -o "$D/b" "${A[@]}" -H 'Origin: http://localhost:3000' -d "$body" "$B/v1/chat/completions"
  grep -qi '^Access-Control-Allow-Origin: http://localhost:3000' "$D/h" || fail "no CORS header: $(cat "$D/h")"
done
grep -q 'data: \[DONE\]' "$D/b" || fail "the stream did not end: $(cat "$D/b")"
curl -s -D "$D/h" -o /dev/null -H 'Origin: http://app.example' "$B/v1/models"
head -1 "$D/h" | grep -q ' 401' || fail "no key: not 401"
grep -qi '^Access-Control-Allow-Origin: http://app.example' "$D/h" || fail "the 401 lacks the CORS header"
stop
if grep -Eqi 'MHD_|microhttpd' "$D/log"; then fail "libmicrohttpd warnings: $(cat "$D/log")"; fi

# ---- no --cors: OPTIONS is 204 (not 405), without CORS headers; no log lines ------------------------
start
curl -s -D "$D/h" -o /dev/null -X OPTIONS -H 'Origin: http://app.example' "$B/v1/chat/completions"
head -1 "$D/h" | grep -q ' 204' || fail "OPTIONS without --cors: $(head -1 "$D/h")"
grep -qi '^Allow: POST, OPTIONS' "$D/h" || fail "OPTIONS without --cors: no Allow header"
if grep -qi '^Access-Control-' "$D/h"; then fail "CORS headers without --cors"; fi
out=$(curl -s "$B/v1/chat/completions" -d "{$CHAT}")
grep -q '"model":"lumen-tiny-kjv"' <<<"$out" || fail "no model named: $out"
stop
if grep -Eq '^lumen: (GET|POST|OPTIONS) ' "$D/log"; then fail "request lines without --log-requests: $(cat "$D/log")"; fi

# ---- a bad --cors -------------------------------------------------------------------------------------
rc=0; "$LUMEN" serve "$M" --port 0 --cors 'http://a.example/' >/dev/null 2>"$D/e" || rc=$?
[ "$rc" = 1 ] && grep -q -- '--cors' "$D/e" || fail "a bad --cors: exit $rc, $(cat "$D/e")"
echo "test_serve_http: ok"

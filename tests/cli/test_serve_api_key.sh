#!/usr/bin/env bash
# test_serve_api_key.sh — the API key of `lumen serve` given without putting it on the command
# line: --api-key-file FILE (its first line) and the LUMEN_API_KEY environment variable. Each
# server on 127.0.0.1 with an ephemeral port: 401 without the key, 200 with it.
set -euo pipefail
LUMEN=${LUMEN_BIN:?}
M=models/lumen-tiny-kjv
D=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v curl >/dev/null || { echo "curl missing" >&2; exit 77; }
. "$(dirname "$0")/lib.sh"

start() { # start ARGS...: a server in the background, PORT set
  lm_serve_start "$D/out" "$D/log" 30 "$M" --host 127.0.0.1 --port 0 --parallel 1 "$@"
}
stop() { lm_serve_stop || true; }
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }

check_key() { # check_key KEY: the running server wants exactly KEY
  [ "$(code "http://127.0.0.1:$PORT/v1/models")" = 401 ] || fail "no key: not 401"
  [ "$(code -H "Authorization: Bearer nope" "http://127.0.0.1:$PORT/v1/models")" = 401 ] ||
    fail "wrong key: not 401"
  [ "$(code -H "Authorization: Bearer $1" "http://127.0.0.1:$PORT/v1/models")" = 200 ] ||
    fail "right key: not 200"
  [ "$(code "http://127.0.0.1:$PORT/health")" = 200 ] || fail "/health"
}

printf 'from-file-123\r\nsecond line ignored\n' >"$D/key"
chmod 600 "$D/key"
start --api-key-file "$D/key"
check_key from-file-123
stop

LUMEN_API_KEY=from-env-456 start
check_key from-env-456
stop

rc=0; "$LUMEN" serve "$M" --api-key a --api-key-file "$D/key" >/dev/null 2>"$D/e" || rc=$?
[ "$rc" = 2 ] || fail "both --api-key and --api-key-file: exit $rc, want 2"
: >"$D/empty"
rc=0; "$LUMEN" serve "$M" --api-key-file "$D/empty" >/dev/null 2>"$D/e" || rc=$?
[ "$rc" = 1 ] && grep -q empty "$D/e" || fail "an empty key file: exit $rc, $(cat "$D/e")"
mkfifo "$D/fifo"
rc=0; timeout 20 "$LUMEN" serve "$M" --api-key-file "$D/fifo" >/dev/null 2>"$D/e" || rc=$?
[ "$rc" = 1 ] || fail "a FIFO key file: exit $rc"
echo "test_serve_api_key: ok"

#!/usr/bin/env bash
# test_web_chat.sh — the chat page of `lumen serve` at GET /. With curl: the page is the one in
# web/chat.html, served as text/html with a Content-Security-Policy (the inline script and style
# allowed by hash, never 'unsafe-inline') and nosniff; with --api-key it is open while the API is
# not; --no-webui makes it a 404. Then in a real headless browser (Debian's chromium, driven by npm
# puppeteer-core@24.43.1, installed into $LM_BUILD_DIR/node-puppeteer and never committed):
# tests/web/chat_browser.mjs loads, sends, watches tokens stream, stops, regenerates, answers a
# tool call, reloads. Screenshots go to $LM_BUILD_DIR/test-artifacts/. Each server runs on the
# embedded model, on 127.0.0.1 with an ephemeral port. Skipped (77) only when the npm registry
# cannot be reached; a missing chromium fails (scripts/bootstrap.sh installs it).
set -euo pipefail
: "${LUMEN_BIN:?LUMEN_BIN is not set}" "${LM_BUILD_DIR:?LM_BUILD_DIR is not set}"
fail() { echo "test_web_chat: FAIL: $*" >&2; exit 1; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
M="$ROOT/models/lumen-tiny-kjv"
W="$LM_BUILD_DIR/tmp/test_web_chat"
ART="$LM_BUILD_DIR/test-artifacts"
PUPPETEER_VERSION=24.43.1 # the newest that runs on Node 20 (25.x wants Node 22)
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
rm -rf "$W" && mkdir -p "$W" "$ART"
command -v curl >/dev/null || { echo "test_web_chat: curl missing" >&2; exit 77; }
. "$(dirname "$0")/lib.sh"

PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; true; }
trap cleanup EXIT
start() { # start ARGS...: a server in the background, PORT set
  lm_serve_start "$W/out" "$W/log" 30 "$M" --host 127.0.0.1 --port 0 --parallel 2 --timeout 120 "$@"
}
stop() { lm_serve_stop || true; }
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }

# ---- the verb's help --------------------------------------------------------------------------
help=$("$LUMEN_BIN" serve --help)
grep -q -- '--no-webui' <<<"$help" || fail "serve --help does not document --no-webui"
grep -q 'http://127.0.0.1:8080/' <<<"$help" || fail "serve --help does not give the page's address"

# ---- the page and its headers -----------------------------------------------------------------
start
grep -q "chat page at http://127.0.0.1:$PORT/\$" "$W/out" || fail "no 'chat page at' line: $(cat "$W/out")"
U="http://127.0.0.1:$PORT"
[ "$(curl -s -D "$W/head" -o "$W/page" -w '%{http_code}' "$U/")" = 200 ] || fail "GET / is not 200"
cmp -s "$W/page" "$ROOT/web/chat.html" || fail "GET / is not web/chat.html"
h() { tr -d '\r' <"$W/head" | sed -n "s/^$1: //Ip"; }
[ "$(h Content-Type)" = "text/html; charset=utf-8" ] || fail "Content-Type: $(h Content-Type)"
[ "$(h X-Content-Type-Options)" = nosniff ] || fail "no X-Content-Type-Options: nosniff"
csp=$(h Content-Security-Policy)
for want in "default-src 'none'" "script-src 'sha256-" "style-src 'sha256-" "connect-src 'self'" \
            "frame-ancestors 'none'"; do
  grep -qF -- "$want" <<<"$csp" || fail "the CSP lacks $want: $csp"
done
! grep -q "unsafe" <<<"$csp" || fail "the CSP allows something unsafe: $csp"
# the policy's hash is the page's own script: a page whose script the policy blocked would be dead
script_hash=$(sed -n '/^<script>$/,/^<\/script>$/p' "$ROOT/web/chat.html" | sed '1s/^<script>//;$s/<\/script>$//' |
  head -c -1 | openssl dgst -sha256 -binary 2>/dev/null | base64 || true)
if [ -n "$script_hash" ]; then
  grep -qF "'sha256-$script_hash'" <<<"$csp" || fail "the CSP's script hash is not the page's ($script_hash)"
fi
[ "$(code "$U/index.html")" = 200 ] || fail "GET /index.html is not 200"
[ "$(code -I "$U/")" = 200 ] || fail "HEAD / is not 200"
[ "$(code -X POST "$U/")" = 405 ] || fail "POST / is not 405"

stop

# ---- with an API key: the page is open, the API is not ----------------------------------------
start --api-key sekrit-42
U="http://127.0.0.1:$PORT"
[ "$(code "$U/")" = 200 ] || fail "with --api-key, GET / without the key is not 200"
[ "$(code "$U/v1/models")" = 401 ] || fail "with --api-key, /v1/models without the key is not 401"
[ "$(code "$U/stats")" = 401 ] || fail "with --api-key, /stats without the key is not 401"
[ "$(code -H 'Authorization: Bearer sekrit-42' "$U/v1/models")" = 200 ] || fail "the key does not open /v1/models"
[ "$(code -X POST "$U/")" = 401 ] || fail "with --api-key, POST / without the key is not 401"
stop

# ---- --no-webui -------------------------------------------------------------------------------
start --no-webui
U="http://127.0.0.1:$PORT"
[ "$(code "$U/")" = 404 ] || fail "with --no-webui, GET / is not 404"
[ "$(code "$U/index.html")" = 404 ] || fail "with --no-webui, GET /index.html is not 404"
[ "$(code "$U/v1/models")" = 200 ] || fail "with --no-webui, /v1/models is not 200"
! grep -q 'chat page' "$W/out" || fail "with --no-webui, the startup lines still name the page"
stop

# ---- the browser ------------------------------------------------------------------------------
[ -x "$CHROMIUM" ] || fail "$CHROMIUM missing (scripts/bootstrap.sh installs Debian's chromium)"
command -v node >/dev/null && command -v npm >/dev/null || fail "node/npm missing (scripts/bootstrap.sh installs them)"
[ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ] || fail "node >= 20 needed"
PD="$LM_BUILD_DIR/node-puppeteer"
if ! PUPPETEER_SKIP_DOWNLOAD=1 lm_npm_install "$PD" "puppeteer-core@$PUPPETEER_VERSION" >"$W/npm.log" 2>&1; then
  if ! timeout 30 npm ping >/dev/null 2>&1; then
    echo "test_web_chat: the npm registry is unreachable: browser part skipped" >&2
    exit 77
  fi
  fail "npm install puppeteer-core@$PUPPETEER_VERSION failed: $(tail -5 "$W/npm.log")"
fi
rm -f "$ART"/web_chat*.png
start # the whole page
PUPPETEER_DIR="$PD" CHROMIUM="$CHROMIUM" timeout 150 node "$ROOT/tests/web/chat_browser.mjs" \
  "http://127.0.0.1:$PORT" "$ART" "$W" ||
  fail "the browser test failed (server log: $(tail -5 "$W/log"))"
[ -s "$ART/web_chat.png" ] || fail "no screenshot"
echo "test_web_chat: screenshot $ART/web_chat.png (and web_chat_tools.png, web_chat_phone.png)"
stop

start --api-key sekrit-42 # the page without the key, then with it
PUPPETEER_DIR="$PD" CHROMIUM="$CHROMIUM" timeout 60 node "$ROOT/tests/web/chat_browser.mjs" \
  "http://127.0.0.1:$PORT" "$ART" "$W" sekrit-42 || fail "the browser test with an API key failed"
stop

trap - EXIT
echo "test_web_chat: ok"

#!/usr/bin/env bash
# test_signals.sh — how lumen ends when asked to, on the embedded model:
#   - Ctrl-C (SIGINT) during `lumen run` stops the generation: what was printed stays, the timing
#     line and a trailing newline follow, --save-state is written (and loads again), exit 130;
#   - Ctrl-C during a `lumen chat` answer ends that answer only: the next turn is answered; Ctrl-C at
#     the prompt leaves with 130;
#   - `lumen serve` on a port another lumen already serves is a clean startup error naming the port
#     (no second server sharing the port's traffic).
set -euo pipefail
: "${LUMEN_BIN:?LUMEN_BIN is not set}" "${LM_BUILD_DIR:?LM_BUILD_DIR is not set}"
fail() { echo "test_signals: $*" >&2; exit 1; }
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
M="$ROOT/models/lumen-tiny-kjv"
W="$LM_BUILD_DIR/tmp/test_signals"
rm -rf "$W" && mkdir -p "$W"
[ -f "$M/model.safetensors" ] || { echo "test_signals: $M has no weights" >&2; exit 77; }
PIDS=()
# PID too: lm_serve_start fails before the caller can add its server to PIDS
cleanup() { for p in "${PIDS[@]}" ${PID:+"$PID"}; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# wait_for FILE PATTERN SECONDS: until FILE matches the extended regex
wait_for() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    grep -Eq "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
STATS='^prefill [0-9]+ tok @ [0-9.]+ tok/s, decode [0-9]+ tok @'

# ---- run ------------------------------------------------------------------------------------------
"$LUMEN_BIN" run "$M" "And it came to pass" --raw --temp 0 -n 100000 \
  --save-state "$W/run.state" >"$W/run.out" 2>"$W/run.err" &
PID=$!
PIDS+=("$PID")
wait_for "$W/run.out" '[a-z]' 60 || fail "run printed nothing within 60 s"
kill -INT "$PID"
rc=0
wait "$PID" || rc=$?
[ $rc -eq 130 ] || fail "run after SIGINT exited $rc, want 130: $(cat "$W/run.err")"
grep -Eq "$STATS" "$W/run.err" || fail "no timing line after SIGINT: $(cat "$W/run.err")"
[ "$(tail -c 1 "$W/run.out" | od -An -c | tr -d ' ')" = '\n' ] || fail "the output does not end with a newline"
[ -s "$W/run.state" ] || fail "--save-state was not written after SIGINT"
gen=$(sed -nE 's/.*decode ([0-9]+) tok @.*/\1/p' "$W/run.err")
[ "$gen" -lt 100000 ] || fail "the generation was not cut ($gen tokens)"
out=$("$LUMEN_BIN" run "$M" "And it came to pass" --raw --temp 0 -n 2 --load-state "$W/run.state" \
  2>&1 >/dev/null) || fail "the state saved at SIGINT does not load: $out"
# the prompt is a prefix of the saved context: reusable while no sliding ring (128) has wrapped
if [ "$gen" -lt 100 ]; then
  [[ "$out" == *"cached "* ]] || fail "the saved state was not reused: $out"
fi

# ---- chat -----------------------------------------------------------------------------------------
mkfifo "$W/chat.in"
# the stop ids are banned so that no answer ends on its own before its Ctrl-C (an answer that had
# ended would make that Ctrl-C one at the prompt, which leaves)
"$LUMEN_BIN" chat "$M" --raw --temp 0 -n 100000 --logit-bias 1=-inf --logit-bias 5=-inf \
  --logit-bias 13=-inf <"$W/chat.in" >"$W/chat.out" 2>"$W/chat.err" &
PID=$!
PIDS+=("$PID")
exec 7>"$W/chat.in"
echo "The LORD is my shepherd" >&7
wait_for "$W/chat.out" '[a-z]' 60 || fail "chat printed nothing within 60 s"
kill -INT "$PID"
wait_for "$W/chat.err" "$STATS" 30 || fail "chat: the answer did not end after SIGINT: $(cat "$W/chat.err")"
kill -0 "$PID" 2>/dev/null || fail "chat exited on SIGINT during an answer"
n1=$(wc -c <"$W/chat.out")
echo "I shall not want" >&7
for _ in $(seq 1 600); do [ "$(wc -c <"$W/chat.out")" -gt "$n1" ] && break; sleep 0.1; done
[ "$(wc -c <"$W/chat.out")" -gt "$n1" ] || fail "chat did not answer the turn after an interrupted one"
kill -INT "$PID"
for _ in $(seq 1 300); do [ "$(grep -Ec "$STATS" "$W/chat.err")" -ge 2 ] && break; sleep 0.1; done
[ "$(grep -Ec "$STATS" "$W/chat.err")" -ge 2 ] || fail "chat: the second answer did not end"
sleep 0.3
kill -INT "$PID" # at the prompt: leave
rc=0
wait "$PID" || rc=$?
exec 7>&-
[ $rc -eq 130 ] || fail "chat after Ctrl-C at the prompt exited $rc, want 130"

# ---- serve on a port in use -----------------------------------------------------------------------
lm_serve_start "$W/s1.out" "$W/s1.err" 60 "$M" --host 127.0.0.1 --port 0
PIDS+=("$PID")
rc=0
timeout 60 "$LUMEN_BIN" serve "$M" --host 127.0.0.1 --port "$PORT" >"$W/s2.out" 2>"$W/s2.err" || rc=$?
[ $rc -eq 1 ] || fail "a second server on port $PORT exited $rc, want 1"
grep -q ":$PORT" "$W/s2.err" || fail "the error does not name the port: $(cat "$W/s2.err")"
grep -q "in use" "$W/s2.err" || fail "the error does not say the port is in use: $(cat "$W/s2.err")"
kill -TERM "$PID"
wait "$PID" || fail "the first server did not exit cleanly on SIGTERM"
echo "test_signals: SIGINT in run and chat, and a port in use, behave"

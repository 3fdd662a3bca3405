#!/usr/bin/env bash
# test_engine_recorded.sh — the outputs of `run`, `chat`, `generate` and `serve` on the embedded
# model, held to recordings (tests/goldens/engine/*.txt): greedy answers in chat and raw mode, a
# seeded sampled answer, a piped multi-turn chat with /reset (the second turn reuses the cache),
# greedy ids, and the server's chat completion, streamed chat completion and raw completion. The
# recordings were made by the build before the one generation engine replaced the CLI's and the
# server's own loops, so they show that every caller still computes what it did. A change that
# alters numerics on purpose re-records them (LUMEN_RECORD=1 bash tests/cli/test_engine_recorded.sh
# with LUMEN_BIN and LM_BUILD_DIR set) and says why in its commit.
set -euo pipefail
: "${LUMEN_BIN:?LUMEN_BIN is not set}" "${LM_BUILD_DIR:?LM_BUILD_DIR is not set}"
fail() { echo "test_engine_recorded: $*" >&2; exit 1; }
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
M="$ROOT/models/lumen-tiny-kjv"
G="$ROOT/tests/goldens/engine"
W="$LM_BUILD_DIR/tmp/test_engine_recorded"
rm -rf "$W" && mkdir -p "$W"
[ -f "$M/model.safetensors" ] || { echo "test_engine_recorded: $M has no weights" >&2; exit 77; }
L() { "$LUMEN_BIN" "$@"; }

# check NAME: compares $W/NAME.txt with the recording (or records it)
check() {
  if [ "${LUMEN_RECORD:-0}" = 1 ]; then
    cp "$W/$1.txt" "$G/$1.txt"
  else
    [ -f "$G/$1.txt" ] || fail "no recording $G/$1.txt"
    cmp -s "$W/$1.txt" "$G/$1.txt" || fail "$1 differs from its recording: $(diff "$G/$1.txt" "$W/$1.txt" | head -20)"
  fi
}

# ---- run, chat, generate ------------------------------------------------------------------------
{
  L run "$M" "Who was Moses?" --temp 0 -n 40
  L run "$M" "What did the LORD say unto Noah?" --temp 0 -n 48 --system "Answer in the words of the Bible."
  L run "$M" "In the beginning" --raw --temp 0 -n 40
  L run "$M" "And it came to pass" --raw --temp 0 -n 40 --chunk 3
  L run "$M" "Blessed are" --raw --temp 0.9 --top-p 0.95 --seed 7 -n 40
  L run "$M" "Tell me of the flood." --temp 0.8 --top-k 40 --seed 11 -n 40
} >"$W/run.txt" 2>"$W/run.err" || fail "run failed: $(cat "$W/run.err")"
check run
printf 'Who is the king?\nAnd what did he say?\n/reset\nTell me of David.\nAnd of Solomon?\n' |
  L chat "$M" --temp 0 -n 32 >"$W/chat.txt" 2>"$W/chat.err" || fail "chat failed: $(cat "$W/chat.err")"
check chat
printf 'The LORD is my shepherd\nI shall not want\n' |
  L chat "$M" --raw --temp 0 -n 24 >"$W/chat_raw.txt" 2>"$W/chat_raw.err" || fail "raw chat failed"
check chat_raw
L generate "$M" --ids 2,642,512,519,291,1251,513,417,1356 -n 24 >"$W/generate.txt" 2>/dev/null ||
  fail "generate failed"
check generate

# ---- serve ----------------------------------------------------------------------------------------
PID=
trap 'kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true' EXIT
lm_serve_start "$W/out" "$W/log" 30 "$M" --host 127.0.0.1 --port 0 --parallel 4 --timeout 120
U="http://127.0.0.1:$PORT/v1"
post() { curl -s -N "$U/$1" -H 'content-type: application/json' -d "$2"; }
# drops the fields that change from run to run (ids, times)
scrub() { sed -E 's/"(id|created|system_fingerprint)": ?("[^"]*"|[0-9]+)/"\1":_/g'; }
{
  post chat/completions '{"messages":[{"role":"user","content":"Who was Moses?"}],"temperature":0,"max_tokens":40}'
  echo
  post chat/completions '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Who was Noah?"}],"temperature":0,"max_tokens":40,"stream":true}'
  post completions '{"prompt":"In the beginning","temperature":0,"max_tokens":40}'
  echo
  post completions '{"prompt":"Blessed are","temperature":0.9,"seed":5,"max_tokens":32}'
  echo
} | scrub >"$W/serve.txt"
check serve
echo "test_engine_recorded: run, chat, generate and serve match their recordings"

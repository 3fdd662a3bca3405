#!/usr/bin/env bash
# test_run_chat.sh — `lumen run` and `lumen chat` end to end on tiny random checkpoints written by
# `test_generate --write-model` (the unit test's writer):
#   1. a vocab-64 model with the unit test's 64-token tokenizer and Gemma-4-style chat template:
#      output shape, the timing line, prefill counts against `lumen tokenize` of the rendered
#      prompt (--system, --no-think), --raw, stdin prompts, seeded sampling, --stop with the text
#      before the stop string only, --max-tokens, a malformed tool call kept as content, piped chat
#      turns with cache reuse, /reset and /exit, backslash continuation, a checkpoint without a
#      template, and the error cases (invalid UTF-8, a missing model directory, bad flag values);
#      and, when models/lumen-tiny-kjv holds its weights, real text: reasoning kept off stdout and
#      the second chat turn reusing the whole first one;
#   2. a vocab-262144 model with the real Gemma 4 tokenizer (fetched into $LM_BUILD_DIR/testdata by
#      test_tokenizer_goldens.sh) and the canonical chat template from ../shared: the rendered
#      prompt has the golden 20 ids, and greedy `run` prints exactly `generate`'s ids decoded.
# When the Gemma 4 tokenizer has not been fetched yet, part 1 runs and the test exits 77 (skipped).
set -euo pipefail
export LC_ALL=C.UTF-8 # ${s:i:n} counts characters

: "${LUMEN_BIN:?LUMEN_BIN is not set}" "${LM_BUILD_DIR:?LM_BUILD_DIR is not set}" "${LM_SHARED_DIR:?LM_SHARED_DIR is not set}"
WRITER="$LM_BUILD_DIR/test_generate"
W="$LM_BUILD_DIR/tmp/test_run_chat"
fail() { echo "test_run_chat: $*" >&2; exit 1; }
[ -x "$WRITER" ] || fail "$WRITER is missing (it is built with the unit tests)"
rm -rf "$W" && mkdir -p "$W"
M="$W/small"
"$WRITER" --write-model "$M" >/dev/null || fail "writing the tiny checkpoint failed"
L() { "$LUMEN_BIN" "$@"; }

STATS='^prefill [0-9]+ tok @ [0-9.]+ tok/s, decode [0-9]+ tok @ [0-9.]+ tok/s'
# run_ok OUT_VAR ERR_VAR ARGS...: runs lumen, requires exit 0
run_ok() { # (locals are __-prefixed: printf -v must not hit one of them)
  local __o=$1 __e=$2; shift 2
  local __out __err __rc=0
  __out=$(L "$@" 2>"$W/err") || __rc=$?
  __err=$(cat "$W/err")
  [ $__rc -eq 0 ] || fail "lumen $* exited $__rc: $__err"
  printf -v "$__o" '%s' "$__out"
  printf -v "$__e" '%s' "$__err"
}
# expect_fail CODE NEEDLE ARGS...: requires exit CODE and NEEDLE in stderr
expect_fail() {
  local code=$1 needle=$2; shift 2
  local rc=0 err
  L "$@" >/dev/null 2>"$W/err" </dev/null || rc=$?
  err=$(cat "$W/err")
  [ $rc -eq "$code" ] || fail "lumen $* exited $rc, want $code: $err"
  [[ "$err" == *"$needle"* ]] || fail "lumen $*: stderr lacks '$needle': $err"
}
prefill_of() { sed -nE 's/^prefill ([0-9]+) tok.*/\1/p' <<<"$1" | head -n1; }
decode_of() { sed -nE 's/.*decode ([0-9]+) tok @.*/\1/p' <<<"$1" | head -n1; }
count_ids() { L tokenize "$M" --no-special --text "$1" | tr -cd ',' | wc -c | awk '{print $1 + 1}'; }

# ---- help -------------------------------------------------------------------------------------
L run --help | grep -q -- '--temperature' || fail "run --help lacks the sampling flags"
L run --help | grep -q -- '--no-think' || fail "run --help lacks --no-think"
L chat --help | grep -q -- '/reset' || fail "chat --help lacks /reset"

# ---- run: chat format, timing line, prefill counts -----------------------------------------------
run_ok out err run "$M" "hello there" -n 12
[[ "$err" =~ $STATS ]] || fail "no timing line on stderr: $err"
[ "$(decode_of "$err")" -le 12 ] || fail "more than 12 tokens: $err"
[ "$(prefill_of "$err")" -eq "$(count_ids $'<bos><|turn>user\nhello there<turn|>\n<|turn>model\n')" ] ||
  fail "the prompt is not the rendered template: $err"
run_ok out2 err2 run "$M" "hello there" -n 12
[ "$out" = "$out2" ] || fail "greedy (do_sample false in generation_config.json) is not deterministic"
printf 'hello there' | L run "$M" -n 12 >"$W/stdin_out" 2>/dev/null || fail "prompt from stdin failed"
[ "$(cat "$W/stdin_out")" = "$out" ] || fail "the prompt from stdin differs from the argument"
run_ok _ err run "$M" "hello there" -n 4 --system "be brief"
[ "$(prefill_of "$err")" -eq "$(count_ids $'<bos><|turn>system\nbe brief<turn|>\n<|turn>user\nhello there<turn|>\n<|turn>model\n')" ] ||
  fail "--system is not rendered: $err"
run_ok _ err run "$M" "hello there" -n 4 --no-think
[ "$(prefill_of "$err")" -eq "$(count_ids $'<bos><|turn>user\nhello there<turn|>\n<|turn>model\n<|channel>thought\n<channel|>')" ] ||
  fail "--no-think does not reach the template: $err"
run_ok _ err run "$M" "hello there" -n 4 --raw
[ "$(prefill_of "$err")" -eq "$(count_ids '<bos>hello there')" ] || fail "--raw does not tokenize the plain prompt with BOS: $err"

# ---- sampling, max tokens, stop strings ----------------------------------------------------------
run_ok s1 _ run "$M" "hello there" -n 16 --temp 1.2 --top-k 20 --top-p 0.9 --min-p 0.01 --seed 7
run_ok s2 _ run "$M" "hello there" -n 16 --temperature 1.2 --top-k 20 --top-p 0.9 --min-p 0.01 --seed 7
[ "$s1" = "$s2" ] || fail "the same --seed gave different outputs"
run_ok _ err run "$M" "hello there" -n 9 --raw --logit-bias 1=-inf --logit-bias 5=-inf
[ "$(decode_of "$err")" -eq 9 ] || fail "--max-tokens 9 without stop ids did not give 9 tokens: $err"
run_ok full _ run "$M" "the end" -n 40 --raw --repeat-penalty 1.3 --logit-bias 1=-inf --logit-bias 5=-inf --logit-bias 14=-inf
[ ${#full} -ge 12 ] || fail "the raw continuation is too short for the stop test: '$full'"
STOP=${full:6:3}
want=${full%%"$STOP"*}
run_ok cut _ run "$M" "the end" -n 40 --raw --repeat-penalty 1.3 --logit-bias 1=-inf --logit-bias 5=-inf --logit-bias 14=-inf \
  --stop "$STOP"
[ "$cut" = "$want" ] || fail "--stop '$STOP': got '$cut', want '$want' (full '$full')"
# a malformed tool call (an opened <|tool_call> that never closes) comes back as content
run_ok tc _ run "$M" "hello there" -n 3 --logit-bias 9=100
[[ "$tc" == *"<|tool_call>"* ]] || fail "a malformed tool call was lost: '$tc'"

# ---- errors ---------------------------------------------------------------------------------------
expect_fail 1 "not valid UTF-8" run "$M" $'caf\xc3'
expect_fail 1 "not valid UTF-8" run "$M" "hi" --system $'\xff'
rc=0; printf 'ab\xfe' | L run "$M" >/dev/null 2>"$W/err" || rc=$?
[ $rc -eq 1 ] && grep -q "not valid UTF-8" "$W/err" || fail "invalid UTF-8 on stdin: exit $rc"
expect_fail 1 "$W/nowhere" run "$W/nowhere" "hi"
expect_fail 1 "$W/nowhere" chat "$W/nowhere"
expect_fail 2 "--temp: 'warm' is not a number" run "$M" "hi" --temp warm
expect_fail 2 "--logit-bias" run "$M" "hi" --logit-bias 3
expect_fail 1 "top_p" run "$M" "hi" --top-p 2
expect_fail 1 "outside the vocabulary" run "$M" "hi" --logit-bias 999=1
expect_fail 2 "usage" run

# ---- chat: piped turns, cache reuse, /reset, /exit ---------------------------------------------------
NO_NL=(--logit-bias 14=-inf --logit-bias 15=-inf) # no "\n" or space tokens: one line per answer, nothing to trim
printf 'hello there\nhow are you\n/reset\nhello there\n/exit\nnever read\n' |
  L chat "$M" -n 6 "${NO_NL[@]}" >"$W/chat_out" 2>"$W/chat_err" || fail "chat exited $?: $(cat "$W/chat_err")"
[ "$(wc -l <"$W/chat_out")" -eq 3 ] || fail "chat: want 3 answer lines: $(cat "$W/chat_out")"
[ "$(sed -n 1p "$W/chat_out")" = "$(sed -n 3p "$W/chat_out")" ] || fail "chat: /reset did not start over"
mapfile -t st < <(grep -E "$STATS" "$W/chat_err")
[ ${#st[@]} -eq 3 ] || fail "chat: want 3 timing lines: $(cat "$W/chat_err")"
cached=$(sed -nE 's/.*cached ([0-9]+) tok.*/\1/p' <<<"${st[1]}")
# all of the first turn stays: its prompt and its answer but the last token (pending, fed now)
[ -n "$cached" ] && [ "$cached" -eq "$(($(prefill_of "${st[0]}") + $(decode_of "${st[0]}") - 1))" ] ||
  fail "chat: the second turn did not reuse the whole first turn from the cache: ${st[0]} / ${st[1]}"
# after /reset the context is the first turn's prompt again: the prefix cache may give it back
# (all but its last token), never more (the rings keep spare slots, so a wrapped one can go back)
cached=$(sed -nE 's/.*cached ([0-9]+) tok.*/\1/p' <<<"${st[2]}")
[ "$(($(prefill_of "${st[2]}") + ${cached:-0}))" -eq "$(prefill_of "${st[0]}")" ] ||
  fail "chat: after /reset the context was not the first prompt alone: ${st[0]} / ${st[2]}"
grep -q "new conversation" "$W/chat_err" || fail "chat: /reset says nothing"
# a backslash continues a turn; bad input is reported and the session goes on (exit 1 at the end)
rc=0
printf 'hello \\\nthere\n\xff\xfe\nok then\n' | L chat "$M" -n 4 "${NO_NL[@]}" >"$W/chat_out" 2>"$W/chat_err" || rc=$?
[ $rc -eq 1 ] || fail "chat with a bad line: exit $rc, want 1"
grep -q "not valid UTF-8" "$W/chat_err" || fail "chat: invalid UTF-8 not reported"
[ "$(wc -l <"$W/chat_out")" -eq 2 ] || fail "chat: want 2 answers around the bad line: $(cat "$W/chat_out")"

# ---- a checkpoint without a chat template runs raw ----------------------------------------------------
N="$W/notemplate"
cp -r "$M" "$N" && rm "$N/chat_template.jinja"
run_ok _ err run "$N" "hello there" -n 4 -v
[[ "$err" == *"no chat template"* ]] && [ "$(prefill_of "$err")" -eq "$(count_ids '<bos>hello there')" ] ||
  fail "no template: not a raw completion: $err"
printf 'hello\nthere\n' | L chat "$N" -n 3 "${NO_NL[@]}" >"$W/chat_out" 2>"$W/chat_err" || fail "raw chat failed"
[ "$(wc -l <"$W/chat_out")" -eq 2 ] || fail "raw chat: want 2 answers"

# ---- the embedded trained model (when present): real text through the template and the parser ------
K="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/models/lumen-tiny-kjv"
if [ -s "$K/model.safetensors" ]; then
  run_ok ans err run "$K" "Recite John 3:16." -n 80 --temp 0 --think
  [ -n "$ans" ] && [[ "$ans" != *"<|channel>"* && "$ans" != *"<channel|>"* ]] ||
    fail "kjv: the answer is empty or carries the reasoning channel: '$ans'"
  printf 'Recite Psalm 23:1.\nGive the next verse.\n' | L chat "$K" -n 60 --temp 0 >"$W/chat_out" 2>"$W/chat_err" ||
    fail "kjv chat failed: $(cat "$W/chat_err")"
  mapfile -t st < <(grep -E "$STATS" "$W/chat_err")
  cached=$(sed -nE 's/.*cached ([0-9]+) tok.*/\1/p' <<<"${st[1]}")
  [ -n "$cached" ] && [ "$cached" -ge "$(prefill_of "${st[0]}")" ] || # at least the first prompt
    fail "kjv chat: the second turn did not reuse the first: ${st[0]} / ${st[1]}"
fi

# ---- part 2: the real Gemma 4 tokenizer and the canonical template ---------------------------------
GT="$LM_BUILD_DIR/testdata/gemma4-tokenizer.json"
if [ ! -s "$GT" ]; then
  echo "test_run_chat: $GT is absent (test_tokenizer_goldens.sh fetches it): Gemma 4 part skipped" >&2
  exit 77
fi
G="$W/gemma"
"$WRITER" --write-model "$G" --vocab 262144 --window 512 >/dev/null || fail "writing the vocab-262144 checkpoint failed"
cp "$GT" "$G/tokenizer.json"
cp "$LM_SHARED_DIR/testdata/gemma4/chat_template.jinja" "$G/"
printf '{"do_sample":true,"eos_token_id":[1,106,50],"suppress_tokens":[258883,258882],"temperature":1.0,"top_k":64,"top_p":0.95}\n' \
  >"$G/generation_config.json"
GOLD=2,105,2364,107,3689,563,236743,236778,236862,236778,236881,106,107,105,4368,107,100,45518,107,101
run_ok got err run "$G" "What is 2+2?" -n 8 --temp 0 --raw-output --precision f32
[ "$(prefill_of "$err")" -eq 20 ] || fail "gemma4: the rendered prompt is not the golden 20 ids: $err"
ids=$(L generate "$G" --ids "$GOLD" -n 8 2>/dev/null | tr -d '[]')
stop_at=$(tr ',' '\n' <<<"$ids" | grep -nxE '1|106|50' | head -n1 | cut -d: -f1 || true)
[ -n "$stop_at" ] && ids=$(tr ',' '\n' <<<"$ids" | head -n $((stop_at - 1)) | paste -sd,)
if [ -n "$ids" ]; then
  want=$(L detokenize "$G" --ids "$ids")
  [ "$got" = "$want" ] || fail "gemma4: run's greedy text '$got' is not generate's ids decoded '$want'"
fi
run_ok s1 _ run "$G" "What is 2+2?" -n 6 --seed 3
run_ok s2 _ run "$G" "What is 2+2?" -n 6 --seed 3
[ "$s1" = "$s2" ] || fail "gemma4: the same seed gave different outputs"
printf 'What is 2+2?\nAnd 3+3?\n' | L chat "$G" -n 4 --temp 0 >"$W/chat_out" 2>"$W/chat_err" || fail "gemma4 chat failed"
grep -qE 'cached [0-9]+ tok' "$W/chat_err" || fail "gemma4 chat: no cache reuse: $(cat "$W/chat_err")"
echo "test_run_chat: ok"

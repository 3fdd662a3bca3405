#!/usr/bin/env bash
# test_cli_habits.sh — the flags people's fingers know and the messages they meet: llama.cpp /
# mlx-lm spellings mean what lumen's do, unknown flags are named (never read as another flag),
# flags with a llama.cpp meaning lumen lacks get a hint, errors are printed once, `quantize`
# copies the side files and keeps a non-empty output unless --force, a checkpoint without a chat
# template says so, --chat-template FILE replaces it, long commands print progress on stderr only.
set -euo pipefail
LUMEN=${LUMEN_BIN:?}
M=models/lumen-tiny-kjv
D=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$(dirname "$0")/lib.sh"

refused() { # refused PATTERN ARGS...: exit 2, one stderr line matching PATTERN
  local rc=0
  "$LUMEN" "${@:2}" >"$D/o" 2>"$D/e" || rc=$?
  [ "$rc" = 2 ] || fail "$* exited $rc, not 2: $(cat "$D/e")"
  grep -q -- "$1" "$D/e" || fail "$*: no '$1' in: $(cat "$D/e")"
  [ "$(wc -l <"$D/e")" = 1 ] || fail "$*: more than one line: $(cat "$D/e")"
}

# -- the same run under both spellings
a=$("$LUMEN" run "$M" "In the beginning" -n 6 --temperature 0 --ctx 64 --threads 1 --seed 3 2>/dev/null)
b=$("$LUMEN" run -m "$M" -p "In the beginning" -n 6 --temp 0 -c 64 -t 1 -s 3 --jinja 2>/dev/null)
c=$("$LUMEN" run --prompt "In the beginning" --model "$M" --n-predict 6 --temp 0 --ctx-size 64 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] || fail "aliases differ: '$a' / '$b' / '$c'"

# -- unknown and foreign flags
refused "unknown flag '-ngl': lumen runs the whole model on the chosen backend" run "$M" hi -ngl 99
refused "unknown flag '--n-gpu-layers'" serve "$M" --n-gpu-layers=99
refused "unknown flag '--foo'" run "$M" hi --foo
refused "did you mean --temperature" run "$M" hi --temprature 1
refused "unknown flag '-nfoo'" run "$M" hi -nfoo
refused "flag '--ctx' needs a value" run "$M" hi --ctx
refused "unknown flag '-np'" run "$M" hi -np 4
refused "unknown flag '-fa'" serve "$M" -fa on
refused "kv-quant" run "$M" hi -ctk q8_0
refused "unknown flag '--bogus'" bench --preset x --bogus
refused "unknown flag '--nope'" tokenize "$M" --nope

# -- serve under llama.cpp spellings: -m, -np, -c, --alias
lm_serve_start "$D/out" "$D/log" 30 -m "$M" --host 127.0.0.1 --port 0 -np 2 -c 256 --alias my-model -cb
models=$(curl -s "http://127.0.0.1:$PORT/v1/models")
grep -q '"my-model"' <<<"$models" || fail "--alias not served: $models"
stats=$(curl -s "http://127.0.0.1:$PORT/stats")
python3 - "$stats" <<'PY' || fail "stats: $stats"
import json, sys
s = json.loads(sys.argv[1])
assert s["sequences"]["parallel"] == 2, s["sequences"]
assert s["admission"]["max_context"] == 256, s["admission"]
PY
lm_serve_stop || true

# -- quantize: kinds checked up front, one message each, side files copied, no silent overwrite
refused "lumen quantize: --bits 7: supported are 2, 3, 4, 5, 6 and 8" quantize "$M" "$D/q" --bits 7
refused "lumen quantize: --bits 1: supported" quantize "$M" "$D/q" --bits 1
refused "lumen quantize: --group 48: supported are 32, 64 and 128" quantize "$M" "$D/q" --group 48
grep -q "quantize: quantize" "$D/e" && fail "repeated prefix"
LUMEN_PROGRESS_AFTER=0 "$LUMEN" quantize "$M" "$D/q" --bits 4 >"$D/qo" 2>"$D/qe" || fail "quantize: $(cat "$D/qe")"
[ ! -s "$D/qo" ] || fail "quantize wrote to stdout: $(cat "$D/qo")"
grep -q "quantize: .* layers" "$D/qe" || fail "no quantize progress: $(cat "$D/qe")"
for f in config.json model.safetensors tokenizer.json chat_template.jinja generation_config.json kv_config.json; do
  [ -f "$D/q/$f" ] || fail "quantize did not write $f"
done
"$LUMEN" run "$D/q" "In the beginning" -n 3 --kv-quant config >/dev/null 2>"$D/e" ||
  fail "--kv-quant config on the quantized copy: $(cat "$D/e")"
refused "is not empty (give --force" quantize "$M" "$D/q"
refused "is the source directory" quantize "$M" "$M" --force
"$LUMEN" quantize "$M" "$D/q" --bits 8 --force 2>/dev/null || fail "--force"
grep -q '"bits": 8' "$D/q/config.json" || fail "--force did not rewrite the config"

# -- no chat template: a visible note; --chat-template FILE gives one; --raw is silent
mkdir "$D/nt"
cp "$M/config.json" "$M/model.safetensors" "$M/tokenizer.json" "$D/nt/"
"$LUMEN" run "$D/nt" "In the beginning" -n 2 >/dev/null 2>"$D/e"
grep -q "note: .* has no chat template" "$D/e" || fail "no note: $(cat "$D/e")"
"$LUMEN" run "$D/nt" "In the beginning" -n 2 --raw >/dev/null 2>"$D/e"
grep -q "chat template" "$D/e" && fail "note with --raw: $(cat "$D/e")"
printf '{{ bos_token }}{%% for m in messages %%}{{ m.content }} {%% endfor %%}' >"$D/t.jinja"
"$LUMEN" run "$D/nt" "In the beginning" -n 2 --chat-template "$D/t.jinja" >/dev/null 2>"$D/e" ||
  fail "--chat-template: $(cat "$D/e")"
grep -q "chat template" "$D/e" && fail "note despite --chat-template: $(cat "$D/e")"
# the template is used: its render (BOS + text + space) has one more token than the raw prompt
grep -q "prefill 5 tok" "$D/e" || fail "template not applied: $(cat "$D/e")"
if "$LUMEN" run "$D/nt" hi --chat-template "$D/nope.jinja" >/dev/null 2>"$D/e"; then fail "missing template accepted"; fi
grep -q "nope.jinja: cannot open" "$D/e" && [ "$(wc -l <"$D/e")" = 1 ] || fail "template message: $(cat "$D/e")"

# -- the context filling up is said
"$LUMEN" run "$M" "In the beginning" --raw --ctx 24 -n 100 --temp 0 >/dev/null 2>"$D/e"
grep -q "the context is full (24 tokens)" "$D/e" || fail "no context note: $(cat "$D/e")"

# -- progress of a long command on stderr, results alone on stdout
python3 -c "print(','.join(str(2 + (i * 37) % 4000) for i in range(96)))" >"$D/ids"
LUMEN_PROGRESS_AFTER=0 "$LUMEN" kv-eval "$M" --ids-file "$D/ids" --chunk 16 >"$D/ko" 2>"$D/ke" ||
  fail "kv-eval: $(cat "$D/ke")"
grep -q "^kv-eval: .*tok/s" "$D/ke" || fail "no kv-eval progress: $(cat "$D/ke")"
grep -q "kv-eval:" "$D/ko" && fail "progress on stdout"
grep -q "^4 " "$D/ko" || fail "kv-eval results: $(cat "$D/ko")"
echo "test_cli_habits: ok"

#!/usr/bin/env bash
# test_hostile_files.sh — inputs that are not regular files are refused at once with a clear
# error, never a hang in open(): a FIFO as --load-state, and a FIFO in place of each model file.
# A model directory made of symlinks to the real files (how a Hugging Face cache snapshot looks)
# still loads.
set -euo pipefail
LUMEN=${LUMEN_BIN:?}
M=$(pwd)/models/lumen-tiny-kjv
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# refused: exit 1 (not 124, a timeout) with NEEDLE on stderr
refused() {
  local needle=$1; shift
  local rc=0
  timeout 30 "$LUMEN" "$@" >/dev/null 2>"$D/e.err" </dev/null || rc=$?
  [ "$rc" = 124 ] && fail "hung: $*"
  [ "$rc" = 0 ] && fail "succeeded: $*"
  grep -q "$needle" "$D/e.err" || fail "expected '$needle' for $*, got: $(cat "$D/e.err")"
  return 0
}

mkfifo "$D/state.fifo"
refused "FIFO" run "$M" "Hi" -n 2 --load-state "$D/state.fifo"

# a snapshot-like directory: every file a symlink into the real one
mkdir "$D/snap"
for f in "$M"/*; do ln -s "$f" "$D/snap/$(basename "$f")"; done
out=$(timeout 60 "$LUMEN" run "$D/snap" "Hi" -n 2 2>"$D/s.err") || fail "symlinked model: $(cat "$D/s.err")"

for f in model.safetensors config.json tokenizer.json tokenizer_config.json chat_template.jinja \
  generation_config.json; do
  [ -e "$M/$f" ] || continue
  rm -rf "$D/m"
  mkdir "$D/m"
  for g in "$M"/*; do ln -s "$g" "$D/m/$(basename "$g")"; done
  rm "$D/m/$f"
  mkfifo "$D/blob.fifo.$f"
  ln -s "$D/blob.fifo.$f" "$D/m/$f" # a symlink to a FIFO: followed, then refused
  refused "FIFO" run "$D/m" "Hi" -n 2
done
echo "test_hostile_files: ok"

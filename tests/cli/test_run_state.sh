#!/usr/bin/env bash
# test_run_state.sh — `lumen run --save-state/--load-state` on the embedded model: a restored
# session continues exactly (same text, only the last prompt token fed again), and a state
# file from another model, another cache plan, or a truncated one is refused with a clear error.
set -euo pipefail
LUMEN=${LUMEN_BIN:?}
M=models/lumen-tiny-kjv
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export LUMEN_CACHE_DIR="$D/cache" # the weights' digests, kept out of the user's cache

# the temporary files of saves that were interrupted (killed mid-write) go with the next save
# to the directory; other files stay
printf 'half' >"$D/s.lms.tmp-Ab3xYz"
printf 'half' >"$D/other.lms.tmp-000000"
printf 'keep' >"$D/notes.tmp-1"
a=$("$LUMEN" run "$M" "Recite Psalm 23." --seed 3 -n 16 --save-state "$D/s.lms" 2>"$D/a.err")
[ -s "$D/s.lms" ] || fail "no state file written"
ls "$D" | grep -q 'lms.tmp' && fail "a temporary file was left behind: $(ls "$D")"
[ -f "$D/notes.tmp-1" ] || fail "an unrelated file was removed"
b=$("$LUMEN" run "$M" "Recite Psalm 23." --seed 3 -n 16 --load-state "$D/s.lms" 2>"$D/b.err")
[ "$a" = "$b" ] || fail "restored session differs: '$a' vs '$b'"
grep -q "prefill 1 tok" "$D/b.err" || fail "the restored prompt was prefilled again: $(cat "$D/b.err")"

expect_error() { # expect_error NEEDLE ARGS...: exit 1 and NEEDLE on stderr
  local needle=$1; shift
  if "$LUMEN" run "$@" >/dev/null 2>"$D/e.err"; then fail "succeeded: $*"; fi
  grep -q "$needle" "$D/e.err" || fail "expected '$needle' for $*, got: $(cat "$D/e.err")"
}
expect_error "kv:rotating-quant:8:64" "$M" "Hi" --load-state "$D/s.lms" --kv-quant 8
expect_error "another model" models/lumen-tiny-kjv-4bit "Hi" --load-state "$D/s.lms"
# the same checkpoint with one weight byte changed (same headers, same size) is another model;
# an unchanged copy is the same one
mkdir "$D/copy" "$D/flip"
cp "$M"/* "$D/copy/"
cp "$M"/* "$D/flip/"
b=$("$LUMEN" run "$D/copy" "Recite Psalm 23." --seed 3 -n 16 --load-state "$D/s.lms" 2>"$D/c.err") ||
  fail "a copied checkpoint refused the state: $(cat "$D/c.err")"
[ "$a" = "$b" ] || fail "the copy's restored session differs"
sz=$(stat -c %s "$D/flip/model.safetensors")
off=$((sz / 2))
orig=$(od -An -tu1 -j "$off" -N1 "$D/flip/model.safetensors" | tr -d ' ')
printf "$(printf '\\%03o' $(((orig + 1) % 256)))" |
  dd of="$D/flip/model.safetensors" bs=1 seek="$off" conv=notrunc status=none
cmp -s "$M/model.safetensors" "$D/flip/model.safetensors" && fail "the byte did not change"
expect_error "another model" "$D/flip" "Hi" --load-state "$D/s.lms"
ls "$D/cache/weights-digest" | grep -q . || fail "no weights digest was cached"
head -c 2000 "$D/s.lms" >"$D/t.lms"
expect_error "truncated" "$M" "Hi" --load-state "$D/t.lms"
expect_error "s.lms" "$M" "Hi" --load-state "$D/missing/s.lms"
expect_error "cannot" "$M" "Hi" -n 2 --save-state "$D/missing/dir/s.lms"
echo "test_run_state: ok"

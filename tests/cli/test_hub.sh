#!/usr/bin/env bash
# test_hub.sh — models by name against a local mock of the Hugging Face hub
# (tests/hub/mock_hub.py serving the embedded model as org/tiny): `lumen get` into the standard
# cache layout (blobs named by etag, relative snapshot links, refs/main), a download cut off and
# resumed with a Range request (on a second run, and within one run), LFS blobs checked against
# their sha256 (a corrupt one is refused and nothing of it stays), --include, a token the mock
# requires, a stalled server given up on, two concurrent downloads of one repository; then the
# model used by name (run, info, tokenize, serve's model id), `lumen ls`, and the messages for
# a model that is not cached, a directory that does not exist and one that is not a model.
set -euo pipefail
LUMEN=${LUMEN_BIN:?}
SRC=models/lumen-tiny-kjv
command -v python3 >/dev/null || { echo "python3 missing" >&2; exit 77; }
D=$(mktemp -d)
MOCK=
PID=
cleanup() {
  [ -n "$MOCK" ] && kill "$MOCK" 2>/dev/null
  [ -n "$PID" ] && kill "$PID" 2>/dev/null
  rm -rf "$D"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
. "$(dirname "$0")/lib.sh"
unset HF_HUB_CACHE HUGGINGFACE_HUB_CACHE HF_TOKEN HUGGING_FACE_HUB_TOKEN HF_TOKEN_PATH \
  HF_HUB_DISABLE_PROGRESS_BARS XDG_CACHE_HOME HF_HUB_DOWNLOAD_TIMEOUT HF_HUB_ETAG_TIMEOUT HF_HUB_OFFLINE

mock() { # mock ARGS...: (re)starts the mock hub; sets HF_ENDPOINT
  [ -n "$MOCK" ] && { kill "$MOCK"; wait "$MOCK" 2>/dev/null || true; }
  rm -f "$D/port"
  : >"$D/log"
  python3 tests/hub/mock_hub.py --repo "org/tiny=$SRC" --port-file "$D/port" --log "$D/log" \
    "$@" 2>"$D/mock.err" &
  MOCK=$!
  for _ in $(seq 1 100); do
    [ -s "$D/port" ] && break
    kill -0 "$MOCK" 2>/dev/null || fail "the mock hub exited: $(cat "$D/mock.err")"
    sleep 0.1
  done
  [ -s "$D/port" ] || fail "the mock hub did not start"
  export HF_ENDPOINT="http://127.0.0.1:$(cat "$D/port")"
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
git_oid() { python3 -c 'import hashlib,sys; d=open(sys.argv[1],"rb").read(); print(hashlib.sha1(b"blob %d\0" % len(d) + d).hexdigest())' "$1"; }

# ---- an interrupted download, resumed by the next run with a Range request ----------------------
export HF_HOME="$D/hf"
R="$HF_HOME/hub/models--org--tiny"
BIG=$(stat -c %s "$SRC/model.safetensors")
mock --cut-after 5000000
if "$LUMEN" get org/tiny --retries 0 >"$D/out" 2>"$D/err"; then fail "a cut download succeeded"; fi
grep -q "interrupted at 5000000 of $BIG bytes; run the command again to resume" "$D/err" ||
  fail "no resume hint: $(cat "$D/err")"
[ "$(stat -c %s "$R/blobs/$(sha "$SRC/model.safetensors").incomplete")" = 5000000 ] ||
  fail "the partial download is not kept"
[ ! -e "$R/refs/main" ] || fail "refs/main written before the snapshot was complete"
out=$("$LUMEN" run org/tiny "Hi" -n 2 2>&1) && fail "an incomplete snapshot resolved: $out"
snap=$(LUMEN_PROGRESS_AFTER=0 "$LUMEN" get org/tiny 2>"$D/err") || fail "resume: $(cat "$D/err")"
grep -q "^lumen get: org/tiny@main is commit .*; [0-9]* already cached; resuming after 5.0 MB$" "$D/err" ||
  fail "no summary of what is cached: $(cat "$D/err")"
grep -q "^download: 18.* MB in " "$D/err" || fail "no progress line: $(cat "$D/err")"
grep -q "GET /lfs-cdn/$(sha "$SRC/model.safetensors") range=bytes=5000000-" "$D/log" ||
  fail "no Range request in the mock's log: $(cat "$D/log")"
commit=$(cat "$R/refs/main")
[ "$snap" = "$R/snapshots/$commit" ] || fail "stdout '$snap' is not the snapshot of $commit"

# ---- the layout huggingface_hub reads ------------------------------------------------------------
for f in "$SRC"/*; do
  n=$(basename "$f")
  case "$n" in *.safetensors | tokenizer.json) etag=$(sha "$f") ;; *) etag=$(git_oid "$f") ;; esac
  [ "$(readlink "$snap/$n")" = "../../blobs/$etag" ] || fail "$n: link $(readlink "$snap/$n")"
  cmp -s "$f" "$R/blobs/$etag" || fail "$n: the blob differs from the source"
done
[ -z "$(find "$R" -name '*.incomplete')" ] || fail "an .incomplete file is left"
[ -e "$HF_HOME/hub/.locks/models--org--tiny/$(sha "$SRC/model.safetensors").lock" ] ||
  fail "no lock file where huggingface_hub keeps them"
# a second get finds everything cached: no content is fetched again
: >"$D/log"
"$LUMEN" get org/tiny --quiet >/dev/null 2>"$D/err" || fail "cached get: $(cat "$D/err")"
[ ! -s "$D/err" ] || fail "--quiet printed: $(cat "$D/err")"
if grep -q "^GET /lfs-cdn" "$D/log"; then fail "a cached blob was fetched again"; fi

# ---- the model by name ---------------------------------------------------------------------------
out=$("$LUMEN" run org/tiny "In the beginning" -n 5 2>"$D/err") || fail "run org/tiny: $(cat "$D/err")"
[ -n "$out" ] || fail "run org/tiny printed nothing"
"$LUMEN" info org/tiny | grep -q "cache plan:" || fail "info org/tiny"
"$LUMEN" info "org/tiny@$commit" | grep -q "cache plan:" || fail "info org/tiny@COMMIT"
"$LUMEN" tokenize org/tiny --text "In the beginning" | grep -q '\[' || fail "tokenize org/tiny"
"$LUMEN" ls >"$D/ls" || fail "ls"
grep -E "^org/tiny +main \(${commit:0:8}\) +23\.[0-9] MB +Gemma4ForConditionalGeneration +bf16 +yes" \
  "$D/ls" >/dev/null || fail "ls: $(cat "$D/ls")"
"$LUMEN" ls --json >"$D/ls.json"
python3 - "$D/ls.json" "$SRC" "$commit" <<'PY'
import json, os, sys
rows = json.load(open(sys.argv[1]))
src, commit = sys.argv[2], sys.argv[3]
assert len(rows) == 1, rows
r = rows[0]
size = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
assert r["id"] == "org/tiny" and r["runnable"] is True and r["reason"] is None, r
assert r["size_bytes"] == size, (r["size_bytes"], size)
assert r["revisions"] == [{"ref": "main", "commit": commit}], r["revisions"]
assert r["architecture"] == "Gemma4ForConditionalGeneration" and r["quantization"] == "bf16", r
PY
# serve reports the model by its name, not by the snapshot's commit folder
if command -v curl >/dev/null; then
  lm_serve_start "$D/srv.out" "$D/srv.err" 30 org/tiny --host 127.0.0.1 --port 0 --parallel 1
  curl -s "http://127.0.0.1:$PORT/v1/models" | grep -q '"id": *"org/tiny"' || fail "model id"
  kill "$PID"
  wait "$PID" || true
  PID=
fi

# ---- names that resolve to nothing ---------------------------------------------------------------
if "$LUMEN" run nobody/nothing "Hi" >/dev/null 2>"$D/e"; then fail "nobody/nothing ran"; fi
grep -q "not in your Hugging Face cache" "$D/e" && grep -q "lumen get nobody/nothing" "$D/e" ||
  fail "missing model: $(cat "$D/e")"
if "$LUMEN" info org/tiny@v9 >/dev/null 2>"$D/e"; then fail "org/tiny@v9 resolved"; fi
grep -q "not its revision 'v9'.*lumen get org/tiny@v9" "$D/e" || fail "missing rev: $(cat "$D/e")"
if "$LUMEN" run ./nope "Hi" >/dev/null 2>"$D/e"; then fail "./nope ran"; fi
grep -q "./nope: no such directory" "$D/e" || fail "missing directory: $(cat "$D/e")"
mkdir "$D/empty"
if "$LUMEN" run "$D/empty" "Hi" >/dev/null 2>"$D/e"; then fail "an empty directory ran"; fi
grep -q "is not a model directory (no config.json" "$D/e" || fail "not a model: $(cat "$D/e")"
if "$LUMEN" generate "$D/empty" --ids 2 >/dev/null 2>"$D/e"; then fail "generate: empty dir"; fi
grep -q "is not a model directory" "$D/e" || fail "generate: not a model: $(cat "$D/e")"

# ---- the hub's refusals --------------------------------------------------------------------------
if "$LUMEN" get not-a-repo-name >/dev/null 2>"$D/e"; then fail "a bad name was fetched"; fi
grep -q "not a repository name of the form ORG/REPO" "$D/e" || fail "bad name: $(cat "$D/e")"
if "$LUMEN" get org/other >/dev/null 2>"$D/e"; then fail "an unknown repo was fetched"; fi
grep -q "HTTP 401" "$D/e" && grep -q "set HF_TOKEN" "$D/e" || fail "unknown repo: $(cat "$D/e")"
if "$LUMEN" get org/tiny@nobranch >/dev/null 2>"$D/e"; then fail "an unknown revision"; fi
grep -q "has no revision 'nobranch'" "$D/e" || fail "unknown revision: $(cat "$D/e")"
if HF_HUB_OFFLINE=1 "$LUMEN" get org/tiny >/dev/null 2>"$D/e"; then fail "offline get"; fi
grep -q "HF_HUB_OFFLINE is set" "$D/e" || fail "offline: $(cat "$D/e")"
if HF_ENDPOINT=ftp://x "$LUMEN" get org/tiny >/dev/null 2>"$D/e"; then fail "ftp endpoint"; fi
grep -q "HF_ENDPOINT 'ftp://x' is not an http" "$D/e" || fail "endpoint: $(cat "$D/e")"

# ---- --include: only the files asked for ---------------------------------------------------------
export HF_HOME="$D/hf-json"
R="$HF_HOME/hub/models--org--tiny"
snap=$("$LUMEN" get org/tiny --include '*.json' --quiet) || fail "--include"
want=$(cd "$SRC" && ls -1 ./*.json | wc -l)
[ "$(ls -1 "$snap" | wc -l)" = "$want" ] || fail "--include '*.json': $(ls "$snap")"
[ "$(ls -1 "$R/blobs" | wc -l)" = "$want" ] || fail "--include fetched other blobs"
[ ! -e "$snap/model.safetensors" ] || fail "--include fetched the weights"
"$LUMEN" ls | grep -q "no: no weights" || fail "ls of a json-only snapshot: $("$LUMEN" ls)"
if "$LUMEN" get org/tiny --include 'nothing*' >/dev/null 2>"$D/e"; then fail "empty include"; fi
grep -q "no file matches" "$D/e" || fail "empty --include: $(cat "$D/e")"

# ---- a token the hub requires --------------------------------------------------------------------
mock --token s3cret
export HF_HOME="$D/hf-token"
if "$LUMEN" get org/tiny --include '*.json' >/dev/null 2>"$D/e"; then fail "got without a token"; fi
grep -q "HTTP 401" "$D/e" && grep -q "set HF_TOKEN" "$D/e" || fail "401 message: $(cat "$D/e")"
if HF_TOKEN=wrong "$LUMEN" get org/tiny --include '*.json' >/dev/null 2>"$D/e"; then
  fail "got with a wrong token"
fi
grep -q "did not accept the token from HF_TOKEN" "$D/e" || fail "wrong token: $(cat "$D/e")"
HF_TOKEN=s3cret "$LUMEN" get org/tiny --quiet >/dev/null 2>"$D/e" || fail "token: $(cat "$D/e")"
grep -q "GET /api/models/org/tiny/revision/main range=- auth=yes" "$D/log" || fail "no auth sent"
export HF_HOME="$D/hf-tokenfile"
mkdir -p "$HF_HOME"
printf 's3cret\n' >"$HF_HOME/token"
"$LUMEN" get org/tiny --include '*.json' --quiet >/dev/null 2>"$D/e" ||
  fail "token file: $(cat "$D/e")"

# ---- a corrupt LFS blob is refused and not kept --------------------------------------------------
mock --corrupt
export HF_HOME="$D/hf-corrupt"
R="$HF_HOME/hub/models--org--tiny"
if "$LUMEN" get org/tiny --quiet >/dev/null 2>"$D/e"; then fail "a corrupt blob was accepted"; fi
grep -q "the download is corrupt: its SHA-256 is" "$D/e" || fail "corrupt: $(cat "$D/e")"
[ -z "$(find "$R/blobs" -name "$(sha "$SRC/model.safetensors")*")" ] || fail "the corrupt blob stays"
[ ! -e "$R/snapshots/$commit/model.safetensors" ] || fail "a link to the corrupt blob"

# ---- a hostile file list: garbage, and a name that would leave the cache ------------------------
mock --bad-json
export HF_HOME="$D/hf-hostile"
if "$LUMEN" get org/tiny >/dev/null 2>"$D/e"; then fail "garbage JSON accepted"; fi
grep -q "the revision's JSON does not parse" "$D/e" || fail "garbage JSON: $(cat "$D/e")"
mock --extra-sibling ../../../escaped.json
if "$LUMEN" get org/tiny >/dev/null 2>"$D/e"; then fail "an escaping file name was accepted"; fi
grep -q "'../../../escaped.json' is not a safe relative file path" "$D/e" ||
  fail "escaping name: $(cat "$D/e")"
[ -z "$(find "$D" -name escaped.json)" ] || fail "a file was written outside the cache"

# ---- a stalled server is given up on; a cut transfer resumes within one run ----------------------
mock --stall-after 1000000
export HF_HOME="$D/hf-stall"
start=$(date +%s)
if HF_HUB_DOWNLOAD_TIMEOUT=2 timeout 60 "$LUMEN" get org/tiny --retries 0 >/dev/null 2>"$D/e"; then
  fail "a stalled download succeeded"
fi
[ $(($(date +%s) - start)) -lt 30 ] || fail "the stall was waited out too long"
grep -q "download interrupted at 1000000 of $BIG bytes" "$D/e" || fail "stall: $(cat "$D/e")"
mock --cut-after 3000000
export HF_HOME="$D/hf-retry"
"$LUMEN" get org/tiny >/dev/null 2>"$D/e" || fail "in-run retry: $(cat "$D/e")"
grep -q "retrying from byte 3000000" "$D/e" || fail "no retry message: $(cat "$D/e")"
grep -q "range=bytes=3000000-" "$D/log" || fail "the retry did not resume"

# ---- two downloads of one repository at once -----------------------------------------------------
mock --rate 8000000
export HF_HOME="$D/hf-two"
R="$HF_HOME/hub/models--org--tiny"
"$LUMEN" get org/tiny >"$D/a.out" 2>"$D/a.err" &
A=$!
"$LUMEN" get org/tiny >"$D/b.out" 2>"$D/b.err" &
B=$!
wait "$A" || fail "first concurrent get: $(cat "$D/a.err")"
wait "$B" || fail "second concurrent get: $(cat "$D/b.err")"
[ "$(cat "$D/a.out")" = "$(cat "$D/b.out")" ] || fail "the two gets disagree"
[ "$(sha "$R/blobs/$(sha "$SRC/model.safetensors")")" = "$(sha "$SRC/model.safetensors")" ] ||
  fail "the blob is not intact"
[ "$(grep -c "^GET /lfs-cdn/$(sha "$SRC/model.safetensors")" "$D/log")" = 1 ] ||
  fail "the weights were downloaded $(grep -c "^GET /lfs-cdn/$(sha "$SRC/model.safetensors")" "$D/log") times"
[ -z "$(find "$R" -name '*.incomplete' -o -name '*.lumen-*')" ] || fail "leftovers"
"$LUMEN" run org/tiny "Hi" -n 2 >/dev/null 2>"$D/e" || fail "run after concurrent gets: $(cat "$D/e")"

echo "test_hub: ok"

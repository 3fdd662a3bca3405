#!/usr/bin/env bash
# tools/gpu/serve_bench.sh — the server benchmark on the GPU machine in one go.
#
# Here: builds lumen and the load generator (test_server_load) with the CUDA backend, and
# packs them into .carry/srv-gpu/ with the libraries the GPU machine lacks, the E4B preset,
# and a tokenizer directory (the Gemma 4 tokenizer.json derived by the tokenizer-goldens
# test — run `make test` once first —, the E2B/E4B chat template, a generation_config.json).
# There, from the repository root (carry .carry/srv-gpu):
#
#     bash .carry/srv-gpu/run.sh         # RUNS="1:4 8:2 32:2 64:2" TEMPS="0 1" by default
#
# run.sh starts `lumen serve` on a synthetic E4B (4-bit g64, random weights) and runs the load
# generator at each clients:requests pair: aggregate tok/s and TTFT p50/p99, logs under $OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
PACK=$ROOT/.carry/srv-gpu
SHARED=$ROOT/../shared
TOK=${TOKENIZER_JSON:-$ROOT/build/testdata/gemma4-tokenizer.json}
[ -s "$TOK" ] || { echo "no Gemma 4 tokenizer at $TOK (run make test, or set TOKENIZER_JSON)"; exit 1; }
if [[ -z "${SKIP_BUILD:-}" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -DLUMEN_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j"${JOBS:-2}" --target lumen test_server_load
fi
rm -rf "$PACK"
mkdir -p "$PACK/bin" "$PACK/lib" "$PACK/presets" "$PACK/tok"
cp "$BUILD/lumen" "$BUILD/test_server_load" "$PACK/bin/"
strip --strip-debug "$PACK"/bin/*
bash "$ROOT/tools/gpu/pack_libs.sh" "$PACK"
cp "$SHARED/presets/gemma4-e4b.json" "$PACK/presets/"
cp "$TOK" "$PACK/tok/tokenizer.json"
cp "$SHARED/testdata/gemma4/chat_template.e2b-e4b.jinja" "$PACK/tok/chat_template.jinja"
echo '{"eos_token_id":[1,106,50],"top_k":64,"top_p":0.95,"temperature":1.0}' >"$PACK/tok/generation_config.json"
cat >"$PACK/run.sh" <<'RUN'
#!/usr/bin/env bash
set -uo pipefail
P=.carry/srv-gpu
OUT=${OUT:-$PWD/srv-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/summary.txt"
"$P/bin/lumen" serve --preset "$P/presets/gemma4-e4b.json" --tokenizer "$P/tok" --bits 4 --backend cuda --port 0 \
  --parallel "${PAR:-64}" --ctx 4096 --memory-budget 100 --queue-size 1024 --chunk "${CHUNK:-512}" \
  >"$OUT/serve.out" 2>"$OUT/serve.err" &
SP=$!
PORT=
for _ in $(seq 1 1800); do
  PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\)/v1.*|\1|p' "$OUT/serve.out")
  [ -n "$PORT" ] && break
  kill -0 $SP 2>/dev/null || break
  sleep 0.1
done
tee -a "$OUT/summary.txt" <"$OUT/serve.out"
[ -n "$PORT" ] || { echo "no server"; tail -5 "$OUT/serve.err"; exit 1; }
B="$P/bin/test_server_load --bench --port $PORT"
timeout 120 $B --clients 2 --requests 1 --max-tokens 16 --prompt-words 100 --temperature 0 >"$OUT/warmup.txt" 2>&1
for run in ${RUNS:-1:4 8:2 32:2 64:2}; do
  c=${run%%:*} r=${run##*:}
  for t in ${TEMPS:-0 1}; do
    echo "temperature $t: $(timeout 240 $B --clients "$c" --requests "$r" --max-tokens "${MAXTOK:-128}" \
      --prompt-words 100 --temperature "$t" 2>&1)" | tee -a "$OUT/summary.txt"
  done
done
kill -INT $SP
wait $SP
echo "server exit $?" | tee -a "$OUT/summary.txt"
RUN
chmod +x "$PACK/run.sh"
du -sh "$PACK"

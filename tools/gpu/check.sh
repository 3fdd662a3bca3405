#!/usr/bin/env bash
# tools/gpu/check.sh — the whole GPU check in one go.
#
# Here (a machine with nvcc, no GPU needed): builds the CUDA backend (-DLUMEN_CUDA=ON,
# sm_90), packs lumen, the CUDA test binaries, the shared libraries the GPU machine lacks
# (utf8proc, cmocka, libmicrohttpd: it has jansson, PCRE2, OpenBLAS and CUDA's own cuBLAS)
# and the presets into .carry/gpu/ (git-ignored), writes .carry/gpu/run.sh, and prints the
# command to run on the GPU machine from the repository root:
#
#     OUT=/some/dir bash .carry/gpu/run.sh
#
# (copy the repository with .carry/gpu to the GPU machine first). run.sh runs the CUDA op
# tests, the CUDA parity tests (fixtures under tests/fixtures travel with the repository) and
# `lumen bench --backend cuda` on the presets (decode at 512 and, for E4B and 12B, at 32k
# context; prefill), with logs under $OUT; it is sized to finish in about 6 minutes on an H200.
#
# Options: BUILD_DIR (default build-gpu), JOBS (default 2), SKIP_BUILD=1 to pack an existing build.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-gpu}
JOBS=${JOBS:-2}
PACK=$ROOT/.carry/gpu
SHARED=$ROOT/../shared

if [[ -z "${SKIP_BUILD:-}" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -DLUMEN_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j"$JOBS" --target lumen test_cuda_ops test_cuda_parity
fi

rm -rf "$PACK"
mkdir -p "$PACK/bin" "$PACK/lib" "$PACK/presets"
for b in lumen test_cuda_ops test_cuda_parity; do
  cp "$BUILD/$b" "$PACK/bin/"
  strip --strip-debug "$PACK/bin/$b"
done

bash "$ROOT/tools/gpu/pack_libs.sh" "$PACK"

cp "$SHARED"/presets/*.json "$PACK/presets/"
cp "$ROOT"/tools/gpu/profile.sh "$ROOT"/tools/gpu/ncu_table.py "$PACK/"

cat > "$PACK/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU machine from the repository root; logs go to $OUT (default ./gpu-out).
set -uo pipefail
P=.carry/gpu
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$P/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
export LUMEN_FIXTURES="$PWD/tests/fixtures" LUMEN_PRESETS="$PWD/$P/presets" CMOCKA_MESSAGE_OUTPUT=STDOUT
L="$P/bin/lumen"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  ldd "$L" | grep -E "not found|cublas" || true
} 2>&1 | tee "$OUT/summary.txt"
step() { # name timeout command...
  local name=$1 t=$2; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  printf '%-28s rc=%-3d %4ds\n' "$name" "$rc" $((SECONDS - t0)) | tee -a "$OUT/summary.txt"
  return 0
}
step ops 90 "$P/bin/test_cuda_ops"
step parity 150 "$P/bin/test_cuda_parity"
B="--backend cuda --bits 4 --group 64"
D="--decode-tokens 64 --reps 3"
step bench_e4b 160 "$L" bench $B --preset "$P/presets/gemma4-e4b.json" --prompt 512,4096 --context 512,32768 $D
step profile_e4b 60 env LUMEN_CUDA_PROFILE=1 "$L" bench $B --preset "$P/presets/gemma4-e4b.json" --prompt 4096 \
  --context 512 --decode-tokens 16 --reps 1 --warmup 0
step bench_26b 80 "$L" bench $B --preset "$P/presets/gemma4-26b-a4b.json" --prompt 128 --context 512 $D
step bench_12b 200 "$L" bench $B --preset "$P/presets/gemma4-12b.json" --prompt 512 --context 512,32768 $D
step bench_31b 90 "$L" bench $B --preset "$P/presets/gemma4-31b.json" --prompt 512 --context 512 $D
echo "== failures and results =="
grep -A100 "cuda profile" "$OUT/profile_e4b.log" | grep -v "m<=4096" | head -60 || true
for f in "$OUT"/*.log; do
  echo "-- $(basename "$f")"
  grep -E "FAIL|rror|failed|PASSED|SKIPPED|tok/s|bandwidth|device |plan|fixtures checked|^  [a-z0-9_-]+ .*(ok|FAIL)$" "$f" | head -70
done
RUN
chmod +x "$PACK/run.sh"

du -sh "$PACK"
echo
echo "GPU machine command (from the repository root, carry .carry/gpu):"
echo "  bash .carry/gpu/run.sh"

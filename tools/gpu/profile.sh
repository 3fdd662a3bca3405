#!/usr/bin/env bash
# tools/gpu/profile.sh — on the GPU machine, from the repository root after tools/gpu/check.sh
# packed .carry/gpu: times every kernel of one graph-replayed decode step with ncu
# (LUMEN_CUDA_PROFILE_STEP selects the step; kernels run serialized, so the sum is a little
# above the step's real time) and prints the per-kernel table.
#   MODELS="e4b 26b-a4b" CTX=512 bash .carry/gpu/profile.sh      (logs under $OUT)
set -uo pipefail
P=.carry/gpu
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$P/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
for m in ${MODELS:-e4b}; do
  LUMEN_CUDA_PROFILE_STEP=3 timeout 300 ncu --profile-from-start off --graph-profiling node --clock-control none \
    --cache-control none --metrics gpu__time_duration.sum --csv --print-units base --log-file "$OUT/ncu_$m.csv" \
    "$P/bin/lumen" bench --backend cuda --bits 4 --group 64 --preset "$P/presets/gemma4-$m.json" --prompt 16 \
    --context "${CTX:-512}" --decode-tokens 4 --reps 1 --warmup 0 >"$OUT/ncu_run_$m.log" 2>&1
  echo "ncu $m rc=$?"
  python3 "$P/ncu_table.py" "$OUT/ncu_$m.csv"
done

#!/usr/bin/env bash
# test_bench_cpu.sh — `lumen bench` on the CPU with the embedded model: the read-bandwidth
# probe reports its best pass with the median and slowest (best >= median >= slowest > 0), the
# decode figures are there (their share of the probe passes taken around the decode runs, and
# of the first probe), and the decode steps ran as one parallel region each.
set -euo pipefail
LUMEN=${LUMEN_BIN:?}
M=models/lumen-tiny-kjv
fail() { echo "FAIL: $*"; exit 1; }

args=(bench "$M" --backend cpu --prompt 4 --context 8 --decode-tokens 4 --reps 1 --warmup 0)
json=$("$LUMEN" "${args[@]}" --json 2>/dev/null) || fail "bench --json failed"
python3 - "$json" <<'PY'
import json, sys
b = json.loads(sys.argv[1])
best, med, slow = b["read_bandwidth_gbs"], b["read_bandwidth_median_gbs"], b["read_bandwidth_slowest_gbs"]
assert best >= med >= slow > 0, (best, med, slow)
d = b["decode"][0]
assert d["context"] == 8 and d["tok_s"] > 0 and d["bandwidth_pct"] > 0, d
# the decode's share is of the probe passes taken around its runs, and says so
near = d["probe_around_runs_gbs"]
assert near > 0 and abs(d["bandwidth_pct"] - 100 * d["gb_s"] / near) < 0.2, d
assert abs(d["first_probe_pct"] - 100 * d["gb_s"] / best) < 0.2, d
PY
out=$("$LUMEN" "${args[@]}" 2>&1) || fail "bench failed: $out"
grep -q "read bandwidth: best pass .* median .* slowest" <<<"$out" || fail "no probe spread: $out"
grep -q "of the bandwidth measured around its runs (best pass" <<<"$out" || fail "no near probe: $out"
grep -q "cpu decode steps: 4 as one region" <<<"$out" || fail "decode steps not run as a team: $out"
echo "test_bench_cpu: ok"

#!/usr/bin/env bash
# test_quantize_target.sh — `lumen quantize --target-bpw` on the embedded model (a small sweep:
# two widths, one group, 24 calibration tokens): the plan stays within the budget and mixes the
# widths, the checkpoint loads and carries one override per module off the default kind, a
# saved table gives the same plan without measuring, `quant-eval` compares the result with
# its source, a KV plan by measurement is written and read back, and wrong uses fail with a
# message.
set -euo pipefail
LUMEN=${LUMEN_BIN:?}
M=models/lumen-tiny-kjv
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

args=(--target-bpw 5 --bits-set 3,6 --groups 64 --calib-tokens 24)
out=$("$LUMEN" quantize "$M" "$T/q" "${args[@]}" --table "$T/t.json" 2>"$T/err") ||
  fail "quantize --target-bpw failed: $(cat "$T/err")"
plan=$(grep '^plan for --target-bpw 5' <<<"$out") || fail "no plan line: $out"
grep -q 'measured .* modules x 2 kinds on 24 calibration tokens' "$T/err" || fail "no sweep line"
python3 - "$T" "$plan" <<'PY'
import json, re, sys
d, plan = sys.argv[1], sys.argv[2]
bpw = float(re.search(r": ([0-9.]+) bits per weight", plan).group(1))
assert 4.9 < bpw <= 5.0, plan                      # within the budget, and using it
assert "3/64" in plan and "6/64" in plan, plan     # both widths chosen somewhere
q = json.load(open(d + "/q/config.json"))["quantization"]
default = (q["bits"], q["group_size"])
over = {k: v for k, v in q.items() if isinstance(v, dict)}
assert over and all((v["bits"], v["group_size"]) != default for v in over.values()), q
t = json.load(open(d + "/t.json"))
assert t["format"] == "lumen-quant-sweep-1" and t["calib_tokens"] == 24
chosen = {m["module"]: t["kinds"][m["chosen"]] for m in t["modules"]}
for m, k in chosen.items():
    key = "language_model.model." + m
    if (k["bits"], k["group_size"]) != default:
        assert over[key] == {"group_size": k["group_size"], "bits": k["bits"]}, (m, k)
    else:
        assert key not in over, m
PY
"$LUMEN" info "$T/q" >/dev/null || fail "the mixed checkpoint does not load"
again=$("$LUMEN" quantize "$M" "$T/q2" --target-bpw 5 --from-table "$T/t.json" 2>/dev/null) ||
  fail "--from-table failed"
[ "$(grep '^plan for' <<<"$again")" = "$plan" ] || fail "--from-table planned differently"
cmp -s "$T/q/model.safetensors" "$T/q2/model.safetensors" || fail "--from-table wrote other bytes"

ev=$("$LUMEN" quant-eval "$M" "$T/q" --ids-file tests/fixtures/lumen-tiny-kjv/ids.txt 2>&1) ||
  fail "quant-eval failed: $ev"
grep -q "(reference)" <<<"$ev" && grep -q "^$T/q " <<<"$ev" || fail "quant-eval output: $ev"

# a KV plan by measurement: within the budget, written as kv_config.json, and measured as written
kv=$("$LUMEN" kv-eval "$M" --ids-file tests/fixtures/lumen-tiny-kjv/ids.txt --write-config "$T/kv.json" \
  --target-bytes-per-token 700 2>/dev/null) || fail "kv-eval --write-config failed"
bpt=$(sed -n 's/^plan: \([0-9]*\) KV bytes per token.*/\1/p' <<<"$kv")
[ -n "$bpt" ] && [ "$bpt" -le 700 ] || fail "kv plan over budget: $kv"
grep -q "kv.json as written: mean KL" <<<"$kv" || fail "the written plan was not measured: $kv"
python3 -c "import json,sys; a=json.load(open(sys.argv[1])); assert a and all(set(e)=={'layer_idx','bits','group_size'} for e in a)" "$T/kv.json"
"$LUMEN" generate "$M" --ids 2,642,477 -n 4 --kv-quant config --kv-config "$T/kv.json" >/dev/null 2>&1 ||
  fail "generate does not take the written kv_config.json"

expect_fail() { # message, then the command
  local msg=$1; shift
  if err=$("$LUMEN" "$@" 2>&1); then fail "succeeded: $*"; fi
  grep -q -- "$msg" <<<"$err" || fail "wanted '$msg' from $*: $err"
}
expect_fail "does not combine" quantize "$M" "$T/x" --target-bpw 4 --bits 4
expect_fail "below the smallest plan" quantize "$M" "$T/x" --target-bpw 3.2 --from-table "$T/t.json"
expect_fail "go with --target-bpw" quantize "$M" "$T/x" --calib "$T/t.json"
expect_fail "measured on another model" quantize tests/fixtures/e2b_like "$T/x" --target-bpw 5 \
  --from-table "$T/t.json"
expect_fail "below the smallest plan" kv-eval "$M" --ids-file tests/fixtures/lumen-tiny-kjv/ids.txt \
  --write-config "$T/x.json" --target-bytes-per-token 10
expect_fail "want --write-config" kv-eval "$M" --ids-file tests/fixtures/lumen-tiny-kjv/ids.txt --max-kl 1
python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
t = json.load(open(d + "/t.json"))
t["kinds"][0]["bits"] = 7                        # not an MLX kind
json.dump(t, open(d + "/bad1.json", "w"))
t = json.load(open(d + "/t.json"))
t["modules"][3]["kl"] = t["modules"][3]["kl"][:1]  # a row that does not match the kinds
json.dump(t, open(d + "/bad2.json", "w"))
PY
for b in bad1 bad2; do
  expect_fail "not a table" quantize "$M" "$T/x" --target-bpw 5 --from-table "$T/$b.json"
done
printf '{"calib_tokens": 1' >"$T/bad3.json"
expect_fail "from-table" quantize "$M" "$T/x" --target-bpw 5 --from-table "$T/bad3.json"
echo "test_quantize_target: ok"

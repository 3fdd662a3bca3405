#!/usr/bin/env bash
# make demo: runs lumen on a model committed to the repository. Until the embedded demo model
# lands this is a reference fixture (random weights of a tiny Gemma 4 E2B-like geometry):
# `lumen info`, then a greedy continuation as token ids.
set -euo pipefail
LUMEN=${1:-build/lumen}
MODEL=tests/fixtures/e2b_like
echo "== lumen info $MODEL"
"$LUMEN" info "$MODEL"
IDS=$(head -c 200 "$MODEL/ids.txt" | cut -d, -f1-12)
echo
echo "== lumen generate $MODEL --ids $IDS -n 16"
"$LUMEN" generate "$MODEL" --ids "$IDS" -n 16

#!/usr/bin/env bash
# make demo: lumen on its embedded model, models/lumen-tiny-kjv — an 11.5M-parameter Gemma 4
# (sliding/full layers, per-layer embeddings, KV sharing) trained by tools/train_tiny on the
# King James Bible. A chat turn through the model's own template, then a raw completion;
# fixed seeds, so the text is the same on every machine.
set -euo pipefail
LUMEN=${1:-build/lumen}
MODEL=models/lumen-tiny-kjv
run() {
  echo
  printf '$ lumen run'
  for a in "$@"; do [[ $a =~ [^[:alnum:]./_-] ]] && printf ' "%s"' "$a" || printf ' %s' "$a"; done
  echo
  "$LUMEN" run "$@"
}
run "$MODEL" "Who are you?" --seed 1
run "$MODEL" "Recite Psalm 23." --seed 3 -n 120
run "$MODEL" --raw "In the beginning God" --seed 2 -n 90 --temp 0.8 --repeat-penalty 1.15
cat <<'NEXT'

Next: a chat in the browser (`build/lumen serve models/lumen-tiny-kjv`, then open
http://127.0.0.1:8080/), or a model from the hub (`build/lumen get google/gemma-4-E2B-it`, then
`build/lumen run google/gemma-4-E2B-it "Hello"`). The README's "first hour" tells more.
NEXT

#!/bin/sh
# scripts/bench_compare_cpu.sh — two loom builds side by side on this CPU: the
# no-regression check of a change. Alternates the binaries ROUNDS times (default 3) so
# drift of the machine falls on both: `loom bench prefill` (prompt 512, best of 2) and
# `loom bench decode` (prompt 16, 32 new tokens, best of 3); prints one JSON line per
# run and, at the end, the best of each and the new/old ratios.
# Usage: sh scripts/bench_compare_cpu.sh OLD/loom NEW/loom MODEL_DIR [ROUNDS]
set -eu
old=${1:?usage: bench_compare_cpu.sh OLD NEW MODEL [ROUNDS]} new=${2:?} model=${3:?} rounds=${4:-3}
out=$(mktemp)
i=0
while [ "$i" -lt "$rounds" ]; do
  for tag in old new; do
    bin=$old; [ "$tag" = new ] && bin=$new
    p=$("$bin" bench prefill --model "$model" --prompt 512 --repeat 2 | tail -n 1)
    d=$("$bin" bench decode --model "$model" --prompt 16 --tokens 32 --repeat 3 | tail -n 1)
    echo "$tag prefill $p" | tee -a "$out"
    echo "$tag decode $d" | tee -a "$out"
  done
  i=$((i + 1))
done
python3 - "$out" <<'PY'
import json, sys
best = {}
for line in open(sys.argv[1]):
    tag, kind, js = line.split(" ", 2)
    r = json.loads(js)
    k = (tag, kind)
    best[k] = max(best.get(k, 0.0), r["tok_per_s"])
for kind in ("prefill", "decode"):
    o, n = best[("old", kind)], best[("new", kind)]
    print(f"{kind}: old {o:.2f} tok/s, new {n:.2f} tok/s, new/old {n / o:.3f}")
PY
rm -f "$out"

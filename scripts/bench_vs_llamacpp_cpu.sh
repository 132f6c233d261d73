#!/bin/sh
# scripts/bench_vs_llamacpp_cpu.sh — loom beside llama.cpp on this CPU, same weights:
# loom's bf16 / int8 / int4 (G=32) against llama.cpp's BF16 / Q8_0 / Q4_0 GGUF files
# written from the same checkpoint (scripts/gguf_from_hf.py, then llama-quantize).
# Interleaves the two engines ROUNDS times (default 3) so drift of a shared machine falls
# on both; decode = 64 new tokens after a short prompt (loom: prompt 16; llama-bench tg64
# from an empty context), prefill = 512 prompt tokens; 2 threads each. Prints one line
# per run and the medians with loom/llama.cpp ratios at the end.
# Usage: sh scripts/bench_vs_llamacpp_cpu.sh LOOM LLAMA_CPP_BIN_DIR MODEL_DIR GGUF_PREFIX [ROUNDS]
#   GGUF_PREFIX-bf16.gguf, GGUF_PREFIX-q8_0.gguf and GGUF_PREFIX-q4_0.gguf must exist.
#   LOOM_OPTS adds options to loom's runs (e.g. "--precision fast"); FORMATS picks the
#   pairs (default "bf16 int8 int4").
set -eu
loom=${1:?usage: bench_vs_llamacpp_cpu.sh LOOM LLAMA_BIN MODEL GGUF_PREFIX [ROUNDS]} bin=${2:?} model=${3:?}
gguf=${4:?} rounds=${5:-3}
out=$(mktemp)
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
i=0
while [ "$i" -lt "$rounds" ]; do
  for f in ${FORMATS:-bf16 int8 int4}; do
    case $f in bf16) set -- bf16 bf16 ;; int8) set -- int8 q8_0 ;; int4) set -- int4 q4_0 ;; *) echo "unknown format $f" >&2; exit 2 ;; esac
    d=$("$loom" bench decode --model "$model" --weights "$1" ${LOOM_OPTS:-} --threads 2 --prompt 16 --tokens 64 --repeat 1 | tail -n 1)
    echo "loom $1 decode $d" | tee -a "$out"
    d=$("$bin/llama-bench" -m "$gguf-$2.gguf" -t 2 -p 0 -n 64 -r 1 -o json 2>/dev/null | tr -d '\n')
    echo "llama.cpp $2 decode $d" | tee -a "$out"
    p=$("$loom" bench prefill --model "$model" --weights "$1" ${LOOM_OPTS:-} --threads 2 --prompt 512 --repeat 1 | tail -n 1)
    echo "loom $1 prefill $p" | tee -a "$out"
    p=$("$bin/llama-bench" -m "$gguf-$2.gguf" -t 2 -p 512 -n 0 -r 1 -o json 2>/dev/null | tr -d '\n')
    echo "llama.cpp $2 prefill $p" | tee -a "$out"
  done
  i=$((i + 1))
done
python3 - "$out" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    engine, fmt, kind, js = line.split(" ", 3)
    r = json.loads(js)
    tps = r["tok_per_s"] if engine == "loom" else r[0]["avg_ts"]
    runs.setdefault((engine, fmt, kind), []).append(tps)
pairs = [("bf16", "bf16"), ("int8", "q8_0"), ("int4", "q4_0")]
print("| weights (loom / llama.cpp) | test | loom tok/s | llama.cpp tok/s | loom / llama.cpp |")
print("|---|---|---:|---:|---:|")
for kind in ("decode", "prefill"):
    for a, b in pairs:
        x, y = runs.get(("loom", a, kind)), runs.get(("llama.cpp", b, kind))
        if not x or not y:
            continue
        mx, my = statistics.median(x), statistics.median(y)
        print(f"| {a} / {b} | {kind} | {mx:.2f} | {my:.2f} | {mx / my:.2f}x |")
PY
rm -f "$out"

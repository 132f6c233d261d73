#!/bin/sh
# scripts/bench_plan_gpu.sh — the decode schedules' skeleton on the GPU (docs/PLAN.md
# section 9; bench/NOTES.md "Decode schedules v1"): writes the Qwen2.5-0.5B- and
# Llama-3.2-1B-shaped random bf16 checkpoints (scripts/make_random_model.py), then for each
# case plans the CUDA executor's own decode step and times its skeleton
# (`loom plan decode --device cuda --replay 30`: per-item flags and op counters, each with
# and without the bytes), and beside them the executor as it is (`loom bench decode`).
# Usage, from the repository root on the GPU machine:
#   LOOM_BIN=path/to/loom sh scripts/bench_plan_gpu.sh [OUTDIR]
# (a CUDA build of loom; scripts/pack_cuda_tests.sh builds one at /tmp/loom-packed/loom;
# PYTHON: a python3 with numpy, default python3).
# Outputs: OUTDIR/replay.txt (one block per case) and OUTDIR/bench_*.json
# (default OUTDIR: build/bench-plan-gpu).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/bench-plan-gpu}
L=${LOOM_BIN:?set LOOM_BIN to a CUDA build of loom}
models=${TMPDIR:-/tmp}/loom-plan-models
mkdir -p "$out" "$models"
# mk DIR ARGS...: the checkpoint models/DIR, written once
mk() { d=$1; shift; [ -f "$models/$d/config.json" ] || ${PYTHON:-python3} "$root/scripts/make_random_model.py" "$@" --out "$models/$d" >/dev/null || exit 1; }
mk_qwen() { mk qwen --arch qwen2 --vocab 151936 --hidden 896 --intermediate 4864 --layers 24 --heads 14 --kv-heads 2 --tied \
    --dtype bf16 --max-pos 32768 --rope-theta 1000000 --seed 5; }
mk_llama() { mk llama --arch llama --vocab 128256 --hidden 2048 --intermediate 8192 --layers 16 --heads 32 --kv-heads 8 \
    --dtype bf16 --max-pos 32768 --rope-theta 500000 --seed 5; }
mk_qwen
mk_llama
: >"$out/replay.txt"
case_() {
  echo "== $*" >>"$out/replay.txt"
  timeout 120 "$L" plan decode --device cuda --replay 30 --no-check "$@" >>"$out/replay.txt" 2>&1 ||
    echo "(failed: exit $?)" >>"$out/replay.txt"
}
for m in qwen llama; do
  for pf in 0 112; do case_ --model "$models/$m" --prefetch-kib $pf; done
  case_ --model "$models/$m" --context 16384 --cache 16384 --prefetch-kib 112
  case_ --model "$models/$m" --batch 32 --prefetch-kib 112
done
case_ --model "$models/qwen" --sms 8 --full-sms 132 --prefetch-kib 112
for m in qwen llama; do
  "$L" bench decode --device cuda --model "$models/$m" --tokens 256 >"$out/bench_$m.json" 2>&1
done
grep -v "^decode plan" "$out/replay.txt"

#!/bin/sh
# scripts/bench_gpu.sh — the GPU benchmark in one run: builds loom with CUDA (Release), writes
# Qwen2.5-0.5B- and Llama-3.2-1B-shaped random bf16 checkpoints with transformers, measures
# transformers and loom (prefill B1 T512, decode B1 and B32 x 256 new tokens, peak memory;
# the Qwen shape also prefill T4096 and decode B1 at contexts 4,096 and 16,384), checks that
# their logits agree and prints the table (scripts/bench_gpu.py says how).
# Usage, from the repository root on the GPU machine (CUDA, torch and transformers installed):
#   . scripts/gpu_host_env.sh; sh scripts/bench_gpu.sh [OUTDIR]
# LOOM_BIN=path/to/loom skips the build. Outputs: OUTDIR/bench_table.md, bench_results.json,
# build.log (default OUTDIR: build/bench-gpu).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/bench-gpu}
mkdir -p "$out"
if [ -z "${LOOM_BIN:-}" ]; then
  build=$root/build/bench-gpu-build
  cmake -S "$root" -B "$build" -DLOOM_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$out/build.log" 2>&1
  cmake --build "$build" -j"$(nproc)" --target loom >>"$out/build.log" 2>&1
  LOOM_BIN=$build/loom
fi
python3 "$root/scripts/bench_gpu.py" --loom "$LOOM_BIN" --work "${TMPDIR:-/tmp}/loom-bench-models" --out "$out"

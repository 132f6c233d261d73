#!/bin/sh
# scripts/bench_quant_gpu.sh — decode B1 of the weight formats on one GPU, interleaved:
# bf16, fp8 (with the tied head's int8 copy, and with the bf16 table as the head:
# LOOM_TIED_HEAD=table), int4 G = 32 with bf16 group scales and the same directory with
# its scales widened to f32 (scripts/widen_scales.py), on random checkpoints of the
# Qwen2.5-0.5B shape (a step bound by its ~124 kernel boundaries) and a Llama-3.2-3B shape
# (a step bound by the weights' bytes). Quantized directories come from `loom quantize`.
# Usage, from the repository root on the GPU machine:
#   LOOM_BIN=path/to/loom sh scripts/bench_quant_gpu.sh [OUTDIR] [ROUNDS]
# MODELS="qwen" (or "l3b") runs one shape; DEVICE=cpu runs the table on the CPU (without
# fp8, which the CPU runs only through its reference kernel).
# Prints one line per run ("<model> <setting> <median tok/s>") and keeps every run's JSON
# in OUTDIR/runs.jsonl (default OUTDIR: build/bench-quant-gpu; ROUNDS: 2). The models are
# made once under ${TMPDIR:-/tmp}/loom-quant-models (about 13 GB on disk).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/bench-quant-gpu}
rounds=${2:-2}
loom=${LOOM_BIN:?set LOOM_BIN to a loom built with CUDA}
models=${MODELS:-qwen l3b}
device=${DEVICE:-cuda}
work=${TMPDIR:-/tmp}/loom-quant-models
mkdir -p "$out" "$work"
mk() { # name, make_random_model.py arguments
  name=$1
  shift
  [ -f "$work/$name/model.safetensors" ] || python3 "$root/scripts/make_random_model.py" "$@" --out "$work/$name" >>"$out/models.log"
  for w in fp8 int4; do
    [ -f "$work/$name-$w/model.safetensors" ] || "$loom" quantize --model "$work/$name" --to $w -o "$work/$name-$w" >/dev/null
  done
  [ -f "$work/$name-int4f/model.safetensors" ] || python3 "$root/scripts/widen_scales.py" "$work/$name-int4" "$work/$name-int4f" >/dev/null
}
case " $models " in *" qwen "*) mk qwen --arch qwen2 --vocab 151936 --hidden 896 --intermediate 4864 --layers 24 --heads 14 --kv-heads 2 --tied \
  --dtype bf16 --max-pos 32768 --rope-theta 1000000 --seed 5 ;;
esac
case " $models " in *" l3b "*) mk l3b --arch llama --vocab 128256 --hidden 3072 --intermediate 8192 --layers 28 --heads 24 --kv-heads 8 --head-dim 128 \
  --tied --dtype bf16 --max-pos 131072 --rope-theta 500000 --rms-eps 1e-5 --seed 9 \
  --rope-scaling '{"rope_type":"llama3","factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}' ;;
esac
run() { # directory, setting ("-" for none: ${2#-} is then empty, so env adds nothing)
  r=$(env ${2#-} "$loom" bench decode --device "$device" --model "$work/$1" --batch 1 --prompt 16 --tokens 128 --repeat 3 2>&1 | tail -1)
  echo "$r" >>"$out/runs.jsonl"
  echo "$1 $2 $(echo "$r" | grep -o '"median_tok_per_s":[0-9.]*' | cut -d: -f2)"
}
i=0
while [ $i -lt "$rounds" ]; do
  for m in $models; do
    run $m -
    if [ "$device" != cpu ]; then # fp8 on the CPU is the reference kernel only
      run $m-fp8 -
      run $m-fp8 LOOM_TIED_HEAD=table
    fi
    run $m-int4 -
    run $m-int4f -
  done
  i=$((i + 1))
done

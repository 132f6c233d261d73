#!/bin/sh
# CPU benchmark run for bench/NOTES.md: builds the release preset, writes a random
# Qwen2.5-0.5B-shaped model with bf16 weights (the llama.cpp comparison's shape), then
# prints loom's JSON results for read bandwidth, prefill of 512 tokens, decode (with the
# memory-bandwidth roofline beside it) and tokenizer encode speed.
# Usage: scripts/bench_cpu.sh [MODEL_DIR]   (default /tmp/loom-bench/qwen2.5-0.5b-shape)
set -eu
cd "$(dirname "$0")/.."
model=${1:-/tmp/loom-bench/qwen2.5-0.5b-shape}
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" >/dev/null
if [ ! -f "$model/model.safetensors" ]; then
  /usr/bin/python3 scripts/make_random_model.py --arch qwen2 --vocab 151936 --hidden 896 --intermediate 4864 \
    --layers 24 --heads 14 --kv-heads 2 --tied --dtype bf16 --max-pos 32768 --rope-theta 1000000 --seed 5 \
    --out "$model" >&2
fi
loom=./build/release/loom
$loom bench bandwidth
$loom bench prefill --model "$model" --prompt 512 --repeat 3
$loom bench decode --model "$model" --prompt 16 --tokens 64 --repeat 3
corpus=/tmp/loom-bench/corpus.txt
/usr/bin/python3 -c "
import json,sys
lines=[json.loads(l) for l in open('tests/data/tokenizer/corpus.jsonl', encoding='utf-8')]
open(sys.argv[1],'w',encoding='utf-8').write('\n'.join(lines)*200)" "$corpus"
for t in qwen3 llama3 deepseek_v3; do
  $loom bench tokenize --tokenizer third_party/tokenizers/$t/tokenizer.json --corpus "$corpus" --repeat 3
done

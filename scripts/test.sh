#!/bin/sh
# Runs loom's whole test suite twice: the release build, then the same suite under
# AddressSanitizer + UndefinedBehaviorSanitizer (CMake preset "sanitize"); then every
# libFuzzer target for a fixed 40,000 executions from a fixed seed over its seed corpus
# (preset "fuzz", clang), so every machine tries the same inputs.
# CUDA tests report "skipped" on machines without a GPU.
set -eu
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"
cmake --preset sanitize >/dev/null
cmake --build --preset sanitize -j "$jobs"
ctest --preset sanitize -j "$jobs"
./scripts/fuzz.sh --build --runs 40000 --seed 1

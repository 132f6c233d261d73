#!/bin/sh
# scripts/gpu_check.sh — everything the CUDA back end needs checked on the GPU machine, in one
# call (a machine start costs a minute): configure + build with CUDA (Release), then any of
#   tests  the whole suite, the cuda label's output in full
#   lab    bench/cuda_kernels.c: per-kernel times at the Qwen2.5-0.5B and Llama-3.2-1B shapes
#   bench  scripts/bench_gpu.sh (loom vs transformers, the table of bench/NOTES.md)
#   trainlab  bench/cuda_train_ops.c: per-operator times of a bf16 training step (Qwen2.5-0.5B shape),
#          then PyTorch's scaled_dot_product_attention at the same attention shapes
#   train  scripts/bench_train_gpu.py (training: loom vs PyTorch eager + torch.compile, loss parity)
#   train-quick  the same without torch.compile, 8 steps
#   api    the Python package's tests with PyTorch on the GPU (DLPack both ways on CUDA,
#          zero-copy by pointer) and a traced CUDA generate (device spans on the stream
#          track, validated, and its offline page)
# Usage, from the repository root: . scripts/gpu_host_env.sh; sh scripts/gpu_check.sh OUTDIR [STEP...]
# (no step = tests lab bench). Logs: OUTDIR/build.log, ctest.log, ctest_cuda.log, lab.txt,
# bench.log, bench/ (bench_table.md, bench_results.json).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: gpu_check.sh OUTDIR [tests] [lab] [bench]}
shift
steps=${*:-tests lab bench}
build=$root/build/gpu-check
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv >"$out/gpu.txt" 2>&1
cmake -S "$root" -B "$build" -DLOOM_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$out/build.log" 2>&1 &&
  cmake --build "$build" -j"$(nproc)" >>"$out/build.log" 2>&1
rc=$?
grep -E "error|warning" "$out/build.log" | grep -E "ops/cuda|nn/|runtime/|tools/|tests/cuda" | head -n 20
[ $rc -eq 0 ] || { tail -n 30 "$out/build.log"; exit $rc; }
for step in $steps; do
  case $step in
  tests)
    (cd "$build" && ctest -L cuda --output-on-failure -V >"$out/ctest_cuda.log" 2>&1)
    (cd "$build" && ctest -j8 -LE cuda >"$out/ctest.log" 2>&1)
    grep -E "tests passed|Failed|\*\*\*|passed, |max \|dlogit" "$out/ctest_cuda.log" "$out/ctest.log" | sort -u | tail -n 40
    ;;
  lab)
    cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -DLOOM_HAVE_CUDA=1 -I"$root/include" -I"$root/src" \
      -I/usr/local/cuda/include "$root/bench/cuda_kernels.c" "$build/libloom.a" -L/usr/local/cuda/lib64 \
      -lcublasLt -lcudart -ljansson -lpcre2-8 -lutf8proc -lstdc++ -lm -lpthread -o "$build/cuda_kernels" &&
      { echo "# qwen2.5-0.5b"; "$build/cuda_kernels"; echo "# llama-3.2-1b"; "$build/cuda_kernels" 2048 8192 32 8 64 128256 144; } \
        >"$out/lab.txt" 2>&1
    cat "$out/lab.txt"
    ;;
  trainlab)
    cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -DLOOM_HAVE_CUDA=1 -I"$root/include" -I"$root/src" \
      -I/usr/local/cuda/include "$root/bench/cuda_train_ops.c" "$build/libloom.a" -L/usr/local/cuda/lib64 \
      -lcublasLt -lcudart -ljansson -lpcre2-8 -lutf8proc -lstdc++ -lm -lpthread -o "$build/cuda_train_ops" &&
      "$build/cuda_train_ops" >"$out/trainlab.txt" 2>&1
    python3 "$root/scripts/bench_sdpa_gpu.py" >>"$out/trainlab.txt" 2>&1
    cat "$out/trainlab.txt"
    ;;
  train | train-quick)
    extra=""
    [ "$step" = train-quick ] && extra="--skip-compile --steps 8"
    python3 "$root/scripts/bench_train_gpu.py" --loom "$build/loom" --out "$out/train" $extra >"$out/train.log" 2>&1
    tail -n 40 "$out/train.log"
    ;;
  api)
    python3 "$root/tests/python/run_tests.py" "$build/libloom.so" "$build/loom" "$root" >"$out/python.log" 2>&1
    echo "python tests: exit $?"; grep -E "cuda|CUDA|skipped|FAIL|ERROR|^Ran|^OK" "$out/python.log" | tail -n 20
    "$build/loom" generate --device cuda --model "$root/models/default" --prompt "Once upon a time" --max-new 32 \
      --seed 1 --trace "$out/trace_cuda.json" >"$out/trace_generate.log" 2>&1
    echo "traced generate: exit $?"
    python3 "$root/tests/tools/validate_trace.py" "$out/trace_cuda.json" --expect prefill,"decode step",linear,attention_cache
    echo "device spans (kernel): $(grep -c '"cat":"kernel"' "$out/trace_cuda.json")"
    "$build/loom" trace view "$out/trace_cuda.json" -o "$out/trace_cuda.html" | tail -n 1
    ;;
  bench)
    LOOM_BIN=$build/loom sh "$root/scripts/bench_gpu.sh" "$out/bench" >"$out/bench.log" 2>&1
    tail -n 30 "$out/bench.log"
    ;;
  esac
done

#!/bin/sh
# scripts/pack_cuda_tests.sh — builds the CUDA tests and the CLI on a machine with nvcc
# but no GPU, linked against one shared library (-DLOOM_SHARED_TESTS=ON), and packs them
# into one archive that scripts/run_packed_cuda_tests.sh runs on a machine with a GPU.
# The tests find their data through the source tree's absolute path and CTest finds the
# executables through the build directory's, so both machines must have the repository at
# the same path; the build directory is /tmp/loom-packed on both.
# Usage, from the repository root: sh scripts/pack_cuda_tests.sh OUT.tar.xz
# (~10 MB; the first build takes ~15 minutes on 2 cores, later ones rebuild what changed).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: pack_cuda_tests.sh OUT.tar.xz}
case $out in /*) ;; *) out=$(pwd)/$out ;; esac # the archive is written after cd /
build=/tmp/loom-packed
gen=""
command -v ninja >/dev/null 2>&1 && gen="-G Ninja"
# MPI on (when this machine has it): the GPU machine's image carries Open MPI 4.1 (mpirun,
# libmpi.so.40) and NCCL, so test_cuda_train_dist runs `mpirun -np 2 loom train --device cuda`
# there; a machine without MPI builds without it and that test skips.
cmake -S "$root" -B "$build" $gen -DLOOM_CUDA=ON -DLOOM_MPI=ON -DLOOM_SHARED_TESTS=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
targets="loom test_runtime_cuda"
for t in "$root"/tests/cuda/test_cuda_*.c; do targets="$targets $(basename "$t" .c)"; done
echo "building $targets"
cmake --build "$build" -j"$(nproc)" --target $targets
cd /
files="${build#/}/libloomall.so ${build#/}/loom ${build#/}/CTestTestfile.cmake ${build#/}/tests/CTestTestfile.cmake"
for t in $targets; do [ "$t" = loom ] || files="$files ${build#/}/tests/$t"; done
tar -cJf "$out" $files
echo "packed $(du -h "$out" | cut -f1) into $out"

#!/bin/sh
# scripts/run_packed_cuda_tests.sh — on a machine with a GPU, unpacks an archive written by
# scripts/pack_cuda_tests.sh (into /tmp/loom-packed) and runs the cuda-labelled tests.
# The loom CLI of the archive is then /tmp/loom-packed/loom (with LD_LIBRARY_PATH set as
# below). Needs the libraries loom links (jansson, PCRE2, utf8proc, libmicrohttpd, CUDA's
# runtime and cuBLASLt); scripts/gpu_host_env.sh provides the first four from .deb files.
# Usage, from the repository root: sh scripts/run_packed_cuda_tests.sh ARCHIVE.tar.xz [LOG]
set -u
archive=${1:?usage: run_packed_cuda_tests.sh ARCHIVE.tar.xz [LOG]}
log=${2:-/tmp/loom-packed-ctest.log}
tar -xJf "$archive" -C / || exit 1
export LD_LIBRARY_PATH="/tmp/loom-packed:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
missing=$(ldd /tmp/loom-packed/libloomall.so /tmp/loom-packed/loom | grep "not found" | sort -u)
[ -z "$missing" ] || { echo "missing libraries:$missing"; exit 1; }
(cd /tmp/loom-packed && ctest -L cuda -j4 --output-on-failure >"$log" 2>&1)
rc=$?
grep -E "tests passed|Failed|\*\*\*|FAIL|Not Run" "$log" | tail -n 25
exit $rc

#!/bin/sh
# Runs loom's libFuzzer targets (tests/fuzz/fuzz_*.c, built by the `fuzz` CMake preset:
# clang, ASan + UBSan) over their committed seed corpora.
#   scripts/fuzz.sh [--seconds S | --runs N] [--seed N] [--build] [TARGET...]
# Default: every target for 10 seconds. --runs N stops each after N executions (the
# long campaign in docs/RELIABILITY.md uses 10 million); with --seed the inputs tried
# are the same on every machine, which is how scripts/test.sh runs it in CI (a fixed
# 40,000 executions per target: a busy machine takes longer, never sees other
# inputs). --build configures and builds the preset first. The seeds are copied into
# a work corpus (build/fuzz/corpus/TARGET), so what the fuzzer adds stays out of the
# tree; a crash, sanitizer report, leak or timeout leaves its input in
# build/fuzz/artifacts/ and makes the script exit 1. One summary line per target.
set -eu
cd "$(dirname "$0")/.."
limit="-max_total_time=10"
build=0
seed=""
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) limit="-max_total_time=$2"; shift 2 ;;
    --runs) limit="-runs=$2"; shift 2 ;;
    --seed) seed="-seed=$2"; shift 2 ;;
    --build) build=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1'" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $build = 1 ]; then
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz -j "$(nproc 2>/dev/null || echo 2)"
fi
targets="$*"
[ -n "$targets" ] || targets=$(cd tests/fuzz && ls fuzz_*.c | sed 's/^fuzz_//; s/\.c$//')
out=build/fuzz
mkdir -p "$out/artifacts"
failed=0
for t in $targets; do
  bin=$out/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz.sh: $bin is not built (scripts/fuzz.sh --build)" >&2; exit 2; }
  case $t in
    tokenizer_encode) dict=tests/fuzz/text.dict; max_len=4096 ;;
    chat_template) dict=tests/fuzz/jinja.dict; max_len=4096 ;;
    token_shard) dict=""; max_len=4096 ;;
    plan_package) dict=""; max_len=32768 ;;
    tokenizer_json) dict=tests/fuzz/json.dict; max_len=16384 ;;
    *) dict=tests/fuzz/json.dict; max_len=8192 ;;
  esac
  work=$out/corpus/$t
  mkdir -p "$work"
  log=$out/fuzz_$t.log
  # shellcheck disable=SC2086
  if "$bin" $limit $seed -max_len=$max_len -timeout=10 -rss_limit_mb=2048 ${dict:+-dict=$dict} \
      -artifact_prefix="$out/artifacts/$t-" -print_final_stats=1 "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz $t: ok, ${runs:-?} executions, $cov, corpus $(ls "$work" | wc -l) inputs"
  else
    echo "fuzz $t: FAILED (log: $log; inputs in $out/artifacts/)"
    grep -E "ERROR|SUMMARY|runtime error|deadly signal" "$log" | head -5
    failed=1
  fi
done
exit $failed

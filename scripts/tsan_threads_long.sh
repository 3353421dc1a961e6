#!/usr/bin/env bash
# ThreadSanitizer at full length (issue 15): 16 threads, each on its own stream, OPS random
# operations per thread (tests/stress/stream_locks_concurrent_test.cpp,
# SixteenThreadsOfRandomOperationsKeepTheBooksExact), for one heap shape or all of them. The
# default test run (scripts/run_tests.sh) does 20,000 operations per thread; this is the long run.
#
#   scripts/tsan_threads_long.sh [--ops 1000000] [--heap segment|paged|paged_cold|all]
#                                [--limit-s 3600] [--log-dir DIR] [--build DIR]
#
# Builds build-tsan-long/ (or --build DIR; TSan at -O1, no CUDA) when it is not there. The log is written as the
# test runs, one per heap, to DIR (default: $OUT when set, so a device call cut short still
# returns it, else build-tsan-long-logs); thread 0 prints its progress at every tenth. Prints one
# line per heap: passed / FAILED / stopped by the limit at N of OPS. Exits non-zero unless every
# heap passed.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
[[ -x .venv/bin/meson ]] && export PATH="$repo/.venv/bin:$PATH"
ops=1000000
heap=all
limit=3600
log_dir=${OUT:-build-tsan-long-logs}
build=build-tsan-long
while (($#)); do
  case "$1" in
    --ops) ops=$2; shift 2 ;;
    --heap) heap=$2; shift 2 ;;
    --limit-s) limit=$2; shift 2 ;;
    --log-dir) log_dir=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "tsan_threads_long: unknown argument $1" >&2; exit 2 ;;
  esac
done
for number in "$ops" "$limit"; do
  [[ "$number" =~ ^[1-9][0-9]*$ ]] || { echo "tsan_threads_long: '$number' is not a whole number > 0" >&2; exit 2; }
done
case "$heap" in
  all) heaps=(segment paged paged_cold) ;;
  segment|paged|paged_cold) heaps=("$heap") ;;
  *) echo "tsan_threads_long: unknown heap '$heap' (segment, paged, paged_cold, all)" >&2; exit 2 ;;
esac
if [[ ! -f "$build/build.ninja" ]]; then
  meson setup "$build" --buildtype=plain -Doptimization=1 -Db_ndebug=false -Dcpp_args=-g1 \
    -Db_sanitize=thread -Dcuda=disabled -Dtorch_plugin=disabled -Dbenchmarks=disabled >/dev/null || exit 1
fi
ninja -C "$build" tests/stress/test_stream_locks_concurrent >/dev/null || exit 1
mkdir -p "$log_dir"
start=$(date +%s)
failed=0
for h in "${heaps[@]}"; do
  left=$(( limit - ($(date +%s) - start) ))
  log="$log_dir/tsan-16x$ops-$h.log"
  if (( left < 10 )); then
    echo "tsan_threads_long: $h not run: the limit is used up"; failed=1; continue
  fi
  heap_start=$(date +%s)
  TSAN_OPTIONS=halt_on_error=1 VRAMLEDGER_STREAM_LOCKS_OPS=$ops timeout "$left" \
    "$build/tests/stress/test_stream_locks_concurrent" \
    --gtest_filter="*SixteenThreadsOfRandomOperations*/$h" >"$log" 2>&1
  status=$?
  seconds=$(( $(date +%s) - heap_start ))
  if (( status == 0 )) && grep -q "^\[  PASSED  \] 1 test" "$log"; then
    echo "tsan_threads_long: $h passed: 16 threads x $ops operations in $seconds s, no report ($log)"
  elif (( status == 124 )); then
    echo "tsan_threads_long: $h stopped by the limit after $seconds s at $(grep progress "$log" | tail -n 1 | sed 's/.*thread 0: //'); no report until then ($log)"
    failed=1
  else
    echo "tsan_threads_long: $h FAILED (exit $status) after $seconds s ($log)"
    failed=1
  fi
done
exit $failed

#!/usr/bin/env bash
# The project's test command. From scratch, in three build folders, every one with --werror:
#   build-release  release, every suite (GPU tests are built when nvcc is found and skip without
#                  a GPU)
#   build-asan     AddressSanitizer + UndefinedBehaviorSanitizer, every suite but python_only
#   build-tsan     ThreadSanitizer, the 'concurrent' suite (only its executables are built)
# then prints one closing line 'N passed, N failed, N skipped' counted from the three
# meson-logs/testlog.json files (a build that fails to configure or compile counts as one failure;
# so does a compiler or linker warning, which the build's log keeps).
# Exits non-zero on any failure. Run scripts/setup.sh first.
#
# The builds run one after another, each sanitizer build compiled at the lowest CPU priority while
# the previous build's tests run (they leave part of the cores idle); its compiler output is
# printed when its tests start. The randomized stress test runs 200,000 steps per heap shape here
# (10,000 under the sanitizers; the corpus replay runs one lag of its four there), so that the
# whole command aims at 12 minutes on a 2-core machine (compiling is most of it: 658 s in a
# clean-clone CI run at 8efc84b, 2026-12-02; 707-758 s before, with 50,000 sanitized steps, four
# lags and the ASan build at -O1); its full length, 10^6 steps,
# is scripts/stress_long.sh, whose result is recorded in bench/results/. VRAMLEDGER_STRESS_OPS and
# VRAMLEDGER_STRESS_OPS_SANITIZED override the two lengths.
set -uo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
if [[ -x .venv/bin/meson ]]; then export PATH="$repo_root/.venv/bin:$PATH"; fi
if ! command -v meson >/dev/null 2>&1; then
  echo "run_tests: meson not found; run scripts/setup.sh first" >&2
  exit 1
fi

jobs=$(nproc)
start=$(date +%s)
builds=(build-release build-asan build-tsan)
build_failures=0
background_pid=
rm -rf "${builds[@]}"

stress_ops=${VRAMLEDGER_STRESS_OPS:-200000}
stress_ops_sanitized=${VRAMLEDGER_STRESS_OPS_SANITIZED:-10000}

# Sanitizer builds: -g1 gives line numbers in reports without full debug info, asserts stay on.
# ASan + UBSan compile at -O0: its build is on this command's critical path, and it compiles 2.7x
# faster than at -O1 (the policy's unity file: 10.6 s against 28.9 s), but its tests run slower,
# beside the ThreadSanitizer build. Clean-clone CI on the 2-core VM, 2026-12-02: at -O1 (50,000
# sanitized stress steps, four lags) 758 s = release build 280 + ASan build 366 + its tests 72
# (TSan build 86 meanwhile) + TSan tests 26; at -O0 (40,000 steps, two lags) 727 s = 252 + 230 +
# 215 (TSan build 147 meanwhile) + 30; hence 20,000 sanitized steps and one lag since: 658 s at
# 8efc84b = 251 + 218 + 155 (TSan build 136 meanwhile) + 34. The suites grew: 734 s at 5696a73
# (2026-12-03) = 265 + 225 + 209 (randomized_stress alone 121 s of it) + 35, past the 12
# minutes; hence 10,000 sanitized steps since (the release build still runs 200,000, and
# scripts/stress_long.sh 10^6). 712 s at 5bf10c3 = 258 + 233 + 194 (corpus_replay alone 116 s
# of it) + 27; hence the sanitized corpus replay skips its three largest traces since.
# ThreadSanitizer stays at -O1 (its tests are the last phase, and slow at -O0). Benchmarks and
# CUDA are left out there: the sanitizers are aimed at host-side logic, which the
# simulated-device tests exercise, and the GPU tests skip without a GPU.
sanitizer_common=(--buildtype=plain -Db_ndebug=false -Dcpp_args=-g1
                  -Dbenchmarks=disabled -Dcuda=disabled)

# Sanitizer failures must fail the test, not just print: UBSan recovers by default.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

# build DIR -- SETUP_ARGS...: configures and compiles DIR. The compiler's output is kept in
# DIR/compile.log (shown as it comes with SHOW_BUILD=1, else printed by report_build); the
# outcome goes to DIR/build.result: "ok WARNINGS SECONDS", "configure-failed" or "build-failed".
# PHASE_SUITE=S builds only the executables of suite S (what that phase runs).
build() {
  local dir=$1 build_start
  build_start=$(date +%s)
  shift 2
  mkdir -p "$dir"
  local setup_log
  setup_log=$(mktemp)
  if ! meson setup "$dir" "$@" >"$setup_log" 2>&1; then
    cat "$setup_log" >"$dir/compile.log"; rm -f "$setup_log"
    echo configure-failed >"$dir/build.result"; return
  fi
  rm -f "$setup_log"
  local targets=()
  if [[ -n "${PHASE_SUITE:-}" ]]; then
    mapfile -t targets < <(meson introspect "$dir" --tests | python3 -c '
import json, os, sys
suite, build = sys.argv[1], os.path.abspath(sys.argv[2])
for test in json.load(sys.stdin):
    if any(s == suite or s.endswith(":" + suite) for s in test["suite"]):
        print(os.path.relpath(test["cmd"][0], build))' "$PHASE_SUITE" "$dir" | sort -u)
  fi
  local status
  if [[ "${SHOW_BUILD:-0}" == 1 ]]; then
    meson compile -C "$dir" -j "$jobs" "${targets[@]}" 2>&1 | tee "$dir/compile.log"
    status=${PIPESTATUS[0]}
  else
    meson compile -C "$dir" -j "$jobs" "${targets[@]}" >"$dir/compile.log" 2>&1
    status=$?
  fi
  if ((status != 0)); then echo build-failed >"$dir/build.result"; return; fi
  local warnings  # gcc/ld: "warning:", nvcc: "warning #20012-D:"
  warnings=$(grep -cE '(^|[^[:alpha:]])warning( #[0-9A-Z-]+)?:' "$dir/compile.log")
  echo "ok $warnings $(( $(date +%s) - build_start ))" >"$dir/build.result"
}

# report_build DIR [SHOWN]: prints a build's outcome (and its compiler output unless SHOWN) and
# counts a failed configure or compile, or any compiler/linker warning, as one failure. Returns
# non-zero when there is nothing to test.
report_build() {
  local dir=$1 shown=${2:-0} result
  result=$(cat "$dir/build.result" 2>/dev/null || echo build-failed)
  if [[ $shown != 1 || $result == configure-failed ]]; then cat "$dir/compile.log" 2>/dev/null; fi
  case $result in
    configure-failed)
      echo "=== $dir: configure FAILED"; build_failures=$((build_failures + 1)); return 1 ;;
    build-failed)
      echo "=== $dir: build FAILED"; build_failures=$((build_failures + 1)); return 1 ;;
  esac
  local warnings seconds
  read -r _ warnings seconds <<<"$result"
  if ((warnings > 0)); then
    echo "=== $dir: $warnings compiler/linker warning line(s) (see $dir/compile.log): counted as a failure"
    build_failures=$((build_failures + 1))
  fi
  echo "=== $dir: built in $seconds s, $warnings warnings"
}

# test_phase DIR TEST_ARGS
test_phase() {
  local dir=$1 test_args=$2 test_start
  test_start=$(date +%s)
  # shellcheck disable=SC2086  # test_args is a word list on purpose
  meson test -C "$dir" --no-rebuild --num-processes "$jobs" --print-errorlogs $test_args || true
  echo "=== $dir: tests done in $(( $(date +%s) - test_start )) s"
}

# background_build DIR -- SETUP_ARGS...: build() in the background at the lowest CPU priority,
# so it takes only the CPU that the tests running meanwhile leave idle (they wait on child
# processes, sleep, or run one long test on one core); the tests' own speed is unchanged.
background_build() {
  ( renice -n 19 -p "$BASHPID" >/dev/null; build "$@" ) &
  background_pid=$!
}

# The torch plugin is built against the torch scripts/setup.sh pinned in .venv, when it is there.
torch_args=()
if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null; then
  torch_args=(-Dtorch_python="$repo_root/.venv/bin/python")
fi
release_args=(--buildtype=release --werror -Dcuda=auto -Dbenchmarks=auto "${torch_args[@]}")
asan_args=("${sanitizer_common[@]}" -Doptimization=0 --werror -Db_sanitize=address,undefined)
tsan_args=("${sanitizer_common[@]}" -Doptimization=1 --werror -Db_sanitize=thread)

# Each build is compiled while the previous build's tests run (background_build); a phase's tests
# start once its own build is done.
echo "=== build-release: meson setup ${release_args[*]}"
SHOW_BUILD=1 build build-release -- "${release_args[@]}"
echo "=== build-asan: meson setup ${asan_args[*]} (compiled in the background while build-release's tests run)"
background_build build-asan -- "${asan_args[@]}"
if report_build build-release 1; then
  VRAMLEDGER_STRESS_OPS=$stress_ops test_phase build-release ""
fi
wait "$background_pid"

echo "=== build-tsan: meson setup ${tsan_args[*]} (compiled in the background while build-asan's tests run; the 'concurrent' suite's executables only)"
PHASE_SUITE=concurrent background_build build-tsan -- "${tsan_args[@]}"
# Tests in pure Python (suite python_only: nothing of the sanitized build runs in them) run in
# the release phase only.
# The ASan phase is on the critical path (723 s in all at 56b8ec8, 2026-12-03, with its tests
# 149 s): its fault-injection run and the four multi-threaded stress tests (ThreadSanitizer's
# business, run in full there) take a quarter of the operations they take in the release build
# (the front cache's and the stream lanes' since 2026-12-03 too: 12.2 and 6.8 s of the 133 s at
# 858d4cd, 3.6 and 2.6 s with a quarter), and corpus_replay leaves its figure-only replays to
# the release build (tests/policy/test_corpus_replay.cpp: 51 s alone at -O0, 78 s in the phase).
# With those, the test command took 689 s at ea1ed9e (2026-12-03, a reused clone) = release
# build 249 + ASan build 280 (beside the release tests) + TSan build 122 (beside the ASan tests,
# 108) + TSan tests ~31; since, the test sources compile without UBSan's null and alignment
# checks (tests/meson.build: the ASan build 191 -> 153 s alone): 614 s in a clean-clone CI run at
# fd4691c = release build 262 + ASan build 203 + ASan tests 96 (TSan build 107 meanwhile) + TSan
# tests 42.
if report_build build-asan; then
  VRAMLEDGER_STRESS_OPS=$stress_ops_sanitized VRAMLEDGER_FAULT_OPS=25000 \
  VRAMLEDGER_CONCURRENT_OPS=5000 VRAMLEDGER_STREAM_LOCKS_OPS=5000 \
  VRAMLEDGER_FRONT_CACHE_OPS=5000 VRAMLEDGER_STREAM_LANES_OPS=5000 \
    test_phase build-asan "--no-suite python_only --timeout-multiplier 4"
fi
wait "$background_pid"

if report_build build-tsan; then
  VRAMLEDGER_STRESS_OPS=$stress_ops_sanitized \
    test_phase build-tsan "--suite concurrent --timeout-multiplier 4"
fi

echo "run_tests: finished in $(( $(date +%s) - start )) s (randomized stress: $stress_ops steps per heap, $stress_ops_sanitized under the sanitizers; the 10^6-step run is scripts/stress_long.sh)"
python3 .ci/testlog_summary.py --build-failures "$build_failures" "${builds[@]}"

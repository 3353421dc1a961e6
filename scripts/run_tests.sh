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
# The randomized stress test runs 200,000 steps per heap shape here (50,000 under the sanitizers),
# so the whole command stays within ~10 minutes on a 2-core machine; its full length, 10^6 steps,
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
rm -rf "${builds[@]}"

stress_ops=${VRAMLEDGER_STRESS_OPS:-200000}
stress_ops_sanitized=${VRAMLEDGER_STRESS_OPS_SANITIZED:-50000}

# Sanitizer builds: -O1 keeps them reasonably fast, -g1 gives line numbers in reports without full
# debug info, asserts stay on. Benchmarks and CUDA are left out there: the sanitizers are aimed at
# host-side logic, which the simulated-device tests exercise, and the GPU tests skip without a GPU.
sanitizer_common=(--buildtype=plain -Doptimization=1 -Db_ndebug=false -Dcpp_args=-g1
                  -Dbenchmarks=disabled -Dcuda=disabled)

# Sanitizer failures must fail the test, not just print: UBSan recovers by default.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

# phase DIR TEST_ARGS -- SETUP_ARGS...
phase() {
  local dir=$1 test_args=$2 phase_start
  phase_start=$(date +%s)
  shift 3
  echo "=== $dir: meson setup $*"
  local setup_log
  setup_log=$(mktemp)
  if ! meson setup "$dir" "$@" >"$setup_log" 2>&1; then
    cat "$setup_log"; rm -f "$setup_log"
    echo "=== $dir: configure FAILED"; build_failures=$((build_failures + 1)); return
  fi
  rm -f "$setup_log"
  # The compiler's output is kept in DIR/compile.log and shown; any warning fails the run.
  # PHASE_SUITE=S builds only the executables of suite S (what that phase runs).
  local targets=()
  if [[ -n "${PHASE_SUITE:-}" ]]; then
    mapfile -t targets < <(meson introspect "$dir" --tests | python3 -c '
import json, os, sys
suite, build = sys.argv[1], os.path.abspath(sys.argv[2])
for test in json.load(sys.stdin):
    if any(s == suite or s.endswith(":" + suite) for s in test["suite"]):
        print(os.path.relpath(test["cmd"][0], build))' "$PHASE_SUITE" "$dir" | sort -u)
  fi
  meson compile -C "$dir" -j "$jobs" "${targets[@]}" 2>&1 | tee "$dir/compile.log"
  if [[ ${PIPESTATUS[0]} -ne 0 ]]; then
    echo "=== $dir: build FAILED"; build_failures=$((build_failures + 1)); return
  fi
  local warnings  # gcc/ld: "warning:", nvcc: "warning #20012-D:"
  warnings=$(grep -cE '(^|[^[:alpha:]])warning( #[0-9A-Z-]+)?:' "$dir/compile.log")
  if ((warnings > 0)); then
    echo "=== $dir: $warnings compiler/linker warning line(s) (see $dir/compile.log): counted as a failure"
    build_failures=$((build_failures + 1))
  fi
  echo "=== $dir: built in $(( $(date +%s) - phase_start )) s, $warnings warnings"
  # shellcheck disable=SC2086  # test_args is a word list on purpose
  meson test -C "$dir" --no-rebuild --num-processes "$jobs" --print-errorlogs $test_args || true
  echo "=== $dir: done in $(( $(date +%s) - phase_start )) s"
}

# The torch plugin is built against the torch scripts/setup.sh pinned in .venv, when it is there.
torch_args=()
if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null; then
  torch_args=(-Dtorch_python="$repo_root/.venv/bin/python")
fi
VRAMLEDGER_STRESS_OPS=$stress_ops \
  phase build-release "" -- --buildtype=release --werror -Dcuda=auto -Dbenchmarks=auto "${torch_args[@]}"
# Tests in pure Python (suite python_only: nothing of the sanitized build runs in them) run in
# the release phase only.
VRAMLEDGER_STRESS_OPS=$stress_ops_sanitized \
  phase build-asan "--no-suite python_only --timeout-multiplier 4" -- "${sanitizer_common[@]}" --werror -Db_sanitize=address,undefined
VRAMLEDGER_STRESS_OPS=$stress_ops_sanitized PHASE_SUITE=concurrent \
  phase build-tsan "--suite concurrent --timeout-multiplier 4" -- "${sanitizer_common[@]}" --werror -Db_sanitize=thread

echo "run_tests: finished in $(( $(date +%s) - start )) s (randomized stress: $stress_ops steps per heap, $stress_ops_sanitized under the sanitizers; the 10^6-step run is scripts/stress_long.sh)"
python3 .ci/testlog_summary.py --build-failures "$build_failures" "${builds[@]}"

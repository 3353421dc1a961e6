#!/usr/bin/env bash
# The project's test command. From scratch, in three build folders:
#   build-release  release, --werror, every suite (GPU tests are built when nvcc is found and
#                  skip without a GPU)
#   build-asan     AddressSanitizer + UndefinedBehaviorSanitizer, every suite
#   build-tsan     ThreadSanitizer, the 'concurrent' suite
# then prints one closing line 'N passed, N failed, N skipped' counted from the three
# meson-logs/testlog.json files (a build that fails to configure or compile counts as one failure).
# Exits non-zero on any failure. Run scripts/setup.sh first.
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
  local dir=$1 test_args=$2
  shift 3
  echo "=== $dir: meson setup $*"
  local setup_log
  setup_log=$(mktemp)
  if ! meson setup "$dir" "$@" >"$setup_log" 2>&1; then
    cat "$setup_log"; rm -f "$setup_log"
    echo "=== $dir: configure FAILED"; build_failures=$((build_failures + 1)); return
  fi
  rm -f "$setup_log"
  if ! meson compile -C "$dir" -j "$jobs"; then
    echo "=== $dir: build FAILED"; build_failures=$((build_failures + 1)); return
  fi
  # shellcheck disable=SC2086  # test_args is a word list on purpose
  meson test -C "$dir" --no-rebuild --num-processes "$jobs" --print-errorlogs $test_args || true
}

# The torch plugin is built against the torch scripts/setup.sh pinned in .venv, when it is there.
torch_args=()
if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null; then
  torch_args=(-Dtorch_python="$repo_root/.venv/bin/python")
fi
phase build-release "" -- --buildtype=release --werror -Dcuda=auto -Dbenchmarks=auto "${torch_args[@]}"
# Stress tests scale their operation count down under the sanitizers (see tests/stress/).
VRAMLEDGER_STRESS_OPS=${VRAMLEDGER_STRESS_OPS_SANITIZED:-200000} \
  phase build-asan "--timeout-multiplier 4" -- "${sanitizer_common[@]}" -Db_sanitize=address,undefined
VRAMLEDGER_STRESS_OPS=${VRAMLEDGER_STRESS_OPS_SANITIZED:-200000} \
  phase build-tsan "--suite concurrent --timeout-multiplier 4" -- "${sanitizer_common[@]}" -Db_sanitize=thread

echo "run_tests: finished in $(( $(date +%s) - start )) s"
python3 .ci/testlog_summary.py --build-failures "$build_failures" "${builds[@]}"

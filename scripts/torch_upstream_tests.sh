#!/usr/bin/env bash
# PyTorch's own allocator tests, side by side (issue 12, part 2): one pytest file run twice on
# the GPU, first with torch's native allocator, then under `vramledger run --`, and a table of
# the tests whose outcome differs.
#
#   bash scripts/torch_upstream_tests.sh [UPSTREAM_FILE] [--build-dir DIR] [--budget S]
#        [--run-max S] [--test-timeout S] [--conf CONF] [--restage] [--no-shim] [-k EXPR]
#
#   UPSTREAM_FILE   the test file (default .upstream/test_cuda_allocator.py: an excerpt of
#                   PyTorch's test/test_cuda.py that is git-ignored and never committed; see
#                   .upstream/SOURCE.txt). Also $VRAMLEDGER_UPSTREAM_TESTS.
#   --build-dir     meson build folder for the plugin (default build-gpu-suite, or
#                   $VRAMLEDGER_UPSTREAM_BUILD). The package is staged as tests/torch/run_on_gpu.sh
#                   (and so scripts/gpu_suite.d/20-torch-plugin.sh) stages it, in
#                   build-torch-gpu-stage/; an existing stage is reused unless --restage.
#   --budget        seconds for the whole script, staging included (default 540, or
#                   $VRAMLEDGER_UPSTREAM_BUDGET_S); the native run gets at most half of what is
#                   left after staging, the vramledger run the rest.
#   --run-max       cap for each of the two runs (default 300, or $VRAMLEDGER_UPSTREAM_RUN_MAX_S)
#   --test-timeout  per-test limit when pytest-timeout is installed (default 150)
#   --conf          vramledger run --conf CONF (default: none, vramledger's defaults)
#   --no-shim       do not build the LD_PRELOAD shim (vramledger run then runs without it)
#   -k EXPR         pytest -k, for both runs
#
# For tests of this script: VRAMLEDGER_UPSTREAM_STAGE (another staged package folder) and
# VRAMLEDGER_UPSTREAM_ASSUME_GPU=1 (skip the GPU checks).
#
# Results: $OUT/torch_upstream.md and $OUT/torch_upstream.json when $OUT is set, else
# build-torch-upstream/; the two JUnit XMLs and logs next to them in torch_upstream/ (or
# build-torch-upstream/). A run cut short by its limit keeps what it finished (pytest gets SIGINT
# first, so it writes its XML; the verbose log fills in otherwise).
#
# It is a measurement: the exit status is 0 even when tests fail, and also when there is no GPU
# or no upstream file (it says so and stops). The last line printed is
#   upstream allocator tests: N run, native F failed, vramledger G failed, vramledger-only failures K
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 0
START=$(date +%s)

UPSTREAM=${VRAMLEDGER_UPSTREAM_TESTS:-.upstream/test_cuda_allocator.py}
BUILD=${VRAMLEDGER_UPSTREAM_BUILD:-build-gpu-suite}
BUDGET=${VRAMLEDGER_UPSTREAM_BUDGET_S:-540}
RUN_MAX=${VRAMLEDGER_UPSTREAM_RUN_MAX_S:-300}
TEST_TIMEOUT=${VRAMLEDGER_UPSTREAM_TEST_TIMEOUT_S:-150}
CONF=""
RESTAGE=0
SHIM=1
KEXPR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) BUILD=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --run-max) RUN_MAX=$2; shift ;;
    --test-timeout) TEST_TIMEOUT=$2; shift ;;
    --conf) CONF=$2; shift ;;
    --restage) RESTAGE=1 ;;
    --no-shim) SHIM=0 ;;
    -k) KEXPR=$2; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "torch_upstream_tests: unknown argument $1" >&2; exit 2 ;;
    *) UPSTREAM=$1 ;;
  esac
  shift
done

remaining() { echo $(( BUDGET - ($(date +%s) - START) )); }
say() { echo "=== [torch_upstream +$(( $(date +%s) - START ))s] $*"; }
skip() {  # skip REASON: the measurement cannot run here; not a failure
  echo "torch_upstream_tests: skipped: $*"
  echo "upstream allocator tests: skipped ($*)"
  exit 0
}

if [[ -n "${OUT:-}" ]]; then
  RESULTS="$OUT"
  DETAIL="$OUT/torch_upstream"
else
  RESULTS="$REPO/build-torch-upstream"
  DETAIL="$REPO/build-torch-upstream"
fi
WORK="$REPO/build-torch-upstream/work"   # large and scratch: never under $OUT
STAGE=${VRAMLEDGER_UPSTREAM_STAGE:-$REPO/build-torch-gpu-stage}
export PATH="/usr/local/cuda/bin:$PATH"
PYTHON=${PYTHON:-$(command -v python3)}
# Keep multi-GPU machines' NVLink multicast off (the device runner asks for it).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# --- what is there --------------------------------------------------------------------------
[[ -f "$UPSTREAM" ]] || skip "no upstream test file at $UPSTREAM (it is git-ignored: take it from PyTorch's test/test_cuda.py, see .upstream/SOURCE.txt, and carry .upstream to the GPU machine)"
UPSTREAM=$(cd "$(dirname "$UPSTREAM")" && pwd)/$(basename "$UPSTREAM")
if [[ "${VRAMLEDGER_UPSTREAM_ASSUME_GPU:-0}" != 1 ]]; then  # 1: tests of this script on CPU
  gpus=$(timeout 30 nvidia-smi -L 2>/dev/null)  # captured first: no SIGPIPE under pipefail
  [[ "$gpus" == *"GPU "* ]] || skip "no GPU (nvidia-smi lists none)"
  "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 \
    || skip "no GPU for torch ($PYTHON: torch missing or torch.cuda.is_available() is False)"
fi
"$PYTHON" -c "import pytest" >/dev/null 2>&1 || skip "pytest is not installed for $PYTHON"
if ! command -v meson >/dev/null 2>&1; then  # torch's virtualenv may hold meson and ninja
  PATH="$(dirname "$PYTHON"):$PATH"
fi
mkdir -p "$RESULTS" "$DETAIL" "$WORK"
rm -f "$DETAIL"/native.xml "$DETAIL"/vramledger.xml "$DETAIL"/native.log "$DETAIL"/vramledger.log

# --- the staged package (as tests/torch/run_on_gpu.sh stages it) -----------------------------
if (( RESTAGE )) || [[ ! -f "$STAGE/vramledger/libvramledger_torch.so" ]]; then
  say "stage the vramledger package from $BUILD (tests/torch/run_on_gpu.sh --stage-only)"
  OUT="$WORK/stage-logs" VRAMLEDGER_TORCH_GPU_BUDGET_S=$(( $(remaining) - 60 )) \
    bash tests/torch/run_on_gpu.sh --build-dir "$BUILD" --stage-only >"$DETAIL/stage.log" 2>&1
  stage_status=$?
  if (( SHIM )) && (( stage_status == 0 )); then
    # The LD_PRELOAD shim, as a user's install has it (vramledger run uses it when found).
    if ninja -C "$BUILD" preload/libvramledger_preload.so preload/libvramledger_route.so \
        >>"$DETAIL/stage.log" 2>&1; then
      "$PYTHON" tests/torch/stage_package.py "$BUILD" "$STAGE" >>"$DETAIL/stage.log" 2>&1
    else
      echo "(the LD_PRELOAD shim did not build: vramledger run goes without it)" >>"$DETAIL/stage.log"
    fi
  fi
  cp -f "$WORK"/stage-logs/torch/*.log "$WORK"/stage-logs/torch/env.txt "$DETAIL/" 2>/dev/null
  if (( stage_status != 0 )) || [[ ! -f "$STAGE/vramledger/libvramledger_torch.so" ]]; then
    tail -n 20 "$DETAIL/stage.log"
    echo "torch_upstream_tests: the vramledger package could not be built and staged (see $DETAIL/stage.log)"
    echo "upstream allocator tests: not run (vramledger package not built)"
    exit 0
  fi
fi
PYTHONPATH="$STAGE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m vramledger where >"$DETAIL/where.txt" 2>&1
say "vramledger parts:"; sed 's/^/  /' "$DETAIL/where.txt"

# --- the two runs -----------------------------------------------------------------------------
pytest_args=(-p no:cacheprovider -v -rfE --tb=short -c /dev/null --rootdir "$(dirname "$UPSTREAM")")
# tests/torch_upstream/upstream_plugin.py: test order (fewer extension builds) and, without
# pytest-timeout, the per-test limit.
plugin_path="$REPO/tests/torch_upstream"
pytest_args+=(-p upstream_plugin)
if "$PYTHON" -c "import pytest_timeout" >/dev/null 2>&1; then
  pytest_args+=(--timeout="$TEST_TIMEOUT")
  per_test="per-test limit ${TEST_TIMEOUT}s (pytest-timeout)"
else
  export VRAMLEDGER_UPSTREAM_TEST_TIMEOUT_S=$TEST_TIMEOUT
  per_test="per-test limit ${TEST_TIMEOUT}s (SIGALRM; no pytest-timeout)"
fi
[[ -n "$KEXPR" ]] && pytest_args+=(-k "$KEXPR")

# The tests there are, so that those a run did not reach read "not run".
( cd "$(dirname "$UPSTREAM")" && PYTHONPATH="$plugin_path${PYTHONPATH:+:$PYTHONPATH}" \
    timeout --kill-after=10 120 "$PYTHON" -m pytest "${pytest_args[@]}" --collect-only -q -q "$UPSTREAM" ) \
  >"$DETAIL/collect.log" 2>&1
grep -E '^\S+\.py::' "$DETAIL/collect.log" >"$DETAIL/collected.txt" || true
say "collected $(wc -l <"$DETAIL/collected.txt") tests ($DETAIL/collect.log)"

# run_upstream LABEL LIMIT_S [launcher...]: pytest on the upstream file, XML + log in $DETAIL.
# SIGINT first so pytest writes its XML for what it finished; SIGKILL 20 s later. A shell
# without job control starts commands with SIGINT ignored (and Python then keeps it ignored), so
# the command goes through a one-line exec that puts SIGINT back to its default first.
sigint_default=("$PYTHON" -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])')
run_upstream() {
  local label=$1 limit=$2
  shift 2
  # One torch_extensions folder for both runs (an extension built by the first run and
  # unchanged is not built again); a lock left by a run that was stopped mid-build would make
  # load_inline wait forever.
  mkdir -p "$WORK/torch_extensions"
  find "$WORK/torch_extensions" -name lock -type f -delete 2>/dev/null
  say "$label run (limit ${limit}s, $per_test)"
  local t0
  t0=$(date +%s)
  ( cd "$(dirname "$UPSTREAM")" && TORCH_EXTENSIONS_DIR="$WORK/torch_extensions" PYTHONUNBUFFERED=1 \
      PYTHONPATH="$plugin_path${PYTHONPATH:+:$PYTHONPATH}" \
      timeout -s INT --kill-after=20 "$limit" "${sigint_default[@]}" "$@" "$PYTHON" -m pytest "${pytest_args[@]}" \
      --junitxml="$DETAIL/$label.xml" "$UPSTREAM" ) >"$DETAIL/$label.log" 2>&1
  local status=$?
  local took=$(( $(date +%s) - t0 ))
  local note="exit $status in ${took}s"
  (( status == 124 || status == 137 )) && note="$note: STOPPED at its ${limit}s limit"
  eval "${label}_note=\"\$note\""
  grep -E "^(FAILED|ERROR) |^=+ .* in [0-9.]+s" "$DETAIL/$label.log" | tail -n 40
  say "$label: $note"
}

left=$(remaining)
native_limit=$(( (left - 30) / 2 ))
(( native_limit > RUN_MAX )) && native_limit=$RUN_MAX
if (( native_limit < 60 )); then
  echo "torch_upstream_tests: only ${left}s of the ${BUDGET}s budget left after staging"
  echo "upstream allocator tests: not run (budget)"
  exit 0
fi
run_upstream native "$native_limit"

vl_limit=$(( $(remaining) - 15 ))
(( vl_limit > RUN_MAX )) && vl_limit=$RUN_MAX
launcher=(env "PYTHONPATH=$STAGE:$plugin_path${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m vramledger run)
[[ -n "$CONF" ]] && launcher+=(--conf "$CONF")
launcher+=(--)
if (( vl_limit < 60 )); then
  vramledger_note="not run: only $(remaining)s of the budget left"
  say "vramledger: $vramledger_note"
else
  run_upstream vramledger "$vl_limit" "${launcher[@]}"
fi

# --- the table ----------------------------------------------------------------------------------
torch_line=$("$PYTHON" -c "import torch; print(torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" 2>/dev/null)
"$PYTHON" tests/torch_upstream/compare_junit.py \
  --native "$DETAIL/native.xml" --native-log "$DETAIL/native.log" \
  --vramledger "$DETAIL/vramledger.xml" --vramledger-log "$DETAIL/vramledger.log" \
  --collected "$DETAIL/collected.txt" \
  --md "$RESULTS/torch_upstream.md" --json "$RESULTS/torch_upstream.json" \
  --note "date: $(date -u +%Y-%m-%dT%H:%M:%SZ); git: $(git rev-parse --short HEAD 2>/dev/null) ($(git status --short 2>/dev/null | wc -l) uncommitted paths)" \
  --note "torch: $torch_line; python: $("$PYTHON" -c 'import sys; print(sys.version.split()[0])')" \
  --note "file: $UPSTREAM ($(grep -m1 -i '^commit' "$(dirname "$UPSTREAM")/SOURCE.txt" 2>/dev/null || echo 'no SOURCE.txt'))" \
  --note "native run: ${native_note:-not run}; vramledger run: ${vramledger_note:-not run}" \
  --note "vramledger run: vramledger run ${CONF:+--conf $CONF }-- (package: $STAGE; shim: $(grep -m1 -i 'preload\|shim' "$DETAIL/where.txt" 2>/dev/null | tr -s ' ' || echo '?'))" \
  --note "$per_test" \
  >"$DETAIL/compare.txt" 2>&1
compare_status=$?
sed '/^## All tests/,$d' "$DETAIL/compare.txt"
echo "table: $RESULTS/torch_upstream.md, $RESULTS/torch_upstream.json; XML and logs: $DETAIL/"
if (( compare_status != 0 )); then
  echo "upstream allocator tests: comparison failed (exit $compare_status, see $DETAIL/compare.txt)"
else
  tail -n 1 "$DETAIL/compare.txt"
fi
exit 0

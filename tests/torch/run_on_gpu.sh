#!/usr/bin/env bash
# The PyTorch integration on a GPU machine: builds libvramledger_torch.so and the vramledger
# Python package against the machine's torch, stages the package, and runs tests/torch.
#
#   bash tests/torch/run_on_gpu.sh [--build-dir DIR] [--quick]
#
#   --build-dir DIR  reuse a configured build folder (e.g. scripts/gpu_suite.sh's
#                    build-gpu-suite) instead of configuring build-torch-gpu
#   --quick          test_installed with the default backend only (not once per backend)
#   --stage-only     stop after staging the package (for later suites that only need it)
#
# Logs, JUnit XML and summary.txt go to $OUT/torch when $OUT is set (the device runner returns
# that folder), else to build-torch-gpu-logs/. Exit status 0 when every step passed. The
# summary's last line is "N passed, N failed, N skipped".
#
# Steps:
#   env        GPU, torch, meson, Python headers
#   configure  meson setup -Dcuda=enabled -Dtorch_plugin=enabled -Dtests=false (no GoogleTest
#              needed here; the plugin's self-test runs in CI on the simulated device)
#   build      only the plugin's targets (vramledger_torch, _C)
#   stage      tests/torch/stage_package.py: an importable package under $STAGE
#   pytest     test_bootstrap + test_processes once, test_installed per backend (auto = vmm,
#              cuda_malloc, malloc_async)
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
START=$(date +%s)
BUDGET=${VRAMLEDGER_TORCH_GPU_BUDGET_S:-400}  # whole run; later steps shrink or skip to fit
remaining() { echo $(( BUDGET - ($(date +%s) - START) )); }
BUILD=build-torch-gpu
QUICK=0
STAGE_ONLY=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) BUILD=$2; shift ;;
    --quick) QUICK=1 ;;
    --stage-only) STAGE_ONLY=1 ;;
    *) echo "run_on_gpu: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [[ -n "${OUT:-}" ]]; then LOGS="$OUT/torch"; else LOGS="$REPO/build-torch-gpu-logs"; fi
STAGE="$REPO/build-torch-gpu-stage"
mkdir -p "$LOGS"
SUMMARY=()
FAILURES=0
PASSED=0
FAILED=0
SKIPPED=0
add_summary() { SUMMARY+=("$*"); printf '%s\n' "${SUMMARY[@]}" >"$LOGS/summary.txt"; }

export PATH="/usr/local/cuda/bin:$PATH"
PYTHON=${PYTHON:-$(command -v python3)}
if ! command -v meson >/dev/null 2>&1; then  # torch's virtualenv may hold meson and ninja
  PATH="$(dirname "$PYTHON"):$PATH"
fi
# Keep multi-GPU machines' NVLink multicast off (the device runner asks for it).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# --- env ---
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git rev-parse HEAD 2>/dev/null) ($(git status --short 2>/dev/null | wc -l) uncommitted paths)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  echo "python: $PYTHON"
  "$PYTHON" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'cxx11abi', torch.compiled_with_cxx11_abi(), 'python', sys.version.split()[0])" 2>&1
  "$PYTHON" -c "import sysconfig, os; h = sysconfig.get_paths()['include']; print('Python.h:', os.path.exists(os.path.join(h, 'Python.h')), h)" 2>&1
  "$PYTHON" -c "import pytest, torchvision; print('pytest', pytest.__version__, 'torchvision', torchvision.__version__)" 2>&1
  "$PYTHON" -c "import transformers; print('transformers', transformers.__version__)" 2>&1
  echo "meson: $(command -v meson) $(meson --version 2>&1); ninja $(ninja --version 2>&1)"
  echo "g++: $(g++ --version 2>&1 | head -n 1); nvcc: $(nvcc --version 2>&1 | tail -n 2 | head -n 1)"
} >"$LOGS/env.txt" 2>&1
cat "$LOGS/env.txt"

# --- configure + build ---
if [[ ! -f "$BUILD/build.ninja" ]]; then
  echo "=== configure $BUILD"
  if ! meson setup "$BUILD" --buildtype=release -Dcuda=enabled -Dtorch_plugin=enabled \
      -Dtorch_python="$PYTHON" -Dtests=false -Dbenchmarks=disabled >"$LOGS/configure.log" 2>&1; then
    tail -n 30 "$LOGS/configure.log"
    add_summary "configure: FAILED (see configure.log)"
    echo "0 passed, 1 failed, 0 skipped" | tee -a "$LOGS/summary.txt"
    exit 1
  fi
fi
echo "=== build plugin targets in $BUILD"
# The plugin's outputs, by file (the extension's name carries the interpreter's suffix), and the
# LD_PRELOAD shim and routing library that `vramledger run` loads (tests under `vramledger run`
# need them staged: without them the run goes on unclassified).
mapfile -t targets < <(meson introspect "$BUILD" --targets 2>/dev/null | "$PYTHON" -c '
import json, os, sys
build = os.path.realpath(sys.argv[1])
for t in json.load(sys.stdin):
    if t["name"] in ("vramledger_torch", "vramledger_preload", "vramledger_route") or \
            t["name"].startswith("_C"):
        for f in t["filename"]:
            print(os.path.relpath(os.path.realpath(f), build))' "$BUILD")
if [[ ${#targets[@]} -eq 0 ]]; then
  add_summary "build: the plugin is not configured in $BUILD (torch or CUDA not found? see configure.log)"
  echo "0 passed, 1 failed, 0 skipped" | tee -a "$LOGS/summary.txt"
  exit 1
fi
start=$(date +%s)
if ninja -C "$BUILD" "${targets[@]}" >"$LOGS/build.log" 2>&1; then
  add_summary "build: ok (${targets[*]}) in $(( $(date +%s) - start ))s; compiler warnings: $(grep -c 'warning:' "$LOGS/build.log")"
else
  grep -E "error|FAILED" "$LOGS/build.log" | head -n 20
  add_summary "build: FAILED (see build.log)"
  echo "0 passed, 1 failed, 0 skipped" | tee -a "$LOGS/summary.txt"
  exit 1
fi

# --- stage ---
if ! "$PYTHON" tests/torch/stage_package.py "$BUILD" "$STAGE" >"$LOGS/stage.log" 2>&1; then
  cat "$LOGS/stage.log"
  add_summary "stage: FAILED"
  echo "0 passed, 1 failed, 0 skipped" | tee -a "$LOGS/summary.txt"
  exit 1
fi
export PYTHONPATH="$STAGE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
if (( STAGE_ONLY )); then
  add_summary "stage: ok ($STAGE); pytest not run (--stage-only)"
  echo "0 passed, 0 failed, 0 skipped (staged only)" | tee -a "$LOGS/summary.txt"
  exit 0
fi

# --- pytest ---
# run_pytest LABEL LIMIT_S [VAR=VALUE...] -- PYTEST ARGS...
run_pytest() {
  local label=$1 limit=$2
  shift 2
  local left
  left=$(remaining)
  # Under 45 s a step would be killed between its tests and its exit (pytest's import and
  # teardown are ~10 s on the H200), which reads as a failure: skip it instead.
  if (( left < 45 )); then
    add_summary "pytest $label: SKIPPED (only ${left}s of the budget left)"
    return 0
  fi
  (( limit > left - 10 )) && limit=$(( left - 10 ))
  local envs=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do envs+=("$1"); shift; done
  shift
  local xml="$LOGS/$label.xml"
  echo "=== pytest $label ${envs[*]}"
  env "${envs[@]}" timeout --kill-after=10 "$limit" "$PYTHON" -m pytest -p no:cacheprovider -v -rs \
    --junitxml="$xml" "$@" >"$LOGS/$label.log" 2>&1
  local status=$?
  tail -n 30 "$LOGS/$label.log"
  local counts
  counts=$("$PYTHON" - "$xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0 0"); sys.exit()
p = f = s = 0
for case in root.iter("testcase"):
    if case.find("failure") is not None or case.find("error") is not None: f += 1
    elif case.find("skipped") is not None: s += 1
    else: p += 1
print(p, f, s)
EOF
)
  read -r p f s <<<"$counts"
  if (( status != 0 && f == 0 )); then f=1; fi  # crashed or timed out before writing results
  PASSED=$((PASSED + p)); FAILED=$((FAILED + f)); SKIPPED=$((SKIPPED + s))
  add_summary "pytest $label: $p passed, $f failed, $s skipped (exit $status)"
  (( status != 0 )) && FAILURES=$((FAILURES + 1))
  return 0
}

run_pytest installed-auto 120 VRAMLEDGER_TEST_CONF= -- tests/torch/test_installed.py
run_pytest processes 200 -- tests/torch/test_bootstrap.py tests/torch/test_processes.py -s
run_pytest sleep 300 -- tests/torch/test_sleep.py tests/torch/test_graphs.py  # sleep and wake by tag and of graph pools (docs/sleep.md; torch.compile ~1 min), graph memory (docs/graphs.md)
if [[ $QUICK == 0 ]]; then
  run_pytest installed-cuda_malloc 90 VRAMLEDGER_TEST_CONF=backend:cuda_malloc -- tests/torch/test_installed.py
  run_pytest installed-malloc_async 90 VRAMLEDGER_TEST_CONF=backend:malloc_async -- tests/torch/test_installed.py
fi
while IFS= read -r line; do
  add_summary "  $line"
done < <(grep -h "native peak allocated" "$LOGS/processes.log" 2>/dev/null)

# --- latency from Python (not a test: figures for bench/results/torch) ---
if [[ $QUICK == 0 ]] && (( $(remaining) > 45 )); then
  echo "=== bench_python_alloc"
  timeout --kill-after=5 $(( $(remaining) - 10 )) "$PYTHON" tests/torch/bench_python_alloc.py --iterations 10000 \
    >"$LOGS/bench_python_alloc.md" 2>&1
  bench_status=$?
  cat "$LOGS/bench_python_alloc.md"
  add_summary "bench_python_alloc: exit $bench_status (table in bench_python_alloc.md)"
fi

{
  echo
  echo "================ vramledger torch plugin on GPU ================"
  printf '%s\n' "${SUMMARY[@]}"
  echo "logs: $LOGS"
  echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
} | tee "$LOGS/summary.txt"
(( FAILURES == 0 ))

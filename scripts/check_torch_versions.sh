#!/usr/bin/env bash
# Compiles the torch plugin and runs its simulated-device self-tests against each torch release
# given (default: every supported minor release, 2.11 to 2.15), and checks that a torch outside
# the range is refused at configure time with a message naming the range. One line per version:
#
#   torch 2.15.0: ok (plugin built, self-tests 22 + 6 passed)
#
# Usage: scripts/check_torch_versions.sh [--record] [VERSION ...]
#   --record  also writes bench/results/compat/torch-versions-<date>-<commit>.txt
#
# Each torch goes into .deps/torch-<VERSION>/ (a venv; the wheel from PyPI with --no-deps: the
# build needs only torch's headers and libraries) and is built in build-torch-<VERSION>/. No GPU
# is needed; behaviour on a GPU is proven by scripts/gpu_suite.sh on the device's torch.
# Exit status: 0 when every version is ok.
set -uo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
if [[ -x .venv/bin/meson ]]; then export PATH="$repo_root/.venv/bin:$PATH"; fi

record=0
versions=()
for arg in "$@"; do
  case "$arg" in
    --record) record=1 ;;
    -*) echo "check_torch_versions: unknown option $arg" >&2; exit 2 ;;
    *) versions+=("$arg") ;;
  esac
done
((${#versions[@]})) || versions=(2.11.0 2.12.1 2.13.0 2.14.1 2.15.0)

jobs=$(nproc)
results=()
failures=0
logs="$repo_root/build-torch-logs"
mkdir -p "$logs"

# check_version VERSION: prints its result line, returns non-zero on failure.
check_version() {
  local version=$1 venv=".deps/torch-$1" build="build-torch-$1" log="$logs/torch-$1.log"
  : >"$log"
  # The torch scripts/setup.sh pinned in .venv serves when it is this version (no second download).
  if .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('torch') != '$version')" 2>/dev/null; then
    venv=.venv
  fi
  if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('torch') != '$version')" 2>/dev/null; then
    rm -rf "$venv"
    if ! { python3 -m venv "$venv" &&
           "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "torch==$version"; } >>"$log" 2>&1; then
      echo "torch $version: FAILED (could not install the wheel; see $log)"; return 1
    fi
  fi
  rm -rf "$build"
  if ! meson setup "$build" -Dtorch_python="$repo_root/$venv/bin/python" -Dtorch_plugin=enabled \
       -Dcuda=enabled -Dbenchmarks=disabled --werror >>"$log" 2>&1; then
    echo "torch $version: FAILED (configure; see $log)"; return 1
  fi
  if ! ninja -C "$build" -j "$jobs" torch_plugin/libvramledger_torch.so \
       torch_plugin/torch_plugin_selftest torch_plugin/torch_process_report_selftest \
       torch_plugin/torch_plugin_threads_selftest >>"$log" 2>&1; then
    echo "torch $version: FAILED (compile; see $log)"
    grep -m3 -E "error" "$log" | sed 's/^/    /'
    return 1
  fi
  local counts=() binary out
  for binary in torch_plugin_selftest torch_process_report_selftest torch_plugin_threads_selftest; do
    if ! out=$(VRAMLEDGER_TORCH_ALLOW_SIMULATED=1 timeout 300 "$build/torch_plugin/$binary" 2>&1); then
      echo "$out" >>"$log"
      echo "torch $version: FAILED ($binary; see $log)"; return 1
    fi
    echo "$out" >>"$log"
    counts+=("$(grep -oE '\[  PASSED  \] [0-9]+' <<<"$out" | grep -oE '[0-9]+$')")
  done
  echo "torch $version: ok (plugin built, self-tests ${counts[0]} + ${counts[1]} + ${counts[2]} passed)"
}

# A torch outside the range must stop the configure step with a message naming the range, never
# reach the compiler: a stand-in torch 2.10.0 package (version file and library names only).
check_refusal() {
  local fake="$logs/fake-torch-2.10" log="$logs/refusal.log" build="build-torch-refusal"
  rm -rf "$fake" "$build"
  mkdir -p "$fake/torch/lib" "$fake/torch/include"
  echo 'raise ImportError("stand-in torch for check_torch_versions.sh")' >"$fake/torch/__init__.py"
  echo '__version__ = "2.10.0"' >"$fake/torch/version.py"
  printf 'St7__cxx1112basic_string' >"$fake/torch/lib/libc10.so"
  PYTHONPATH="$fake" meson setup "$build" -Dtorch_python=python3 -Dtorch_plugin=enabled \
    -Dcuda=enabled -Dbenchmarks=disabled -Dtests=false >"$log" 2>&1
  local status=$?
  if [[ $status -ne 0 ]] && grep -q "outside the supported range 2.11 to 2.15" "$log"; then
    echo "torch 2.10.0 (stand-in): ok (refused at configure time: $(grep -o 'outside the supported range 2.11 to 2.15' "$log" | head -1))"
    rm -rf "$build"
    return 0
  fi
  echo "torch 2.10.0 (stand-in): FAILED (not refused with the range message; see $log)"
  return 1
}

for version in "${versions[@]}"; do
  line=$(check_version "$version") || failures=$((failures + 1))
  echo "$line"
  results+=("$line")
done
line=$(check_refusal) || failures=$((failures + 1))
echo "$line"
results+=("$line")

if ((record)); then
  mkdir -p bench/results/compat
  out="bench/results/compat/torch-versions-$(date -u +%F)-$(git rev-parse --short HEAD).txt"
  {
    echo "# scripts/check_torch_versions.sh ${versions[*]}"
    echo "# date: $(date -u +%FT%TZ)  commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- torch_plugin || echo ' (+ uncommitted torch_plugin changes)')"
    echo "# machine: $(uname -m), $(nproc) cores, $(g++ --version | head -1), nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo '?'); no GPU (simulated-device self-tests)"
    printf '%s\n' "${results[@]}"
  } >"$out"
  echo "recorded in $out"
fi
exit $((failures > 0))

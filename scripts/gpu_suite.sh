#!/usr/bin/env bash
# The GPU suite: everything vramledger checks on a real GPU, in one command.
#
#   scripts/gpu_suite.sh [--quick] [--keep-build] [--only STEP[,STEP...]] [--skip STEP[,STEP...]]
#                        [--hooks NN[,NN...]]   (extra: only the gpu_suite.d hooks with these numbers)
#
# Steps, in order (names for --only/--skip):
#   env        what the machine is: GPU, driver, nvcc, g++, meson, GoogleTest libraries
#   configure  a fresh build folder (build-gpu-suite) with -Dcuda=enabled
#   build      the GPU targets only (so other folders' breakage or slowness cannot hide them)
#   gpu        tests/gpu binaries (what 'meson test --suite gpu' runs), gtest XML per binary
#   costs      gpu_backend_costs: latency of the raw backends, table + JSON
#   sanitize   compute-sanitizer --tool memcheck over gpu_backends and a light part of gpu_policy
#   build_all  everything else (ninja -k 0)
#   unit       every other Meson suite (meson test --suite S)
#   extra      every scripts/gpu_suite.d/*.sh, in name order (torch plugin tests, benchmarks, ...)
#
# Logs go to build-gpu-suite-logs/. When $OUT is set (the device runner returns that folder, and
# only a few files of it), $OUT gets summary.txt, gpu_backend_costs.json and gpu_suite_logs.tar.gz
# (every log), refreshed after each step so a run cut short still returns what it did. Each step has its own time limit; VRAMLEDGER_GPU_SUITE_BUDGET_S (default
# 400) is the whole run's budget: steps that would start with too little time left are skipped and
# say so. The summary (passed / failed / skipped per suite, key figures) is printed LAST and also
# written to summary.txt. Exit status: 0 when nothing failed.
#
# Adding a suite: drop an executable-bit-free bash file in scripts/gpu_suite.d/ (see README.md
# there). It is sourced with the helpers below available (run_step, run_gtest_binary,
# add_summary, $BUILD, $LOGS, $REPO, $QUICK).
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
START=$(date +%s)
BUDGET=${VRAMLEDGER_GPU_SUITE_BUDGET_S:-400}
BUILD=${VRAMLEDGER_GPU_SUITE_BUILD:-build-gpu-suite}
LOGS="$REPO/build-gpu-suite-logs"
QUICK=0
KEEP_BUILD=0
ONLY=""
SKIP=""
HOOKS=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --keep-build) KEEP_BUILD=1 ;;
    --only) ONLY=",$2,"; shift ;;
    --skip) SKIP=",$2,"; shift ;;
    --hooks) HOOKS=",$2,"; shift ;;
    *) echo "gpu_suite: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
rm -rf "$LOGS"
mkdir -p "$LOGS"
SUMMARY=()       # lines of the final summary
FAILURES=0

# --- helpers -------------------------------------------------------------------------------

elapsed() { echo $(( $(date +%s) - START )); }
remaining() { echo $(( BUDGET - $(elapsed) )); }
add_summary() { SUMMARY+=("$*"); printf '%s\n' "${SUMMARY[@]}" >"$LOGS/summary.txt"; }
note() { echo "=== [gpu_suite +$(elapsed)s] $*"; }

publish() {
  [[ -n "${OUT:-}" ]] || return 0
  mkdir -p "$OUT"
  cp -f "$LOGS/summary.txt" "$OUT/" 2>/dev/null
  cp -f "$LOGS/gpu_backend_costs.json" "$OUT/" 2>/dev/null
  tar czf "$OUT/gpu_suite_logs.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null
  return 0
}

wanted() {  # wanted STEP: not excluded by --only / --skip
  [[ -n "$ONLY" && "$ONLY" != *",$1,"* ]] && return 1
  [[ -n "$SKIP" && "$SKIP" == *",$1,"* ]] && return 1
  return 0
}

# run_step NAME LIMIT_S LOGFILE CMD...: runs CMD with a time limit (cut to the budget left),
# output to LOGFILE and to the console tail. Returns CMD's status (124 on timeout, 125 skipped).
run_step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local left
  left=$(remaining)
  if (( left < 15 )); then
    note "$name: SKIPPED, only ${left}s of the budget left"
    echo "skipped: budget exhausted" >"$log"
    return 125
  fi
  (( limit > left - 5 )) && limit=$(( left - 5 ))
  note "$name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  local status=$?
  tail -n 25 "$log"
  (( status == 124 || status == 137 )) && note "$name: TIMED OUT after ${limit}s"
  return $status
}

# gtest_counts XML -> "passed failed skipped"
gtest_counts() {
  python3 - "$1" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 0 0"); sys.exit()
p = f = s = 0
for case in root.iter("testcase"):
    if case.find("failure") is not None or case.find("error") is not None: f += 1
    elif case.find("skipped") is not None or case.get("result") == "skipped" \
            or case.get("status") == "notrun": s += 1
    else: p += 1
print(p, f, s)
EOF
}

# gtest_properties XML -> "test: key=value" lines for the properties tests recorded
gtest_properties() {
  python3 - "$1" <<'EOF'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    sys.exit()
skip = {"name", "status", "result", "time", "timestamp", "classname", "file", "line",
        "value_param", "type_param"}
for case in root.iter("testcase"):
    props = {k: v for k, v in case.attrib.items() if k not in skip}
    for prop in case.iter("property"):
        props[prop.get("name")] = prop.get("value")
    for k, v in props.items():
        v = " ".join(v.split())
        print(f"{case.get('classname')}.{case.get('name')}: {k}={v[:300]}")
EOF
}

# run_gtest_binary SUITE_LABEL BINARY LIMIT_S [gtest args...]: runs a GoogleTest binary with XML
# output and adds its counts to the summary.
run_gtest_binary() {
  local label=$1 binary=$2 limit=$3
  shift 3
  local xml="$LOGS/$label.xml"
  if [[ ! -x "$binary" ]]; then
    add_summary "$label: NOT BUILT ($binary missing; see build logs)"
    FAILURES=$((FAILURES + 1))
    return
  fi
  run_step "$label" "$limit" "$LOGS/$label.log" "$binary" --gtest_output="xml:$xml" "$@"
  local status=$?
  local counts
  counts=$(gtest_counts "$xml")
  read -r p f s <<<"$counts"
  local verdict="exit $status"
  (( status == 124 || status == 137 )) && verdict="TIMED OUT"
  (( status == 125 )) && verdict="SKIPPED (budget)"
  add_summary "$label: $p passed, $f failed, $s skipped ($verdict)"
  if (( status != 0 )); then FAILURES=$((FAILURES + 1)); fi
  gtest_properties "$xml" >"$LOGS/$label.properties.txt"
}

# --- steps ---------------------------------------------------------------------------------

export PATH="/usr/local/cuda/bin:$PATH"
export CUDA_PATH=${CUDA_PATH:-/usr/local/cuda}
[[ -x .venv/bin/meson ]] && export PATH="$REPO/.venv/bin:$PATH"
if ! command -v meson >/dev/null 2>&1; then  # torch's virtualenv not activated: look for it
  for candidate in /opt/*/bin/meson /opt/*/*/bin/meson "$HOME"/*/bin/meson "$HOME"/.*/bin/meson \
                   /venv/bin/meson /usr/local/bin/meson; do
    if [[ -x "$candidate" ]]; then export PATH="$(dirname "$candidate"):$PATH"; break; fi
  done
fi

step_env() {
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "git: ${VRAMLEDGER_GIT_COMMIT:-$(git -C "$REPO" rev-parse HEAD 2>/dev/null)}"
    nvidia-smi --query-gpu=name,memory.total,driver_version,pci.bus_id --format=csv,noheader 2>&1
    echo "nvcc: $(nvcc --version 2>&1 | tail -n 2 | head -n 1)"
    echo "g++: $(g++ --version 2>&1 | head -n 1)"
    echo "meson: $(command -v meson) $(meson --version 2>&1)"
    echo "ninja: $(command -v ninja) $(ninja --version 2>&1)"
    echo "compute-sanitizer: $(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
    echo "nvml.h: $(ls /usr/local/cuda/include/nvml.h 2>/dev/null || echo absent)"
  } >"$LOGS/env.txt" 2>&1
  cat "$LOGS/env.txt"
  GPU_LINE=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  add_summary "machine: ${GPU_LINE:-no nvidia-smi}; $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*')"
  if ! command -v meson >/dev/null; then
    add_summary "env: meson NOT FOUND on PATH (activate torch's virtualenv first)"
    FAILURES=$((FAILURES + 1))
  fi
  prepare_gtest
}

# GoogleTest: system libraries if present; else build /usr/src/googletest into a local prefix
# with pkg-config files; else leave it to Meson (which can build gtest from /usr/src itself).
prepare_gtest() {
  local libdirs=(/usr/lib/x86_64-linux-gnu /usr/lib /usr/local/lib /usr/lib64)
  for d in "${libdirs[@]}"; do
    if [[ -f "$d/libgtest.a" || -f "$d/libgtest.so" ]] \
        && [[ -f "$d/libgtest_main.a" || -f "$d/libgtest_main.so" ]]; then
      GTEST_SOURCE="system libraries in $d"
      add_summary "gtest: $GTEST_SOURCE"
      return
    fi
  done
  local src=""
  for d in /usr/src/googletest/googletest /usr/src/gtest; do
    [[ -f "$d/src/gtest-all.cc" ]] && src=$d && break
  done
  if [[ -z "$src" ]]; then
    GTEST_SOURCE="no libgtest and no /usr/src/googletest: relying on Meson's gtest fallback"
    add_summary "gtest: $GTEST_SOURCE"
    return
  fi
  local prefix="$REPO/$BUILD-gtest"
  note "building GoogleTest from $src into $prefix"
  mkdir -p "$prefix/lib/pkgconfig" "$prefix/obj"
  local inc
  inc=$(dirname "$src")/googletest/include
  [[ -d "$inc" ]] || inc="$src/include"
  if g++ -std=c++17 -O2 -fPIC -pthread -I"$inc" -I"$src" -c "$src/src/gtest-all.cc" -o "$prefix/obj/gtest-all.o" \
      && g++ -std=c++17 -O2 -fPIC -pthread -I"$inc" -I"$src" -c "$src/src/gtest_main.cc" -o "$prefix/obj/gtest_main.o" \
      && ar rcs "$prefix/lib/libgtest.a" "$prefix/obj/gtest-all.o" \
      && ar rcs "$prefix/lib/libgtest_main.a" "$prefix/obj/gtest_main.o"; then
    cat >"$prefix/lib/pkgconfig/gtest.pc" <<EOF
Name: gtest
Description: GoogleTest built by scripts/gpu_suite.sh from $src
Version: 1.0
Libs: -L$prefix/lib -lgtest -pthread
Cflags: -I$inc -DGTEST_HAS_PTHREAD=1
EOF
    cat >"$prefix/lib/pkgconfig/gtest_main.pc" <<EOF
Name: gtest_main
Description: GoogleTest main built by scripts/gpu_suite.sh
Version: 1.0
Requires: gtest
Libs: -L$prefix/lib -lgtest_main -pthread
EOF
    export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    GTEST_SOURCE="built from $src"
  else
    GTEST_SOURCE="building $src FAILED: relying on Meson's gtest fallback"
  fi
  add_summary "gtest: $GTEST_SOURCE"
}

step_configure() {
  if [[ $KEEP_BUILD == 1 && -f "$BUILD/build.ninja" ]]; then
    add_summary "configure: reused $BUILD (--keep-build)"
    return 0
  fi
  rm -rf "$BUILD"
  run_step configure 120 "$LOGS/configure.log" meson setup "$BUILD" -Dcuda=enabled --buildtype=release
  local status=$?
  if (( status != 0 )); then
    # Another folder's half-finished optional feature must not cost the GPU run: retry without
    # the optional integrations.
    local fallback=(-Dbenchmarks=disabled)
    grep -q "option('torch_plugin'" meson.options 2>/dev/null && fallback+=(-Dtorch_plugin=disabled)
    rm -rf "$BUILD"
    run_step "configure (fallback ${fallback[*]})" 120 "$LOGS/configure-fallback.log" \
      meson setup "$BUILD" -Dcuda=enabled --buildtype=release "${fallback[@]}"
    status=$?
    if (( status == 0 )); then
      add_summary "configure: FAILED with everything; ok with ${fallback[*]} (see configure.log)"
      FAILURES=$((FAILURES + 1))
      return 0
    fi
  fi
  if (( status != 0 )); then
    grep -E "ERROR|error" "$LOGS/configure.log" | head -n 5
    add_summary "configure: FAILED (exit $status; see configure.log)"
    FAILURES=$((FAILURES + 1))
    return 1
  fi
  add_summary "configure: ok ($BUILD, -Dcuda=enabled)"
}

GPU_TARGETS=(tests/gpu/gpu_backends tests/gpu/gpu_backend_costs tests/gpu/gpu_policy)

step_build() {
  [[ -f "$BUILD/build.ninja" ]] || { add_summary "build: no build folder"; return 1; }
  local built=()
  local target
  for target in "${GPU_TARGETS[@]}"; do
    if run_step "build $target" 240 "$LOGS/build-$(basename "$target").log" \
        ninja -C "$BUILD" "$target"; then
      built+=("$(basename "$target")")
    else
      FAILURES=$((FAILURES + 1))
      grep -E "error|FAILED" "$LOGS/build-$(basename "$target").log" | head -n 5
    fi
  done
  local warnings
  warnings=$(cat "$LOGS"/build-gpu_*.log 2>/dev/null | grep -c "warning:")
  add_summary "build (GPU targets): built: ${built[*]:-none}; compiler warnings: $warnings"
}

# Everything else (other folders, torch plugin, benchmarks), after the GPU work: a slow or broken
# build elsewhere must not eat the GPU time.
step_build_all() {
  [[ -f "$BUILD/build.ninja" ]] || return 1
  run_step "build everything" 240 "$LOGS/build-all.log" ninja -C "$BUILD" -k 0
  local status=$?
  local warnings
  warnings=$(grep -c "warning:" "$LOGS/build-all.log")
  if (( status == 0 )); then
    add_summary "build (everything): ok; compiler warnings: $warnings"
  else
    add_summary "build (everything): FAILED or partial (exit $status, see build-all.log)"
    FAILURES=$((FAILURES + 1))
  fi
}

step_gpu() {
  run_gtest_binary gpu_backends "$BUILD/tests/gpu/gpu_backends" 150
  run_gtest_binary gpu_policy "$BUILD/tests/gpu/gpu_policy" 240
  local line
  while IFS= read -r line; do add_summary "  $line"; done \
    < <(grep -h "\[ info \]" "$LOGS/gpu_backends.log" "$LOGS/gpu_policy.log" 2>/dev/null)
}

step_unit() {
  [[ -f "$BUILD/build.ninja" ]] || return 1
  local suites
  suites=$(meson introspect "$BUILD" --tests 2>/dev/null | python3 -c '
import json, sys
suites = set()
for t in json.load(sys.stdin):
    for s in t.get("suite", []):
        s = s.split(":")[-1]
        if s != "gpu": suites.add(s)
print(" ".join(sorted(suites)))' 2>/dev/null)
  if [[ -z "$suites" ]]; then add_summary "unit: no suites found"; return; fi
  local suite
  for suite in $suites; do
    # The randomized stress test at run_tests.sh's length (its 10^6-step default takes ~6 min,
    # longer than this step's limit; the full run is scripts/stress_long.sh).
    run_step "unit $suite" 120 "$LOGS/unit-$suite.log" \
      env VRAMLEDGER_STRESS_OPS="${VRAMLEDGER_STRESS_OPS:-200000}" \
      meson test -C "$BUILD" --no-rebuild --suite "$suite" --print-errorlogs
    local status=$?
    local ok fail skip timeout_count
    ok=$(grep -oE "^Ok: +[0-9]+" "$LOGS/unit-$suite.log" | grep -oE "[0-9]+" | tail -n 1)
    fail=$(grep -oE "^Fail: +[0-9]+" "$LOGS/unit-$suite.log" | grep -oE "[0-9]+" | tail -n 1)
    skip=$(grep -oE "^Skipped: +[0-9]+" "$LOGS/unit-$suite.log" | grep -oE "[0-9]+" | tail -n 1)
    timeout_count=$(grep -oE "^Timeout: +[0-9]+" "$LOGS/unit-$suite.log" | grep -oE "[0-9]+" | tail -n 1)
    add_summary "unit $suite: ${ok:-0} passed, $(( ${fail:-0} + ${timeout_count:-0} )) failed, ${skip:-0} skipped (meson test programs; exit $status)"
    (( status != 0 )) && FAILURES=$((FAILURES + 1))
  done
}

step_sanitize() {
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [[ ! -x "$sanitizer" ]]; then add_summary "sanitize: compute-sanitizer not found"; return; fi
  local binary="$BUILD/tests/gpu/gpu_backends"
  if [[ -x "$binary" ]]; then
    # Left out: NVML exactness (the tool's own device allocations move NVML's figure) and the
    # death test (its re-executed child hangs under the tool). API errors are not reported: the
    # suites provoke OOM and bad handles on purpose; memory access errors still are.
    run_step "memcheck gpu_backends" 150 "$LOGS/memcheck-gpu_backends.log" \
      "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 99 "$binary" \
      "--gtest_filter=-*Nvml*:*FailedMapRollsBack*"
    local status=$?
    local errors
    errors=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$LOGS/memcheck-gpu_backends.log" | tail -n 1)
    add_summary "memcheck gpu_backends: ${errors:-no summary} (exit $status)"
    (( status != 0 )) && FAILURES=$((FAILURES + 1))
  fi
  binary="$BUILD/tests/gpu/gpu_policy"
  if [[ -x "$binary" ]]; then
    # The light policy tests: the OOM/NVML ones fill the device or time NVML, which the tool skews.
    run_step "memcheck gpu_policy" 120 "$LOGS/memcheck-gpu_policy.log" \
      "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 99 "$binary" \
      "--gtest_filter=*EveryAllocatedByte*:*RecordStream*:*HardCap*:*DriverFailures*"
    local status=$?
    local errors
    errors=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$LOGS/memcheck-gpu_policy.log" | tail -n 1)
    add_summary "memcheck gpu_policy (light tests): ${errors:-no summary} (exit $status)"
    (( status != 0 )) && FAILURES=$((FAILURES + 1))
  fi
}

step_costs() {
  local binary="$BUILD/tests/gpu/gpu_backend_costs"
  [[ -x "$binary" ]] || { add_summary "costs: gpu_backend_costs not built"; FAILURES=$((FAILURES + 1)); return; }
  local args=("$LOGS/gpu_backend_costs.json")
  [[ $QUICK == 1 ]] && args+=(--quick)
  run_step costs 120 "$LOGS/gpu_backend_costs.log" "$binary" "${args[@]}"
  local status=$?
  add_summary "costs: exit $status; table in gpu_backend_costs.log, JSON in gpu_backend_costs.json"
  (( status != 0 )) && FAILURES=$((FAILURES + 1))
  # Key figures: medians of a few rows.
  python3 - "$LOGS/gpu_backend_costs.json" >"$LOGS/costs-key.txt" <<'EOF'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"  (no JSON: {e})"); sys.exit()
print(f"  batched cuMemUnmap legal: {data.get('batched_unmap_legal')}; granularity {data.get('granularity')}")
for r in data.get("results", []):
    if r["bytes"] in (2 << 20, 64 << 20, 1 << 30, 8 << 30, 512) or "pages" in r["name"]:
        print(f"  {r['name']} @ {r['bytes']} B: median {r['median_us']:.1f} us (first {r['first_us']:.1f})")
EOF
  local line
  while IFS= read -r line; do add_summary "$line"; done <"$LOGS/costs-key.txt"
}

step_extra() {
  local hook number
  for hook in "$REPO"/scripts/gpu_suite.d/*.sh; do
    [[ -f "$hook" ]] || continue
    number=$(basename "$hook"); number=${number%%-*}
    if [[ -n "$HOOKS" && "$HOOKS" != *",$number,"* ]]; then
      note "extra: $hook not selected (--hooks)"
      continue
    fi
    note "extra: $hook"
    # shellcheck disable=SC1090
    source "$hook"
  done
}

# --- run -----------------------------------------------------------------------------------

for step in env configure build gpu costs sanitize build_all unit extra; do
  wanted "$step" || continue
  "step_$step"
  publish
done

{
  echo
  echo "================ vramledger GPU suite summary ($(elapsed)s of ${BUDGET}s budget) ================"
  printf '%s\n' "${SUMMARY[@]}"
  if (( FAILURES == 0 )); then echo "RESULT: all steps passed"; else echo "RESULT: $FAILURES step(s) failed"; fi
  echo "logs: $LOGS"
} | tee "$LOGS/summary.txt"
publish
(( FAILURES == 0 ))

# Faults on the real GPU (issue 16, tests/gpu/fault_injection_gpu.cpp): FaultInjectingBackend at 10%
# over vmm and cuda_malloc, 1,000,000 operations per backend or 40 s each (VRAMLEDGER_FAULT_OPS,
# VRAMLEDGER_FAULT_SECONDS; 500,000 took 12.5 s and 2.5 s on the H200), NVML == census reserved, teardown back to the starting usage.
# Alone: scripts/gpu_suite.sh --only env,configure,extra --hooks 12
if ! run_step gpu_faults_build 240 "$LOGS/gpu_faults_build.log" ninja -C "$BUILD" tests/gpu/gpu_faults; then
  add_summary "gpu_faults: not built (see gpu_faults_build.log)"
  FAILURES=$((FAILURES + 1))
else
  (( QUICK )) && export VRAMLEDGER_FAULT_SECONDS=${VRAMLEDGER_FAULT_SECONDS:-8}
  run_gtest_binary gpu_faults "$BUILD/tests/gpu/gpu_faults" 150
  while IFS= read -r line; do add_summary "  $line"; done \
    < <(grep -h "\[ info \]" "$LOGS/gpu_faults.log" 2>/dev/null | cut -c1-600)
  [[ -n "${OUT:-}" ]] && cp "$LOGS/gpu_faults.log" "$OUT/gpu_faults.log"
fi

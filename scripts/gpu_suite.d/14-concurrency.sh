# Concurrency on the GPU (issue 16, tests/gpu/concurrency_gpu.cpp): 16 threads over vmm and
# cuda_malloc with 4 real streams, every block filled and checked by kernels; 10^6 operations per
# backend or 60 s each (VRAMLEDGER_CONCURRENCY_OPS, VRAMLEDGER_CONCURRENCY_SECONDS). Then the same
# under compute-sanitizer --tool memcheck with fewer operations and without the NVML comparisons
# (the tool's own allocations move NVML's figure). racecheck and synccheck are not run: they look
# at shared memory and barriers inside a kernel, which these kernels do not use; races between
# streams on global memory show up as mismatched bytes in the plain run.
# Alone: scripts/gpu_suite.sh --only env,configure,extra --hooks 14
if ! run_step gpu_concurrency_build 240 "$LOGS/gpu_concurrency_build.log" \
    ninja -C "$BUILD" tests/gpu/gpu_concurrency; then
  add_summary "gpu_concurrency: not built (see gpu_concurrency_build.log)"
  FAILURES=$((FAILURES + 1))
else
  (( QUICK )) && export VRAMLEDGER_CONCURRENCY_SECONDS=${VRAMLEDGER_CONCURRENCY_SECONDS:-10}
  run_gtest_binary gpu_concurrency "$BUILD/tests/gpu/gpu_concurrency" 170
  while IFS= read -r line; do add_summary "  $line"; done \
    < <(grep -h "\[ info \]" "$LOGS/gpu_concurrency.log" 2>/dev/null | cut -c1-600)
  [[ -n "${OUT:-}" ]] && cp "$LOGS/gpu_concurrency.log" "$OUT/gpu_concurrency.log"

  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [[ ! -x "$sanitizer" ]]; then
    add_summary "memcheck gpu_concurrency: compute-sanitizer not found"
  else
    run_step "memcheck gpu_concurrency" 200 "$LOGS/memcheck-gpu_concurrency.log" \
      env VRAMLEDGER_CONCURRENCY_NVML=0 VRAMLEDGER_CONCURRENCY_OPS="${VRAMLEDGER_MEMCHECK_CONCURRENCY_OPS:-16000}" \
          VRAMLEDGER_CONCURRENCY_SECONDS=40 \
      "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 99 \
      "$BUILD/tests/gpu/gpu_concurrency"
    status=$?
    errors=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$LOGS/memcheck-gpu_concurrency.log" | tail -n 1)
    passed=$(grep -cE "^\[       OK \]" "$LOGS/memcheck-gpu_concurrency.log")
    add_summary "memcheck gpu_concurrency: ${errors:-no summary}, $passed passed (exit $status)"
    while IFS= read -r line; do add_summary "  memcheck $line"; done \
      < <(grep -h "\[ info \]" "$LOGS/memcheck-gpu_concurrency.log" 2>/dev/null | cut -c1-400)
    (( status != 0 )) && FAILURES=$((FAILURES + 1))
    [[ -n "${OUT:-}" ]] && cp "$LOGS/memcheck-gpu_concurrency.log" "$OUT/memcheck-gpu_concurrency.log"
  fi
fi

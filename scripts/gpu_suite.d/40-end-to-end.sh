# Real models end to end under each allocator (issues 4 and 7): bench/end_to_end/
# compare_allocators.py (native, expandable segments, cudaMallocAsync, vramledger vmm and
# cuda_malloc; GPT-2 and Llama training, GPT-2 generation, ResNet-50; peak memory, step time,
# losses bitwise against native; vramledger's default over 1.02 peak reserved / peak requested
# fails), then compile_check.py (torch.compile reduce-overhead under
# vramledger). Limits: 240 s for the comparison (120 s under --quick), 90 s for the compile
# check, both cut to the suite's budget. Needs the vramledger package that 20-torch-plugin.sh
# stages in build-torch-gpu-stage. Results (json, md, svg, one log per process) go to
# $LOGS/end_to_end/.
e2e_out="$LOGS/end_to_end"
e2e_stage="$REPO/build-torch-gpu-stage"
e2e_python=${PYTHON:-python3}
mkdir -p "$e2e_out"
if [[ ! -f "$e2e_stage/vramledger/__init__.py" ]]; then
  add_summary "end-to-end: NOT RUN: no staged vramledger package in $e2e_stage (20-torch-plugin.sh stages it; did its build fail?)"
  FAILURES=$((FAILURES + 1))
else
  e2e_commit=${VRAMLEDGER_GIT_COMMIT:-$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)}
  # Workloads are spread over the GPUs (each workload's runs stay on one GPU).
  e2e_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  (( e2e_gpus < 1 )) && e2e_gpus=1
  (( e2e_gpus > 4 )) && e2e_gpus=4

  # --- comparison: its own limit, leaving ~95 s of the budget for the compile check ---
  e2e_limit=240
  (( QUICK )) && e2e_limit=120
  e2e_left=$(remaining)
  (( e2e_limit > e2e_left - 100 )) && e2e_limit=$(( e2e_left - 100 ))
  if (( e2e_limit < 60 )); then
    add_summary "end-to-end: SKIPPED, only ${e2e_left}s of the suite's budget left"
    FAILURES=$((FAILURES + 1))
  else
    # --max-ratio: the default configuration held to issue 14's figure on every workload run.
    e2e_args=(--out "$e2e_out" --commit "$e2e_commit" --gpus "$e2e_gpus"
              --time-limit-s $(( e2e_limit - 15 )) --run-timeout-s 90 --max-ratio 1.02)
    (( QUICK )) && e2e_args+=(--quick)
    run_step end_to_end "$e2e_limit" "$e2e_out/compare_allocators.log" \
      env PYTHONPATH="$e2e_stage${PYTHONPATH:+:$PYTHONPATH}" \
      "$e2e_python" bench/end_to_end/compare_allocators.py "${e2e_args[@]}"
    e2e_status=$?
    e2e_line=$(grep '^SUMMARY ' "$e2e_out/compare_allocators.log" | tail -n 1 | cut -c9-)
    case $e2e_status in
      0) add_summary "end-to-end: ${e2e_line:-no summary} (table in end_to_end/compare_allocators.md)" ;;
      77) add_summary "end-to-end: skipped: ${e2e_line:-no GPU}" ;;
      124|137) add_summary "end-to-end: TIMED OUT after ${e2e_limit}s; ${e2e_line:-no summary}"
               FAILURES=$((FAILURES + 1)) ;;
      *) add_summary "end-to-end: FAILED (exit $e2e_status): ${e2e_line:-no summary}; see end_to_end/compare_allocators.md"
         FAILURES=$((FAILURES + 1)) ;;
    esac
    grep '^FAILURE: ' "$e2e_out/compare_allocators.log" | head -n 5 | while IFS= read -r e2e_failure; do
      echo "  $e2e_failure"
    done
  fi

  # --- torch.compile(mode="reduce-overhead") under vramledger ---
  e2e_limit=90
  e2e_left=$(remaining)
  (( e2e_limit > e2e_left - 5 )) && e2e_limit=$(( e2e_left - 5 ))
  if (( e2e_limit < 40 )); then
    add_summary "compile check: SKIPPED, only ${e2e_left}s of the suite's budget left"
    FAILURES=$((FAILURES + 1))
  else
    run_step compile_check "$e2e_limit" "$e2e_out/compile_check.log" \
      env PYTHONPATH="$e2e_stage${PYTHONPATH:+:$PYTHONPATH}" \
      "$e2e_python" bench/end_to_end/compile_check.py --out "$e2e_out" --commit "$e2e_commit" \
      --time-limit-s $(( e2e_limit - 10 )) --run-timeout-s $(( e2e_limit - 20 ))
    e2e_status=$?
    e2e_line=$(grep '^SUMMARY ' "$e2e_out/compile_check.log" | tail -n 1 | cut -c9-)
    case $e2e_status in
      0) add_summary "compile check: ${e2e_line:-no summary} (end_to_end/compile_check.md)" ;;
      77) add_summary "compile check: skipped: ${e2e_line:-no GPU}" ;;
      124|137) add_summary "compile check: TIMED OUT after ${e2e_limit}s; ${e2e_line:-no summary}"
               FAILURES=$((FAILURES + 1)) ;;
      *) add_summary "compile check: FAILED (exit $e2e_status): ${e2e_line:-no summary}; see end_to_end/compile_check.md"
         FAILURES=$((FAILURES + 1)) ;;
    esac
  fi
fi

# The H200 checks of process classification and profiling (docs/classification.md, "Checks
# still to run on the H200", 1-5): tests/classification_gpu/run_checks.py against the vramledger
# package 20-torch-plugin.sh staged, within 150 s (less when the suite's budget is shorter).
# Results: $LOGS/classification_gpu/{results.json,summary.md,<check>/*.log}; one summary line.
cls_logs="$LOGS/classification_gpu"
cls_stage="$REPO/build-torch-gpu-stage"
cls_python=${PYTHON:-python3}
mkdir -p "$cls_logs"
cls_ready=1
cls_budget=0
if [[ ! -f "$cls_stage/vramledger/libvramledger_torch.so" ]]; then
  # 20-torch-plugin.sh did not stage the package (skipped, or failed): stage it from $BUILD.
  if [[ -f "$BUILD/torch_plugin/libvramledger_torch.so" ]]; then
    "$cls_python" tests/torch/stage_package.py "$BUILD" "$cls_stage" >"$cls_logs/stage.log" 2>&1 \
      || cls_ready=0
  else
    cls_ready=0
  fi
fi
if (( cls_ready == 0 )); then
  add_summary "classification checks: NOT RUN (no vramledger package in $cls_stage and no plugin in $BUILD/torch_plugin)"
  FAILURES=$((FAILURES + 1))
else
  # The shim (for `vramledger run --track-non-torch`) next to the package, else from $BUILD.
  cls_shim="$BUILD/preload/libvramledger_preload.so"
  [[ "$cls_shim" != /* ]] && cls_shim="$REPO/$cls_shim"
  if [[ ! -f "$cls_stage/vramledger/libvramledger_preload.so" ]]; then
    [[ -f "$cls_shim" ]] || run_step classification_shim_build 120 "$cls_logs/shim_build.log" \
      ninja -C "$BUILD" preload/libvramledger_preload.so
    # Missing still: instants.py's shim variant fails and says the shim was not found.
    [[ -f "$cls_shim" ]] && export VRAMLEDGER_PRELOAD_LIBRARY="$cls_shim"
  fi
  cls_budget=$(( $(remaining) - 20 ))
  (( cls_budget > 150 )) && cls_budget=150
fi
if (( cls_ready == 1 && cls_budget < 40 )); then
  add_summary "classification checks 1-5: NOT RUN (only ${cls_budget}s of the suite's budget left; raise VRAMLEDGER_GPU_SUITE_BUDGET_S)"
elif (( cls_ready == 1 )); then
  run_step classification_gpu $(( cls_budget + 15 )) "$cls_logs/run_checks.log" \
    env PYTHONPATH="$cls_stage${PYTHONPATH:+:$PYTHONPATH}" "$cls_python" \
    tests/classification_gpu/run_checks.py --out "$cls_logs" --budget "$cls_budget"
  cls_status=$?
  cls_line=$(cat "$cls_logs/summary_line.txt" 2>/dev/null || echo "no summary line (see run_checks.log)")
  (( cls_status == 124 || cls_status == 137 )) && cls_line="TIMED OUT; $cls_line"
  add_summary "classification checks 1-5 (exit $cls_status): $cls_line"
  (( cls_status != 0 )) && FAILURES=$((FAILURES + 1))
  unset VRAMLEDGER_PRELOAD_LIBRARY
fi

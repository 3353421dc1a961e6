# The PyTorch integration (tests/torch/run_on_gpu.sh) inside the GPU suite, reusing its build
# folder, within what is left of the suite's budget.
# VRAMLEDGER_TORCH_SUITE_MAX_S caps this hook so later hooks keep time; VRAMLEDGER_TORCH_STAGE_ONLY=1
# only builds and stages the package they need.
torch_budget=$(( $(remaining) - 10 ))
torch_cap=${VRAMLEDGER_TORCH_SUITE_MAX_S:-0}
(( torch_cap > 0 && torch_budget > torch_cap )) && torch_budget=$torch_cap
if (( torch_budget < 60 )); then
  add_summary "torch plugin: skipped (only ${torch_budget}s of budget left)"
else
  torch_args=(--build-dir "$BUILD")
  (( QUICK )) && torch_args+=(--quick)
  [[ "${VRAMLEDGER_TORCH_STAGE_ONLY:-0}" == 1 ]] && torch_args+=(--stage-only)
  VRAMLEDGER_TORCH_GPU_BUDGET_S=$torch_budget bash tests/torch/run_on_gpu.sh "${torch_args[@]}" \
    >"$LOGS/torch_plugin.log" 2>&1
  torch_status=$?
  add_summary "torch plugin: $(tail -n 1 "$LOGS/torch_plugin.log") (exit $torch_status)"
  (( torch_status != 0 )) && FAILURES=$((FAILURES + 1))
fi

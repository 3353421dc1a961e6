# The budget board on the GPU (issue 18, docs/board.md): tests/board_gpu/run_board_gpu.py — 2 and
# 4 instances started together with utilization 1/N, one of 3 killed mid-profile — against the
# vramledger package 20-torch-plugin.sh staged, within 120 s (less when the suite's budget is
# shorter). Without a GPU the script says "skipped: no GPU" and passes.
# Results: $LOGS/board_gpu/{results.json,summary.md,<scenario>-<instance>.log}; one summary line.
board_logs="$LOGS/board_gpu"
board_stage="$REPO/build-torch-gpu-stage"
board_python=${PYTHON:-python3}
mkdir -p "$board_logs"
board_ready=1
if [[ ! -f "$board_stage/vramledger/libvramledger_torch.so" ]]; then
  if [[ -f "$BUILD/torch_plugin/libvramledger_torch.so" ]]; then
    "$board_python" tests/torch/stage_package.py "$BUILD" "$board_stage" >"$board_logs/stage.log" 2>&1 \
      || board_ready=0
  else
    board_ready=0
  fi
fi
board_budget=$(( $(remaining) - 20 ))
(( board_budget > 120 )) && board_budget=120
if (( board_ready == 0 )); then
  add_summary "board: NOT RUN (no vramledger package in $board_stage and no plugin in $BUILD/torch_plugin)"
  FAILURES=$((FAILURES + 1))
elif (( board_budget < 40 )); then
  add_summary "board: NOT RUN (only ${board_budget}s of the suite's budget left; raise VRAMLEDGER_GPU_SUITE_BUDGET_S)"
else
  run_step board_gpu $(( board_budget + 15 )) "$board_logs/run.log" \
    env PYTHONPATH="$board_stage${PYTHONPATH:+:$PYTHONPATH}" "$board_python" \
    tests/board_gpu/run_board_gpu.py --out "$board_logs" --budget "$board_budget"
  board_status=$?
  board_line=$(cat "$board_logs/summary_line.txt" 2>/dev/null || echo "no summary line (see run.log)")
  (( board_status == 124 || board_status == 137 )) && board_line="TIMED OUT; $board_line"
  add_summary "board (exit $board_status): $board_line"
  (( board_status != 0 )) && FAILURES=$((FAILURES + 1))
fi

# Sleep and wake by tag against torch_memory_saver (issue 17, docs/sleep.md):
# bench/sleep/bench_sleep.py — 8 GiB of weights offloaded + a 16 GiB KV cache discarded, 3 rounds,
# bytes released (NVML), sleep and wake times, weights bitwise intact and a graph's replay
# identical after each wake — on the vramledger package 20-torch-plugin.sh staged (pinned in the
# first sleep by cudaHostAlloc, by VRAMLEDGER_SLEEP_PIN=register, and at start-up by
# prepare_offload) and on torch_memory_saver in both hook modes when it is importable (its rows
# say so otherwise). Within 200 s.
# Results: $LOGS/sleep/{table.md,results.json}; one summary line.
sleep_logs="$LOGS/sleep"
sleep_stage="$REPO/build-torch-gpu-stage"
sleep_python=${PYTHON:-python3}
mkdir -p "$sleep_logs"
sleep_budget=$(( $(remaining) - 10 ))
(( sleep_budget > 200 )) && sleep_budget=200
if [[ ! -f "$sleep_stage/vramledger/libvramledger_torch.so" ]]; then
  add_summary "sleep: NOT RUN (no vramledger package in $sleep_stage; 20-torch-plugin.sh stages it)"
  FAILURES=$((FAILURES + 1))
elif (( sleep_budget < 60 )); then
  add_summary "sleep: NOT RUN (only ${sleep_budget}s of the suite's budget left)"
else
  run_step sleep_bench $(( sleep_budget + 10 )) "$sleep_logs/table.md" \
    env PYTHONPATH="$sleep_stage${PYTHONPATH:+:$PYTHONPATH}" "$sleep_python" \
    bench/sleep/bench_sleep.py --budget-s "$sleep_budget" --json-out "$sleep_logs/results.json"
  sleep_status=$?
  add_summary "sleep (exit $sleep_status): $(grep -c '^| vramledger[a-z-]* | [0-9]' "$sleep_logs/table.md") vramledger rounds; table in sleep/table.md"
  (( sleep_status != 0 )) && FAILURES=$((FAILURES + 1))
fi

# CUDA IPC between two processes (docs/ipc.md): tests/torch/test_ipc.py on the vramledger package
# 20-torch-plugin.sh staged — producer/consumer bit-exact both ways, consumer or producer exiting
# first, the producer killed, on cuda_malloc and vmm; MemPool tensors, malloc_async refused,
# handles to and from torch's native allocator; and the CPU dry run of the protocol. About 10 s
# per case (12 cases); within 240 s. Log: $LOGS/ipc/pytest.log; one summary line. First, what an
# exportable VMM page costs in cuMemCreate (bench/ipc/handle_type_cost.py, ~5 s):
# $LOGS/ipc/handle_type_cost.md.
ipc_logs="$LOGS/ipc"
ipc_stage="$REPO/build-torch-gpu-stage"
ipc_python=${PYTHON:-python3}
mkdir -p "$ipc_logs"
run_step ipc_handle_type_cost 60 "$ipc_logs/handle_type_cost.md" \
  "$ipc_python" bench/ipc/handle_type_cost.py
ipc_cost_status=$?
add_summary "ipc handle type cost (exit $ipc_cost_status): $(grep -E '^\| [0-9]+ MiB' "$ipc_logs/handle_type_cost.md" | tr -s ' ' | tr '\n' ' ')"
ipc_budget=$(( $(remaining) - 10 ))
(( ipc_budget > 240 )) && ipc_budget=240
if [[ ! -f "$ipc_stage/vramledger/libvramledger_torch.so" ]]; then
  add_summary "ipc: NOT RUN (no vramledger package in $ipc_stage; 20-torch-plugin.sh stages it)"
  FAILURES=$((FAILURES + 1))
elif (( ipc_budget < 60 )); then
  add_summary "ipc: NOT RUN (only ${ipc_budget}s of the suite's budget left)"
else
  run_step ipc_pytest "$ipc_budget" "$ipc_logs/pytest.log" \
    env PYTHONPATH="$ipc_stage${PYTHONPATH:+:$PYTHONPATH}" "$ipc_python" -m pytest \
    -p no:cacheprovider -v -rs -s tests/torch/test_ipc.py
  ipc_status=$?
  add_summary "ipc (exit $ipc_status): $(grep -Eo '[0-9]+ passed|[0-9]+ failed|[0-9]+ skipped' "$ipc_logs/pytest.log" | tr '\n' ' ')"
  (( ipc_status != 0 )) && FAILURES=$((FAILURES + 1))
fi

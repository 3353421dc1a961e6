# One Google Benchmark run comparing allocate + free latency on GPU 0 (bench/gpu_latency):
# vramledger's policy over vmm / cuda_malloc / malloc_async, raw cudaMalloc, cudaMallocAsync and
# torch's native caching allocator (when built against torch), plus cold growth by 1 and 8 GiB.
# Then pivot.py's table and chart.
#
# Time limits: build 240 s; the run 200 s (150 s with --quick, which also shortens every case;
# 90 s before the two RMM peers);
# pivot 30 s. Writes $LOGS/gpu_latency.{log,json,md,svg} (and gpu_latency_build.log).
# VRAMLEDGER_GPU_LATENCY_FILTER=REGEX runs only the matching cases (--benchmark_filter).
# BM_Trace replays recorded programs (bench/gpu_latency/trace_case.hpp): by default T5's and
# GPT-2 training's end-to-end traces from the corpus; VRAMLEDGER_GPU_LATENCY_TRACES="PATH ..."
# names others ("" for none).
gl_target=bench/gpu_latency/vramledger-bench-gpu-latency
gl_binary="$BUILD/$gl_target"
run_step gpu_latency_build 240 "$LOGS/gpu_latency_build.log" ninja -C "$BUILD" "$gl_target"
gl_status=$?
if (( gl_status != 0 )); then
  if (( gl_status == 125 )); then
    add_summary "gpu latency: SKIPPED (suite budget exhausted before the build)"
  elif grep -q "unknown target" "$LOGS/gpu_latency_build.log"; then
    add_summary "gpu latency: NOT CONFIGURED in $BUILD (Google Benchmark or CUDA not found at configure time; see configure.log)"
  else
    add_summary "gpu latency: build FAILED (exit $gl_status; see gpu_latency_build.log)"
  fi
  FAILURES=$((FAILURES + 1))
else
  gl_limit=200
  gl_args=(--benchmark_out="$LOGS/gpu_latency.json" --benchmark_out_format=json)
  if (( QUICK )); then gl_limit=150; gl_args+=(--quick); fi
  gl_traces=${VRAMLEDGER_GPU_LATENCY_TRACES-"$REPO/bench/traces/corpus/t5_train.e2e.vlt.gz $REPO/bench/traces/corpus/gpt2_train.e2e.vlt.gz"}
  for gl_trace in $gl_traces; do gl_args+=(--trace="$gl_trace"); done
  # VRAMLEDGER_GPU_LATENCY_FILTER: a Google Benchmark filter, to rerun some cases only (e.g.
  # the warm pairs and rings of vramledger and torch, without growth and the raw peers).
  if [[ -n "${VRAMLEDGER_GPU_LATENCY_FILTER:-}" ]]; then
    gl_args+=(--benchmark_filter="$VRAMLEDGER_GPU_LATENCY_FILTER")
    add_summary "gpu latency: filter $VRAMLEDGER_GPU_LATENCY_FILTER"
  fi
  rm -f "$LOGS/gpu_latency.json"
  # torch's native allocator is one of the peers: an inherited allocator setting must not
  # replace or reshape it.
  run_step gpu_latency "$gl_limit" "$LOGS/gpu_latency.log" \
    env -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF "$gl_binary" "${gl_args[@]}"
  gl_status=$?
  if grep -q "SKIPPED, no usable CUDA device" "$LOGS/gpu_latency.log"; then
    add_summary "gpu latency: skipped, no usable CUDA device: $(sed -n 's/.*no usable CUDA device (\(.*\)); nothing measured/\1/p' "$LOGS/gpu_latency.log" | head -n 1)"
  else
    gl_pivot="no JSON to pivot (see gpu_latency.log)"
    rm -f "$LOGS/gpu_latency.md" "$LOGS/gpu_latency.svg"
    if [[ -s "$LOGS/gpu_latency.json" ]]; then
      gl_pivot=$(timeout 30 python3 "$REPO/bench/gpu_latency/pivot.py" "$LOGS/gpu_latency.json" \
                   --md "$LOGS/gpu_latency.md" --svg "$LOGS/gpu_latency.svg" 2>&1 | tail -n 1)
      gl_pivot=${gl_pivot#summary: }
      [[ -n "${OUT:-}" && -f "$LOGS/gpu_latency.md" ]] && mkdir -p "$OUT" && cp "$LOGS/gpu_latency.md" "$OUT/"
    fi
    gl_verdict="exit $gl_status"
    (( gl_status == 124 || gl_status == 137 )) && gl_verdict="TIMED OUT (limit ${gl_limit}s, or less when the suite's budget ran short)"
    (( gl_status == 125 )) && gl_verdict="SKIPPED (budget)"
    [[ -f "$LOGS/gpu_latency.md" ]] && gl_verdict="table gpu_latency.md; $gl_verdict"
    add_summary "gpu latency: $gl_pivot ($gl_verdict)"
    # A ledger that disagrees with its allocator, and the failed cases, in the summary too.
    while IFS= read -r gl_line; do add_summary "  $gl_line"; done < <(
      grep -E "^ledger vs census|case\(s\) FAILED|^  BM_|\(setup\)" "$LOGS/gpu_latency.log" \
        | grep -v ": consistent$" | head -n 6 | cut -c 1-240)
    (( gl_status != 0 )) && FAILURES=$((FAILURES + 1))
  fi
fi

# The LD_PRELOAD shim's H200 checks (docs/preload.md, "H200 checks"): builds the shim in $BUILD
# (the torch plugin and the staged package come from 20-torch-plugin.sh), the raw C allocations
# library and the static-cudart program, then runs tests/preload_gpu/run_checks.py (limit 180 s).
# Results: $LOGS/preload_gpu/ (results.json, summary.md, one log per subprocess).
preload_gpu_hook() {
  local out="$LOGS/preload_gpu" python=${PYTHON:-python3}
  local cuda=${CUDA_PATH:-/usr/local/cuda}
  mkdir -p "$out"
  local gpus
  gpus=$(timeout 30 nvidia-smi -L 2>/dev/null)  # captured first: no SIGPIPE under pipefail
  if [[ "$gpus" != *"GPU "* ]]; then
    add_summary "preload GPU checks: skipped: no GPU"
    return 0
  fi
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    add_summary "preload GPU checks: FAILED: $BUILD is not configured"
    FAILURES=$((FAILURES + 1))
    return 0
  fi
  # The shim: part of every build (no CUDA toolkit needed).
  if ! run_step preload_build 120 "$out/build-shim.log" ninja -C "$BUILD" preload/libvramledger_preload.so \
       preload/libvramledger_route.so; then
    add_summary "preload GPU checks: FAILED: the shim did not build (preload_gpu/build-shim.log)"
    FAILURES=$((FAILURES + 1))
    return 0
  fi
  # The staged package (20-torch-plugin.sh); stage it here when that step was skipped.
  local stage="$REPO/build-torch-gpu-stage"
  if [[ ! -f "$stage/vramledger/libvramledger_torch.so" ]]; then
    stage="$REPO/build-preload-gpu-stage"
    timeout 300 ninja -C "$BUILD" torch_plugin/libvramledger_torch.so >"$out/build-plugin.log" 2>&1
    if ! "$python" tests/torch/stage_package.py "$BUILD" "$stage" >>"$out/build-plugin.log" 2>&1; then
      add_summary "preload GPU checks: FAILED: no staged vramledger package (preload_gpu/build-plugin.log)"
      FAILURES=$((FAILURES + 1))
      return 0
    fi
  fi
  # Test programs: raw allocations from C (dynamic cudart, libcuda), and a static-cudart program.
  local bin="$BUILD/preload_gpu"
  mkdir -p "$bin"
  if ! timeout 120 gcc -O2 -fPIC -shared -fno-optimize-sibling-calls -Wall -I"$cuda/include" \
        tests/preload_gpu/raw_alloc.c -o "$bin/libraw_alloc.so" \
        -L"$cuda/lib64" -L"$cuda/lib64/stubs" -Wl,-rpath,"$cuda/lib64" -lcudart -lcuda -ldl \
        >"$out/build-programs.log" 2>&1 \
     || ! timeout 180 nvcc -O2 -cudart static -I"$REPO" tests/preload_gpu/static_cudart.cu \
        -o "$bin/static_cudart" -ldl >>"$out/build-programs.log" 2>&1; then
    add_summary "preload GPU checks: FAILED: test programs did not build (preload_gpu/build-programs.log)"
    FAILURES=$((FAILURES + 1))
    return 0
  fi
  run_step preload_gpu 240 "$out/run_checks.log" \
    env PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}" "$python" tests/preload_gpu/run_checks.py \
      --shim "$BUILD/preload/libvramledger_preload.so" \
      --plugin "$stage/vramledger/libvramledger_torch.so" \
      --raw-lib "$bin/libraw_alloc.so" --static-bin "$bin/static_cudart" \
      --out "$out" --budget 230
  local status=$?
  local line
  line=$(grep '^preload_gpu:' "$out/run_checks.log" | tail -n 1)
  (( status == 124 || status == 137 )) && line="TIMED OUT after 240s; ${line:-no result line}"
  (( status == 125 )) && line="SKIPPED (suite budget exhausted)"
  add_summary "preload GPU checks: ${line:-no result line (see preload_gpu/run_checks.log)} (exit $status)"
  (( status != 0 )) && FAILURES=$((FAILURES + 1))
  return 0
}
preload_gpu_hook

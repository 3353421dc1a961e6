# Sleep and wake by tag, and of a CUDA graph pool, over the VMM backend (issue 17,
# tests/gpu/sleep_gpu.cpp): NVML sees the released bytes go, offloaded and awake neighbours'
# bytes intact on the GPU after the wake, a captured graph writes its output again after it.
# Alone: scripts/gpu_suite.sh --only env,configure,extra --hooks 13
if ! run_step gpu_sleep_build 240 "$LOGS/gpu_sleep_build.log" ninja -C "$BUILD" tests/gpu/gpu_sleep; then
  add_summary "gpu_sleep: not built (see gpu_sleep_build.log)"
  FAILURES=$((FAILURES + 1))
else
  run_gtest_binary gpu_sleep "$BUILD/tests/gpu/gpu_sleep" 60
fi

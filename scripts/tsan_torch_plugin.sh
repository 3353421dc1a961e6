#!/usr/bin/env bash
# The torch plugin's threads self-test (tests/torch/plugin_threads_selftest.cpp: the default
# pool's shards through the event gate, cross-thread frees while history flips) under
# ThreadSanitizer, on the simulated device. Not part of the test command (CI's TSan build has no
# CUDA toolkit or torch; this one compiles the plugin, ~3 minutes on 2 cores): run it after a
# change to torch_plugin/event_gate.hpp, the ledger's shards or the policy's fast paths, and
# record the result. torch's own libraries are not instrumented; the self-test calls only the
# plugin's code from its threads. Needs scripts/setup.sh's .venv with torch.
#
#   bash scripts/tsan_torch_plugin.sh [BUILD_DIR]      (default build-tsan-torch)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
build=${1:-build-tsan-torch}
export PATH="$repo/.venv/bin:$PATH"
if [[ ! -f "$build/build.ninja" ]]; then
  meson setup "$build" --buildtype=plain -Db_ndebug=false -Dcpp_args=-g1 -Dbenchmarks=disabled \
    -Dcuda=enabled -Dtorch_plugin=enabled -Doptimization=1 -Db_sanitize=thread >/dev/null
fi
ninja -C "$build" torch_plugin/torch_plugin_threads_selftest >/dev/null
log=$(mktemp)
status=0
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" VRAMLEDGER_TORCH_ALLOW_SIMULATED=1 \
  "$build/torch_plugin/torch_plugin_threads_selftest" >"$log" 2>&1 || status=$?
warnings=$(grep -c "WARNING: ThreadSanitizer" "$log" || true)
tail -n 3 "$log"
echo "tsan_torch_plugin: exit $status, $warnings ThreadSanitizer warnings (log: $log)"
exit $status

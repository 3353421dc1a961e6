#!/usr/bin/env bash
# The main job: builds vramledger (release) and runs it on workloads, printing the ledger's
# accounts and the memory figures.
#   1. vramledger-demo: a synthetic GPT-style training loop through the caching allocator on the
#      simulated device (paged heap and segment heap), with the ledger's full text report.
#   2. vramledger-replay: the recorded real-model traces in bench/traces/corpus/, replayed on the
#      simulated device, peak reserved / peak requested next to what PyTorch reserved.
#   3. With a GPU (nvidia-smi lists one, and the build found CUDA): the same training loop on the
#      real device through the VMM and cudaMalloc backends.
# Everything printed is also written to build-main/main_job.log. Run scripts/setup.sh first.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
if [[ -x .venv/bin/meson ]]; then export PATH="$repo_root/.venv/bin:$PATH"; fi
build=build-main

if [[ ! -f "$build/build.ninja" ]]; then
  meson setup "$build" --buildtype=release -Dcuda=auto -Dbenchmarks=disabled >/dev/null
fi
targets=(vramledger-demo)
# vramledger-replay needs CLI11 (libcli11-dev); it is skipped where the library is missing.
if meson introspect "$build" --targets | grep -q '"name": "vramledger-replay"'; then
  targets+=(vramledger-replay)
fi
meson compile -C "$build" "${targets[@]}" >/dev/null

log="$build/main_job.log"
{
  echo "vramledger main job — commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo "### 1. Synthetic training loop on the simulated device"
  "$build/bench/demo/vramledger-demo"

  shopt -s nullglob
  traces=(bench/traces/corpus/*.vlt.gz)
  if [[ -x "$build/bench/replay/vramledger-replay" && ${#traces[@]} -gt 0 ]]; then
    echo "### 2. Recorded real-model traces replayed on the simulated device"
    "$build/bench/replay/vramledger-replay" --check "${traces[@]}"
    echo
  else
    echo "### 2. (skipped: vramledger-replay not built or no traces in bench/traces/corpus/)"
  fi

  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
     "$build/bench/demo/vramledger-demo" --help >/dev/null &&
     grep -q VRAMLEDGER_HAVE_CUDA "$build/compile_commands.json"; then
    echo "### 3. Synthetic training loop on the GPU ($(nvidia-smi -L | head -1))"
    "$build/bench/demo/vramledger-demo" --backend vmm --conf ""
    "$build/bench/demo/vramledger-demo" --backend cuda_malloc --conf "paged_heap:false"
  else
    echo "### 3. (skipped: no GPU, or this build has no CUDA backends)"
  fi
} 2>&1 | tee "$log"

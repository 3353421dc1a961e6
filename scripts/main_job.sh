#!/usr/bin/env bash
# The main job: builds vramledger (release) and runs it on workloads, printing the ledger's
# accounts and the memory figures (docs/stats.md defines every line).
#   1. vramledger-demo: a synthetic GPT-style training loop through the caching allocator on the
#      simulated device (paged heap and segment heap): the ledger's account at the instant
#      reserved memory peaks, the state at the end, the consistency checks made at both, and a
#      legend of every line.
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
# (The listing into a variable first: grep -q closing a pipe early reads as failure under pipefail.)
build_targets=$(meson introspect "$build" --targets)
if grep -q '"name": "vramledger-replay"' <<<"$build_targets"; then
  targets+=(vramledger-replay)
fi
meson compile -C "$build" "${targets[@]}" >/dev/null

log="$build/main_job.log"
status=0
{
  echo "vramledger main job — commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo "### 1. Synthetic training loop on the simulated device"
  "$build/bench/demo/vramledger-demo" || status=1

  shopt -s nullglob
  traces=(bench/traces/corpus/*.vlt.gz)
  if [[ -x "$build/bench/replay/vramledger-replay" && ${#traces[@]} -gt 0 ]]; then
    echo "### 2. Recorded real-model traces replayed on the simulated device"
    echo "Each trace (recorded on the H200 under PyTorch 2.11) replayed through both heaps; sizes in"
    echo "bytes. 'recorded run (torch)' is what PyTorch's own allocator reserved in the recorded run."
    echo
    if "$build/bench/replay/vramledger-replay" --check "${traces[@]}"; then
      echo
      echo "check: passed (after each of the ${#traces[@]} x 2 replays, the ledger's counters equal a recount"
      echo "of the allocator's blocks, and its peak requested equals the trace's)"
    else
      echo
      echo "check: FAILED (vramledger-replay --check exited non-zero; its errors are above)"
      status=1
    fi
    cat <<'LEGEND'

Columns: peak requested = the most memory the program's live tensors asked for at once;
peak reserved = the most memory the allocator held from the driver; ratio = peak reserved /
peak requested (the overhead: 1.0 is perfect); gmlake = 1 - peak active / peak reserved, the
fragmentation figure of the GMLake paper (ASPLOS 2024): the share of the most memory ever
held beyond the most ever in use; dev.alloc = driver allocations (segments for the
segment heap, physical page chunks for the paged heap); map+unmap = cuMemMap/cuMemUnmap calls
(paged heap only); seconds = replay time on this machine. Recorded figures and how they are
reproduced: bench/results/2026-12-02-main-job.md, bench/README.md.
LEGEND
    echo
  else
    echo "### 2. (skipped: vramledger-replay not built or no traces in bench/traces/corpus/)"
  fi

  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
     "$build/bench/demo/vramledger-demo" --help >/dev/null &&
     grep -q VRAMLEDGER_HAVE_CUDA "$build/compile_commands.json"; then
    echo "### 3. Synthetic training loop on the GPU ($(nvidia-smi -L | head -1))"
    "$build/bench/demo/vramledger-demo" --backend vmm --conf "" || status=1
    "$build/bench/demo/vramledger-demo" --backend cuda_malloc --conf "paged_heap:false" || status=1
  else
    echo "### 3. (skipped: no GPU, or this build has no CUDA backends)"
  fi
  echo
  if ((status == 0)); then
    echo "main job: every consistency check passed. Every line and ratio: docs/stats.md."
  else
    echo "main job: a check FAILED (see above)."
  fi
  echo "This output is also in $log."
  exit $status
} 2>&1 | tee "$log"

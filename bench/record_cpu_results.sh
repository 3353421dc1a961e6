#!/usr/bin/env bash
# Runs the allocator latency benchmark and records it as bench/results/<date>-cpu-simulated.json
# (Google Benchmark's JSON) and .md (a table with the machine and the commit).
#
#   bench/record_cpu_results.sh [BUILD_DIR]     (default build-release; a release build)
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-"$repo_root/build-release"}
binary="$build/bench/vramledger-bench-latency"
[[ -x "$binary" ]] || { echo "no $binary: build a release tree with libbenchmark-dev first" >&2; exit 1; }

date=$(date -u +%Y-%m-%d)
out="$repo_root/bench/results/$date-cpu-simulated"
mkdir -p "$repo_root/bench/results"
# Three repetitions; the table reports the median, which shrugs off a noisy neighbour.
"$binary" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_min_time=0.3 --benchmark_out="$out.json" --benchmark_out_format=json >/dev/null

commit=$(git -C "$repo_root" rev-parse HEAD)
dirty=$(git -C "$repo_root" status --porcelain --untracked-files=no | grep -q . && echo " (plus uncommitted changes)" || true)
python3 - "$out.json" "$out.md" "$commit$dirty" <<'PY'
import json, subprocess, sys
src, dst, commit = sys.argv[1:4]
data = json.load(open(src))
model = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True,
        text=True).stdout.splitlines() if l.startswith("Model name")), "unknown")
nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
ctx = data["context"]
lines = [
    f"# Allocator latency on the simulated device ({ctx['date'][:10]})", "",
    f"- machine: {model}, {nproc} cores (nproc), load average at start {ctx.get('load_avg')}",
    f"- commit: {commit}",
    "- what: one allocate + deallocate pair through CachingAllocator on SimulatedDevice with the",
    "  Ledger attached (bench/allocator_latency.cpp); median of 3 repetitions.",
    "- threads share one allocator, each on its own stream; with 2 cores, 4 and 8 threads are",
    "  oversubscribed. For threaded rows, real time per pair is wall time divided by all",
    "  threads' pairs, i.e. 1 / throughput.", "",
    "| benchmark | real ns / pair | CPU ns / pair | pairs / s |", "|---|---:|---:|---:|",
]
for b in data["benchmarks"]:
    if b.get("aggregate_name") != "median":
        continue
    name = b["run_name"]
    lines.append(f"| {name} | {b['real_time']:.0f} | {b['cpu_time']:.0f} | "
                 f"{b.get('items_per_second', 0) / 1e6:.2f} M |")
open(dst, "w").write("\n".join(lines) + "\n")
PY
echo "wrote $out.json and $out.md"

#!/usr/bin/env bash
# A/B of bench/gpu_latency between this tree and another one (an older commit, unpacked beside
# it), in one device call: both binaries are built (release, CUDA), then run in alternation,
# new / old / new / old ..., so that the host's drift hits both. Each run writes Google
# Benchmark's JSON; a table of the cases' ns per pair (real time) and their counters per round
# goes to stdout and to $out/ab-table.md.
#
#   scripts/latency_ab.sh --old DIR [--filter REGEX] [--rounds 2] [--out DIR] [--torch]
#                         [-- BENCH ARGS]
#
# --torch: both binaries also get the torch-native peer (configured with torch found, as the GPU
# suite's build is), so that a case can be read against PyTorch's allocator in the same process;
# without it torch is left out of the build (-Dtorch_plugin=disabled) and no torch-native rows come.
#
# DIR: the other tree (e.g. `git archive OLD | tar -x -C old`, without bench/results). BENCH
# ARGS go to both binaries (e.g. --simulated on a machine without a GPU). Environment for the
# runs (VRAMLEDGER_BENCH_TRACE_CAPACITY, ...) passes through. Exit 1 when a build or run fails.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
old=""
filter='BM_PairThreads/.*-front/512B/own|BM_Mixed/vramledger-vmm(-front)?/|BM_Mixed/torch-native/'
rounds=2
out="${OUT:-$repo/ab-out}"
bench_args=()
torch_option=(-Dtorch_plugin=disabled)
while (($#)); do
  case "$1" in
    --old) old=$(cd "$2" && pwd); shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --torch) torch_option=(); shift ;;
    --) shift; bench_args=("$@"); break ;;
    *) echo "latency_ab: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n "$old" ]] || { echo "latency_ab: --old DIR is required" >&2; exit 2; }
mkdir -p "$out"
target=bench/gpu_latency/vramledger-bench-gpu-latency

build() {  # build <tree> <dir>
  local tree=$1 dir=$2
  if [[ ! -f "$tree/$dir/build.ninja" ]]; then
    (cd "$tree" && meson setup "$dir" -Dbuildtype=release -Dcuda=enabled -Dtests=false \
      "${torch_option[@]}") \
      >"$out/setup-$(basename "$tree").log" 2>&1 || return 1
  fi
  ninja -C "$tree/$dir" "$target" >"$out/build-$(basename "$tree").log" 2>&1
}

start=$SECONDS
build "$repo" build-ab & new_pid=$!
build "$old" build-ab & old_pid=$!
status=0
wait "$new_pid" || { echo "latency_ab: the new tree did not build ($out/build-*.log)"; status=1; }
wait "$old_pid" || { echo "latency_ab: the old tree did not build ($out/build-*.log)"; status=1; }
((status == 0)) || exit 1
echo "latency_ab: built both in $((SECONDS - start)) s"

for ((round = 1; round <= rounds; ++round)); do
  for side in new old; do
    tree=$repo
    [[ $side == old ]] && tree=$old
    json="$out/$side-$round.json"
    if ! "$tree/build-ab/$target" "${bench_args[@]}" --benchmark_filter="$filter" \
        --benchmark_out="$json" --benchmark_out_format=json >"$out/$side-$round.log" 2>&1; then
      echo "latency_ab: $side round $round failed ($out/$side-$round.log)"
      status=1
    fi
  done
done

python3 - "$out" "$rounds" <<'PY' | tee "$out/ab-table.md"
import json, os, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {}
for side in ("new", "old"):
    for r in range(1, rounds + 1):
        path = os.path.join(out, f"{side}-{r}.json")
        if not os.path.exists(path):
            continue
        for b in json.load(open(path))["benchmarks"]:
            if b.get("run_type") == "aggregate":
                continue
            name = b["name"].replace("/min_time:0.200", "").replace("/real_time", "")
            cell = f'{b["real_time"]:.1f}'
            extra = [f'{k.split("_per_")[0]} {b[k]:.2g}' for k in ("exact_per_kpair", "locked_per_kpair") if k in b]
            if extra:
                cell += " (" + ", ".join(extra) + ")"
            runs.setdefault(name, {})[f"{side}-{r}"] = cell
cols = [f"{side}-{r}" for r in range(1, rounds + 1) for side in ("new", "old")]
print("| case (ns per pair, real time; exact / locked per kpair) | " + " | ".join(cols) + " |")
print("|---|" + "---|" * len(cols))
for name, cells in runs.items():
    print(f"| {name} | " + " | ".join(cells.get(c, "") for c in cols) + " |")
PY
echo "latency_ab: done in $((SECONDS - start)) s"
exit "$status"

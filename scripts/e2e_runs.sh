#!/usr/bin/env bash
# Several end-to-end runs for issue 14's table, on a GPU machine with the package staged:
# RUNS invocations of bench/end_to_end/compare_allocators.py, one after the other (each runs
# every allocator of a workload back to back, so drift between runs hits all of them; even runs
# pass --native-last, so running first favours no allocator), then
# bench/end_to_end/multi_run_table.py over their JSON files.
#
#   scripts/e2e_runs.sh [--runs 3] [--allocators native,vramledger,native-again] [--workloads NAMES]
#                       [--steps 24] [--warmup 4] [--budget-s 540] [--out DIR] [--commit SHA]
#                       [--profile-steps N]   (GPU time of N extra steps under torch.profiler)
#                       [--together]   (each workload's allocators at once, in lock step:
#                                       compare_allocators.py --together; on one GPU, or, with
#                                       --gpus N >= the number of allocators, each on its own)
#                       [--hold ALLOCATOR]   (exit 1 when it misses the memory goals: ratio,
#                                             spread, three runs; multi_run_table.py --hold)
#                       [--gpus N]   (N > 1: the (run, workload) units spread over N GPUs at once,
#                                     bench/end_to_end/parallel_runs.py; each unit's allocators
#                                     still share one GPU and run back to back)
#
# --allocators: native-again (compare_allocators' A/A control, in the default) puts every other
# allocator between two natives, and the table judges steps against their mean; without it a
# process later in the series runs faster whatever its allocator (H200, 2026-12-02).
# --workloads: comma-separated (default: all seven). The budget is split evenly between the runs
# (each invocation gets budget/RUNS as its --time-limit-s; a workload that would not fit is
# recorded as not run, never cut short). Each (workload, allocator) run takes ~13–40 s on the
# H200 (generation ~35 s), so all seven workloads with the three default allocators need ~380 s per run.
# Writes DIR/runN/ (compare_allocators' outputs) and DIR/table.md; DIR defaults to $OUT/e2e-runs
# when $OUT is set (the device runner returns it), else build-e2e-runs.
# Needs PYTHONPATH to find the staged vramledger package (scripts/gpu_suite.sh --hooks 20 with
# VRAMLEDGER_TORCH_STAGE_ONLY=1 stages it into build-torch-gpu-stage, which is used by default).
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=3
allocators=native,vramledger,native-again
workloads=gpt2_train,llama_train,gpt2_generate,resnet50_train,vit_train,t5_train,two_stream_train
steps=24
warmup=4
budget=540
profile_steps=0
gpus=1
together=()
hold=()
out=""
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo "${VRAMLEDGER_GIT_COMMIT:-unknown}")
while (($#)); do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --allocators) allocators=$2; shift 2 ;;
    --workloads) workloads=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --budget-s) budget=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --profile-steps) profile_steps=$2; shift 2 ;;
    --gpus) gpus=$2; shift 2 ;;
    --together) together=(--together); shift ;;
    --hold) hold=(--hold "$2"); shift 2 ;;
    *) echo "e2e_runs: unknown argument $1" >&2; exit 2 ;;
  esac
done
for number in "$runs" "$steps" "$warmup" "$budget" "$gpus"; do
  [[ "$number" =~ ^[1-9][0-9]*$ ]] || { echo "e2e_runs: '$number' is not a whole number > 0" >&2; exit 2; }
done
[[ -n "$out" ]] || out=${OUT:+$OUT/e2e-runs}
[[ -n "$out" ]] || out=build-e2e-runs
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-$repo/build-torch-gpu-stage}
# --together with a GPU for each allocator: one workload at a time, each allocator on its own
# GPU, all in lock step (the decisive step-time run: drift shared, no GPU shared).
allocator_count=$(tr ',' '\n' <<<"$allocators" | grep -c .)
[[ ",$allocators," == *,native,* ]] || allocator_count=$((allocator_count + 1))  # native is added
gpu_per_allocator=()
if ((${#together[@]} && gpus >= allocator_count)); then
  gpu_per_allocator=(--gpus "$gpus")
elif ((gpus > 1)); then
  exec python3 "$repo/bench/end_to_end/parallel_runs.py" --gpus "$gpus" --runs "$runs" \
    --allocators "$allocators" --workloads "$workloads" --steps "$steps" --warmup "$warmup" \
    --budget-s "$budget" --out "$out" --commit "$commit" --profile-steps "$profile_steps" \
    "${together[@]}" "${hold[@]}"
fi
per_run=$((budget / runs))
jsons=()
for ((run = 1; run <= runs; run++)); do
  echo "=== e2e_runs: run $run of $runs (time limit ${per_run}s)"
  order=()
  ((run % 2 == 0)) && order=(--native-last)   # alternate who runs first
  python3 "$repo/bench/end_to_end/compare_allocators.py" --only "$allocators,$workloads" \
    --steps "$steps" --warmup "$warmup" --out "$out/run$run" --commit "$commit" \
    --time-limit-s "$per_run" --no-matplotlib --profile-steps "$profile_steps" "${order[@]}" \
    "${together[@]}" "${gpu_per_allocator[@]}" >"$out/run$run.log" 2>&1
  echo "    exit $?: $(grep '^SUMMARY' "$out/run$run.log" | tail -n 1)"
  [[ -f "$out/run$run/compare_allocators.json" ]] && jsons+=("$out/run$run/compare_allocators.json")
done
if ((${#jsons[@]} == 0)); then
  echo "e2e_runs: no run wrote a result (see $out/run*.log)" >&2
  exit 1
fi
python3 "$repo/bench/end_to_end/multi_run_table.py" "${jsons[@]}" --md "$out/table.md" "${hold[@]}"

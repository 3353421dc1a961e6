#!/usr/bin/env bash
# A fuzzing campaign (issue 16: >= 10^7 executions per target): runs every fuzz target at once on
# this machine's cores, each from its seed corpus (tests/fuzz/corpus/NAME), and ends with a table
# of executions, executions per second, coverage and failures per target.
#
# The C++ targets are the prebuilt libFuzzer binaries in BIN (scripts/build_fuzzers.sh builds them
# with clang, ASan and UBSan into fuzz-bin/; they run on a machine without clang). The Python
# importer targets (tests/fuzz/python/, atheris) run when named with --only, where atheris can be
# had: installed, or a wheel in BIN (atheris-*.whl, installed into the work folder without
# network). By default only the C++ targets run, so that they have every core.
#
# A target gets JOBS independent libFuzzer processes sharing one corpus folder (each reads what the
# others add), each with its share of --runs; a process stops at its share or at --time seconds.
# Cores are shared by weight (the allocation API target is ~20 times slower per execution than
# the readers); --jobs NAME=N,... overrides; a core freed early (a reader reached its share) runs
# one more allocation ops process for the time left. A failure stops only its process; its input
# is kept.
#
#   scripts/fuzz_campaign.sh [--bin fuzz-bin] [--out DIR] [--time 500] [--runs 10000000]
#                            [--cores $(nproc)] [--only NAME,...] [--jobs NAME=N,...]
# NAME: allocation_ops workload_trace config trace_file route_setting (C++), snapshot_importer
# rmm_importer (Python).
# Writes to --out (default $OUT, else fuzz-campaign/): summary.md (the table), NAME.log (each
# process's final statistics and last lines), artifacts/NAME/ (failing inputs), corpora.tar.gz
# (each target's corpus after the run, minimized with -merge=1: new seeds to keep).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=fuzz-bin
out=${OUT:-fuzz-campaign}
seconds=500
runs=10000000
cores=$(nproc)
only=""
jobs_override=""
while (($#)); do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --time) seconds=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --cores) cores=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --jobs) jobs_override=$2; shift 2 ;;
    *) echo "fuzz_campaign: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
bin=$(cd "$bin" 2>/dev/null && pwd) || { echo "fuzz_campaign: no folder '$bin' (scripts/build_fuzzers.sh)" >&2; exit 2; }
mkdir -p "$out" && out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/fuzz-campaign.XXXXXX")

# Relative cost per execution decides the share of cores (measured on the development VM, ASan +
# UBSan: allocation ops ~800 executions per CPU second, the readers 20,000-150,000, atheris ~2,000).
# On 16 cores: allocation ops 11 processes, workload trace 2, the other readers 1 each.
declare -A weight=([allocation_ops]=11 [workload_trace]=2 [config]=1 [trace_file]=1
                   [route_setting]=1 [snapshot_importer]=1 [rmm_importer]=1)
# Flags a target needs beyond the common ones (as in tests/fuzz/meson.build).
declare -A extra=([allocation_ops]="-max_len=256 -entropic=0")

declare -A kind=()
for exe in "$bin"/fuzz_*; do
  [[ -x "$exe" && -f "$exe" ]] && kind[$(basename "$exe" | sed 's/^fuzz_//')]=cpp
done
python=$(command -v python3 || true)
if [[ -n "$python" && "$only" == *_importer* ]]; then
  if ! "$python" -c 'import atheris' 2>/dev/null; then
    wheel=$(ls "$bin"/atheris-*.whl 2>/dev/null | head -1)
    if [[ -n "$wheel" ]]; then
      # pip if this Python has it; a wheel is a zip archive of the package otherwise.
      "$python" -m pip install --quiet --no-index --no-deps --target "$work/pylib" "$wheel" \
          >"$work/pip.log" 2>&1 ||
        "$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
          "$wheel" "$work/pylib" >>"$work/pip.log" 2>&1
      export PYTHONPATH="$work/pylib${PYTHONPATH:+:$PYTHONPATH}"
    fi
  fi
  if "$python" -c 'import atheris' 2>/dev/null; then
    kind[snapshot_importer]=py
    kind[rmm_importer]=py
  else
    echo "fuzz_campaign: atheris not available (no wheel in $bin, or it does not install): the Python targets are skipped" >&2
  fi
fi
names=()
for name in allocation_ops workload_trace config trace_file route_setting snapshot_importer rmm_importer; do
  [[ -n "${kind[$name]:-}" ]] || continue
  [[ -z "$only" || ",$only," == *",$name,"* ]] && names+=("$name")
done
((${#names[@]})) || { echo "fuzz_campaign: no target to run in $bin" >&2; exit 2; }

# Jobs per target: by weight over the cores, at least one each; --jobs overrides.
total_weight=0
for name in "${names[@]}"; do total_weight=$((total_weight + ${weight[$name]:-1})); done
declare -A jobs=()
for name in "${names[@]}"; do
  n=$(( (${weight[$name]:-1} * cores + total_weight / 2) / total_weight ))
  jobs[$name]=$((n < 1 ? 1 : n))
done
IFS=',' read -ra pairs <<<"$jobs_override"
for pair in "${pairs[@]}"; do [[ "$pair" == *=* ]] && jobs[${pair%%=*}]=${pair#*=}; done

echo "fuzz_campaign: ${#names[@]} target(s) on $cores core(s) for up to $seconds s, $runs executions each; work folder $work"
# ASan of clang 14 can fail at start on kernels with 32 bits of mmap randomness (Ubuntu 24.04's
# default): the C++ targets run with address space randomization off (setarch -R, unprivileged).
no_aslr=()
setarch "$(uname -m)" -R true 2>/dev/null && no_aslr=(setarch "$(uname -m)" -R)
# Each binary must start here (a missing library, a sanitizer that cannot map its shadow): say so
# at once rather than after the run.
for name in "${names[@]}"; do
  [[ ${kind[$name]} == cpp ]] || continue
  if ! timeout 60 "${no_aslr[@]}" "$bin/fuzz_$name" -runs=0 >"$work/preflight-$name.log" 2>&1; then
    echo "fuzz_campaign: $bin/fuzz_$name does not start here:" >&2
    tail -n 20 "$work/preflight-$name.log" >&2
    exit 3
  fi
done
start=$(date +%s)
deadline=$((start + seconds))
declare -A started=() share=() target_of=()
# Starts process number started[NAME] of a target, for `limit` seconds.
launch() {
  local name=$1 limit=$2 k=${started[$1]:-0}
  local command
  if [[ ${kind[$name]} == cpp ]]; then
    command=("${no_aslr[@]}" "$bin/fuzz_$name" -rss_limit_mb=2048 -malloc_limit_mb=32 -timeout=60)
  else
    command=("$python" "$root/tests/fuzz/python/fuzz_$name.py" -rss_limit_mb=4096 -timeout=60)
  fi
  # shellcheck disable=SC2206
  command+=(${extra[$name]:-} -runs="${share[$name]}" -max_total_time="$limit" -print_final_stats=1
            -artifact_prefix="$out/artifacts/$name/" "$work/$name/corpus" "$root/tests/fuzz/corpus/$name")
  ( cd "$work/$name" && timeout $((limit + 120)) "${command[@]}" >"job-$k.log" 2>&1
    echo $? >"job-$k.rc"; date +%s >"job-$k.end" ) &
  target_of[$!]=$name
  started[$name]=$((k + 1))
}
for name in "${names[@]}"; do
  mkdir -p "$work/$name/corpus" "$out/artifacts/$name"
  share[$name]=$(( (runs + jobs[$name] - 1) / jobs[$name] ))
  for ((k = 0; k < jobs[$name]; k++)); do launch "$name" "$seconds"; done
done
# A core freed early (a fast reader reached its share) goes to the slowest target, allocation
# ops, for the time that is left: more of its executions in the same wall time.
backfill=""
[[ -n "${kind[allocation_ops]:-}" && " ${names[*]} " == *" allocation_ops "* ]] && backfill=allocation_ops
while ((${#target_of[@]})); do
  finished=""
  wait -n -p finished "${!target_of[@]}" || true
  [[ -n "$finished" ]] || break
  name=${target_of[$finished]}
  unset "target_of[$finished]"
  left=$((deadline - $(date +%s)))
  if [[ -n "$backfill" && "$name" != "$backfill" ]] && ((left > 60)); then
    launch "$backfill" "$left"
  fi
done
wait

# Minimized corpora (new seeds worth keeping): all targets at once, 45 s at most.
for name in "${names[@]}"; do
  mkdir -p "$work/corpora/$name"
  if [[ ${kind[$name]} == cpp ]]; then
    merge=("${no_aslr[@]}" "$bin/fuzz_$name" ${extra[$name]:-})
  else
    merge=("$python" "$root/tests/fuzz/python/fuzz_$name.py")
  fi
  (cd "$work/$name" && timeout 45 "${merge[@]}" -merge=1 -rss_limit_mb=4096 -timeout=60 \
      "$work/corpora/$name" "$work/$name/corpus" >merge.log 2>&1) &
done
wait
tar -C "$work/corpora" -czf "$out/corpora.tar.gz" .

# The table: executions from each process's final statistics (its last progress line if it died
# before printing them), failures = processes that did not exit 0 (libFuzzer saved their input).
summary="$out/summary.md"
{
  echo "# Fuzzing campaign $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname): $cores cores, $(nproc) online"
  echo
  echo "binaries: $bin (commit $(cat "$bin/COMMIT" 2>/dev/null || echo unknown)); --time $seconds --runs $runs"
  echo
  echo "| target | processes | executions | wall s | exec/s | edges (max of jobs) | failures | >= $runs |"
  echo "|---|---|---|---|---|---|---|---|"
} >"$summary"
status=0
for name in "${names[@]}"; do
  executions=0 edges=0 failures=0 end=$start
  : >"$out/$name.log"
  for ((k = 0; k < started[$name]; k++)); do
    log="$work/$name/job-$k.log"
    n=$(grep -a '^stat::number_of_executed_units:' "$log" | awk '{print $2}' | tail -1)
    [[ -n "$n" ]] || n=$(grep -aoE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    executions=$((executions + ${n:-0}))
    e=$(grep -aoE 'cov: [0-9]+' "$log" | awk '{print $2}' | sort -n | tail -1)
    ((${e:-0} > edges)) && edges=${e:-0}
    rc=$(cat "$work/$name/job-$k.rc" 2>/dev/null || echo 1)
    ((rc != 0)) && failures=$((failures + 1))
    t=$(cat "$work/$name/job-$k.end" 2>/dev/null || date +%s)
    ((t > end)) && end=$t
    { echo "== $name job $k: exit $rc"; grep -a '^stat::' "$log"; tail -n 25 "$log"; } >>"$out/$name.log"
  done
  wall=$((end - start)); ((wall > 0)) || wall=1
  reached=no; ((executions >= runs)) && reached=yes
  ((failures)) && status=1
  echo "| $name | ${started[$name]} | $executions | $wall | $((executions / wall)) | $edges | $failures | $reached |" >>"$summary"
done
echo >>"$summary"
echo "failing inputs: $(find "$out/artifacts" -type f | wc -l) file(s) under artifacts/; minimized corpora: corpora.tar.gz" >>"$summary"
rm -rf "$work"
cat "$summary"
exit $status

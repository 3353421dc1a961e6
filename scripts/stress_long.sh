#!/usr/bin/env bash
# The randomized stress test (tests/stress/randomized_stress_test.cpp) at its full length:
# 1,000,000 steps per heap shape, every step checked against the reference model, the ledger/census
# consistency check and the simulated device's own view. scripts/run_tests.sh runs it shorter
# (200,000 steps; 50,000 under the sanitizers) to stay within ~10 minutes; this is the long run,
# about 3 minutes on an idle 2-core machine (6 under load: bench/results/2026-12-01-stress-long.md).
#
#   scripts/stress_long.sh [STEPS]
#
# Builds build-stress/ (release, no CUDA) when it is not there, runs the test, and writes the
# outcome to bench/results/<date>-stress-long.md (commit, machine, steps, time, result), which is
# committed as the record of the last long run. Exits non-zero when the test fails.
set -uo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
if [[ -x .venv/bin/meson ]]; then export PATH="$repo_root/.venv/bin:$PATH"; fi
steps=${1:-1000000}
build=build-stress

if [[ ! -f "$build/build.ninja" ]]; then
  meson setup "$build" --buildtype=release --werror -Dcuda=disabled -Dbenchmarks=disabled \
    -Dtorch_plugin=disabled >/dev/null || exit 1
fi
meson compile -C "$build" -j "$(nproc)" test_randomized_stress || exit 1

start=$(date +%s)
VRAMLEDGER_STRESS_OPS=$steps meson test -C "$build" --no-rebuild --print-errorlogs randomized_stress
status=$?
seconds=$(( $(date +%s) - start ))
result=$([[ $status -eq 0 ]] && echo passed || echo FAILED)

record="bench/results/$(date -u +%Y-%m-%d)-stress-long.md"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no -- allocator accounting tests/stress 2>/dev/null | wc -l)
{
  echo "# Randomized stress test, full length — $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo "Command: \`scripts/stress_long.sh $steps\` (\`VRAMLEDGER_STRESS_OPS=$steps meson test -C $build randomized_stress\`, release build)."
  echo "Commit $commit$([[ $dirty -gt 0 ]] && echo " with $dirty uncommitted change(s) under allocator/, accounting/ or tests/stress/")."
  echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')."
  echo
  echo "Result: **$result**: $steps steps per heap shape (segment heap, paged heap, paged heap with"
  echo "alias_pending_pages), each step checked against the reference model, the ledger/census check and"
  echo "the simulated device, in $seconds s."
  echo
  echo "\`\`\`"
  grep -E '^\[ *(RUN|OK|FAILED|PASSED) *\]|^\[==========\]' "$build/meson-logs/testlog.txt" | tail -12
  echo "\`\`\`"
} >"$record"
echo "stress_long: $result in $seconds s; recorded in $record"
exit $status

#!/usr/bin/env bash
# CI's fuzzing smoke run (issue 16): builds the five C++ libFuzzer targets with clang, ASan and
# UBSan (scripts/build_fuzzers.sh; clang and its fuzzer runtime are installed from Debian when
# missing) and fuzzes each for SECONDS (default 20) from its kept corpus (tests/fuzz/corpus/NAME),
# one process per target (scripts/fuzz_campaign.sh). Exits non-zero when a target failed; its
# input is kept under build-fuzz-smoke/campaign/artifacts/. The long campaigns (>= 10^7
# executions per target) are recorded in bench/results/ (docs/reliability.md, Fuzzing).
#
#   scripts/fuzz_smoke.sh [SECONDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-20}
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz_smoke: '$seconds' is not a number of seconds" >&2; exit 2; }
fuzzer_runtime() { compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null; }
if ! command -v clang++ >/dev/null 2>&1 || ! fuzzer_runtime; then
  sudo_cmd=()
  ((EUID == 0)) || sudo_cmd=(sudo)
  echo "fuzz_smoke: installing clang and libclang-rt-dev (apt: libFuzzer, ASan, UBSan runtimes)"
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null
fi
bash scripts/build_fuzzers.sh build-fuzz-smoke build-fuzz-smoke/bin
rm -rf build-fuzz-smoke/campaign
bash scripts/fuzz_campaign.sh --bin build-fuzz-smoke/bin --out build-fuzz-smoke/campaign \
  --time "$seconds" --cores "$(nproc)" \
  --jobs allocation_ops=1,workload_trace=1,config=1,trace_file=1,route_setting=1

#!/usr/bin/env bash
# Builds the C++ fuzz targets (tests/fuzz/) with clang's libFuzzer, ASan and UBSan into BIN (default
# fuzz-bin/, git-ignored) so that scripts/fuzz_campaign.sh can run them on another machine: the
# H200 host has no clang, but these binaries run there (glibc 2.36 here, 2.39 there; the libFuzzer
# and sanitizer runtimes are linked statically, and so are libstdc++, libgcc and zlib, so `ldd`
# must show only glibc's libraries). Debug information is stripped from the copies (a crash there
# is symbolized here against BUILD's unstripped binaries: addr2line -e BUILD/tests/fuzz/fuzz_X).
# For a campaign whose figures name a commit, build from a clean export of it:
#   git archive HEAD | tar -x -C /tmp/src && cd /tmp/src && FUZZ_COMMIT=$(git -C /work/main rev-parse
#   --short HEAD) scripts/build_fuzzers.sh build-fuzz /work/main/fuzz-bin
# With DOWNLOAD_ATHERIS=1 the atheris wheel for the device's CPython 3.12 is put next to them, for
# the Python importer targets (the device has no network).
#
#   scripts/build_fuzzers.sh [BUILD (default build-fuzz)] [BIN (default fuzz-bin)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-fuzz}
bin=${2:-fuzz-bin}
targets=(fuzz_config fuzz_workload_trace fuzz_trace_file fuzz_route_setting fuzz_allocation_ops)

if [[ -f .venv/bin/activate ]]; then source .venv/bin/activate; fi
options=(-Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled
         -Dprefer_static=true "-Dcpp_link_args=-static-libstdc++ -static-libgcc")
if [[ -d "$build" ]]; then
  meson configure --clearcache "$build" "${options[@]}" >/dev/null  # drop found dependencies: static now
else
  CC=clang CXX=clang++ meson setup "$build" "${options[@]}" >/dev/null
fi
grep -q "clang" "$build/meson-logs/meson-log.txt" || { echo "$build is not a clang build" >&2; exit 1; }
ninja -C "$build" "${targets[@]/#/tests/fuzz/}"

mkdir -p "$bin"
for target in "${targets[@]}"; do
  cp "$build/tests/fuzz/$target" "$bin/$target"
  strip --strip-debug "$bin/$target"
  # Only glibc's libraries may be loaded from the machine that runs them.
  extra=$(ldd "$bin/$target" | awk '{print $1}' |
          grep -vE '^(linux-vdso\.so\.1|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|/lib64/ld-linux-x86-64\.so\.2)$' || true)
  if [[ -n "$extra" ]]; then
    echo "$target needs libraries the device may not have: $extra" >&2
    exit 1
  fi
done
# Which sources: the commit, "-dirty" when tracked files differ from it (in a shared tree, other
# people's uncommitted changes are compiled in), or $FUZZ_COMMIT outside a git checkout.
if commit=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD 2>/dev/null || commit+="-dirty"
else
  commit=${FUZZ_COMMIT:-unknown}
fi
echo "$commit" > "$bin/COMMIT"
if [[ "${DOWNLOAD_ATHERIS:-0}" == 1 ]]; then
  python -m pip download atheris --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 -d "$bin"
fi
du -sh "$bin"
ls -la "$bin"

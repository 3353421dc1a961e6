#!/usr/bin/env bash
# Fetches RAPIDS RMM (librmm's C++ headers and library, and the rapids-logger it needs) into
# .deps/rmm/ for the RMM peers of the GPU latency benchmark (rows rmm-pool and rmm-arena of
# bench/gpu_latency, issue 15). They are fetched here, as the wheels on PyPI, because the GPU
# machine cannot reach PyPI: .deps/ is git-ignored and carried to it with the working tree
# (about 28 MB), where meson finds .deps/rmm by itself (option rmm_root; bench/README.md).
#
#   scripts/fetch_rmm.sh [--force]
#
# Layout written (replaced as a whole, never half-written):
#   .deps/rmm/include/  rmm/, nvtx3/, RMM's own CCCL (cuda/, cub/, thrust/, nv/; it must come
#                       before any other CCCL on the include path) and rapids_logger/
#   .deps/rmm/lib/      librmm.so and librapids_logger.so side by side (librmm's RUNPATH is
#                       $ORIGIN: it finds the logger there); librmm carries its own static CUDA
#                       runtime and needs no libcudart
#   .deps/rmm/licenses/ the wheels' licence files
#   .deps/rmm/VERSION   the two wheels' file names
# Nothing is done when VERSION already names the wanted wheels (--force fetches again).
# LIBRMM_VERSION, RAPIDS_LOGGER_VERSION and RMM_CUDA (cu13) choose other wheels.
set -euo pipefail
cd "$(dirname "$0")/.."

librmm_version=${LIBRMM_VERSION:-26.10.0}
logger_version=${RAPIDS_LOGGER_VERSION:-0.3.0}
rmm_cuda=${RMM_CUDA:-cu13}
dest=.deps/rmm
force=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    *) echo "fetch_rmm: unknown argument $arg (usage: scripts/fetch_rmm.sh [--force])" >&2; exit 2 ;;
  esac
done

if [[ -x .venv/bin/pip ]]; then
  pip=(.venv/bin/pip)
  python=.venv/bin/python
else
  pip=(python3 -m pip)
  python=python3
fi

# Wheel file names start with the distribution name, '-' turned into '_'.
want_rmm="librmm_${rmm_cuda}-${librmm_version}-"
want_logger="rapids_logger-${logger_version}-"
if (( !force )) && [[ -f $dest/VERSION && -f $dest/lib/librmm.so && -f $dest/lib/librapids_logger.so &&
      -f $dest/include/rmm/mr/pool_memory_resource.hpp ]] &&
   grep -q "^$want_rmm" "$dest/VERSION" && grep -q "^$want_logger" "$dest/VERSION"; then
  echo "fetch_rmm: $dest is up to date:"
  sed 's/^/  /' "$dest/VERSION"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "fetch_rmm: downloading librmm-${rmm_cuda}==${librmm_version} and rapids-logger==${logger_version} with ${pip[*]}"
# The wheels are py3-none manylinux_2_28 (glibc >= 2.28): any CPython picks the same ones.
"${pip[@]}" download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --dest "$tmp/wheels" \
  "librmm-${rmm_cuda}==${librmm_version}" "rapids-logger==${logger_version}"

rmm_wheel=$(cd "$tmp/wheels" && ls librmm_*.whl)
logger_wheel=$(cd "$tmp/wheels" && ls rapids_logger-*.whl)
mkdir -p "$tmp/x"
"$python" -m zipfile -e "$tmp/wheels/$rmm_wheel" "$tmp/x"
"$python" -m zipfile -e "$tmp/wheels/$logger_wheel" "$tmp/x"

x=$tmp/x
for needed in librmm/include/rmm/mr/pool_memory_resource.hpp librmm/include/rmm/mr/arena_memory_resource.hpp \
              librmm/include/rapids/cuda librmm/include/nvtx3 librmm/lib64/librmm.so \
              rapids_logger/include/rapids_logger rapids_logger/lib64/librapids_logger.so; do
  [[ -e $x/$needed ]] || { echo "fetch_rmm: $needed missing from the wheels: layout changed?" >&2; exit 1; }
done

new=$dest.new
rm -rf "$new"
mkdir -p "$new/include" "$new/lib" "$new/licenses"
cp -a "$x/librmm/include/rmm" "$x/librmm/include/nvtx3" "$new/include/"
cp -a "$x/librmm/include/rapids/." "$new/include/"  # CCCL: cuda/ cub/ thrust/ nv/
cp -a "$x/rapids_logger/include/." "$new/include/"
cp -a "$x/librmm/lib64/librmm.so" "$x/rapids_logger/lib64/librapids_logger.so" "$new/lib/"
for info in "$x"/*.dist-info; do
  name=$(basename "$info" .dist-info)
  for licence in "$info"/licenses/* "$info"/LICENSE*; do
    [[ -f $licence ]] && cp "$licence" "$new/licenses/$name-$(basename "$licence")"
  done
done
printf '%s\n%s\n' "$rmm_wheel" "$logger_wheel" >"$new/VERSION"
rm -rf "$dest"
mv "$new" "$dest"

echo "fetch_rmm: wrote $dest ($(du -sh "$dest" | cut -f1)):"
echo "  include/  $(ls "$dest/include" | tr '\n' ' ')"
echo "  lib/      $(ls "$dest/lib" | tr '\n' ' ')"
sed 's/^/  VERSION   /' "$dest/VERSION"
git check-ignore -q "$dest" || echo "fetch_rmm: WARNING: $dest is not git-ignored (add /.deps/ to .gitignore)" >&2
echo "fetch_rmm: reconfigure meson (meson setup --reconfigure BUILD) so the latency bench picks it up"

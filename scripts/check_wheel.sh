#!/usr/bin/env bash
# Builds the vramledger wheel as a PyTorch user's `pip install .` does, installs it into a fresh
# virtual environment, and checks what a user relies on first:
#   - `vramledger where` finds all three libraries (the plugin, the LD_PRELOAD shim, the routing
#     library) and exits 0;
#   - `import vramledger` works (without a GPU, and without torch in that environment);
#   - `vramledger run` puts the shim first in LD_PRELOAD by default (non-torch memory is tracked).
#
#   scripts/check_wheel.sh [PYTHON] [--no-build-isolation]
#
# PYTHON (default .venv/bin/python, where scripts/setup.sh put torch) is the interpreter whose
# torch the wheel is built against, with pip's build isolation on (build requirements come from
# PyPI) unless --no-build-isolation is given (then PYTHON needs meson-python, meson and ninja,
# as on a machine without network access). The wheel lands in build-wheel/dist/ (meson's folder:
# build-wheel/build/, log: build-wheel/build.log); the fresh environment is build-wheel/venv/.
# Used by CI (.ci/run).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
python=.venv/bin/python
isolation=()
for arg in "$@"; do
  case $arg in
    --no-build-isolation) isolation=(--no-build-isolation) ;;
    *) python=$arg ;;
  esac
done
out=build-wheel
rm -rf "$out/dist" "$out/venv"  # build-wheel/build, meson's folder, is kept: rebuilds are incremental
mkdir -p "$out"
start=$(date +%s)

fail() { echo "check_wheel: FAILED: $*" >&2; exit 1; }

echo "check_wheel: building the wheel against the torch of $python (pip wheel${isolation[*]:+ ${isolation[*]}} .)"
# --no-deps: the wheel depends on torch, which is already installed (without its CUDA
# dependencies on a CPU machine); the compile uses every core.
"$python" -m pip wheel --disable-pip-version-check --no-deps "${isolation[@]}" \
  -Cbuild-dir="$out/build" -Ccompile-args=-j"$(nproc)" -w "$out/dist" . >"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; fail "the wheel did not build (log: $out/build.log)"; }
wheel=$(ls "$out"/dist/vramledger-*.whl)
echo "check_wheel: built $wheel in $(( $(date +%s) - start )) s; it carries:"
# The listing once, into a variable: `grep -q` on a pipe would close it early, and under
# pipefail the writer's broken pipe would read as "not found".
listing=$("$python" -m zipfile -l "$wheel")
grep -E '\.so|_bootstrap' <<<"$listing" | awk '{print "  " $1}'
for lib in libvramledger_torch.so libvramledger_preload.so libvramledger_route.so; do
  grep -q "vramledger/$lib" <<<"$listing" || fail "the wheel lacks vramledger/$lib"
done

echo "check_wheel: installing it into a fresh environment ($out/venv)"
python3 -m venv "$out/venv"
"$out/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$wheel"
venv_bin=$(cd "$out/venv/bin" && pwd)

echo "check_wheel: vramledger where"
"$venv_bin/vramledger" where || fail "vramledger where did not find every part"
echo "check_wheel: import vramledger"
(cd / && "$venv_bin/python" -c "import vramledger; print('vramledger', vramledger.__version__, 'from', vramledger.__file__)") ||
  fail "import vramledger"
echo "check_wheel: vramledger run puts the shim in LD_PRELOAD by default"
(cd / && "$venv_bin/vramledger" run -- "$venv_bin/python" -c \
  "import os; p = os.environ.get('LD_PRELOAD', ''); print('LD_PRELOAD=' + p); assert 'libvramledger_preload.so' in p") ||
  fail "vramledger run did not preload the shim"
echo "check_wheel: passed in $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# Installs what building and testing vramledger needs on a Debian 12 (or Ubuntu) machine, and says
# what it installs and why as it goes. Idempotent: what is present is not installed again, and apt
# is not touched at all when nothing is missing (so it also works on machines without network
# access, such as the GPU box, as long as the tools are already there).
#
#   1. Debian packages (apt): the compiler and build tools, GoogleTest, and optional libraries
#      (Google Benchmark, CLI11, zlib, nlohmann-json, headless Chromium, pytest).
#   2. .venv/ inside the checkout (PyPI): Meson, pinned, so the build never depends on whichever
#      meson a machine carries; pytest for the Python test suites (meson finds .venv's python3
#      first). scripts/run_tests.sh and scripts/main_job.sh put .venv/bin first on PATH.
#   3. Only where a CUDA toolkit is installed (nvcc): torch 2.11.0 into .venv/ (a ~530 MB
#      download, without its dependencies), so the PyTorch plugin (torch_plugin/) is compiled
#      against it and its self-tests run. VRAMLEDGER_SETUP_TORCH=0 skips it (the plugin is then
#      not built). The CUDA toolkit itself is never installed here.
set -euo pipefail

MESON_VERSION=1.6.1
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Debian package names. Required: without them nothing builds. Optional: the benchmarks
# (libbenchmark-dev), vramledger-replay's command line (libcli11-dev) and gzip'd traces
# (zlib1g-dev), and python3-venv for the pinned Meson below (without it a meson already on PATH
# is used); Meson skips what the libraries enable when they are missing. The CUDA toolkit is
# optional (-Dcuda=auto) and never installed here.
required_packages=(g++ ninja-build pkg-config libgtest-dev libgmock-dev python3)
optional_packages=(python3-venv python3-pytest libbenchmark-dev libcli11-dev zlib1g-dev nlohmann-json3-dev chromium-headless-shell)

missing_from() {
  local pkg
  for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
      echo "$pkg"
    fi
  done
}
mapfile -t missing_required < <(missing_from "${required_packages[@]}")
mapfile -t missing_optional < <(missing_from "${optional_packages[@]}")

if ((${#missing_required[@]} + ${#missing_optional[@]})); then
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  apt_install() { "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
  "${sudo_cmd[@]}" apt-get update -qq || echo "setup: WARNING: apt-get update failed" >&2
  if ((${#missing_required[@]})); then
    echo "setup: installing ${missing_required[*]} (apt; required: compiler, ninja, GoogleTest)"
    # Offline machines (the GPU box) often have the tools from elsewhere (pip's ninja, a
    # /usr/include/gtest): go on, and let the build say what is really missing.
    apt_install "${missing_required[@]}" ||
      echo "setup: WARNING: could not install ${missing_required[*]}; the build may fail" >&2
  fi
  if ((${#missing_optional[@]})); then
    echo "setup: installing ${missing_optional[*]} (apt; optional: benchmarks, vramledger-replay's" \
         "command line, gzip'd traces, JSON, the HTML report check, pytest)"
    apt_install "${missing_optional[@]}" ||
      echo "setup: WARNING: could not install ${missing_optional[*]}; what they enable is skipped" >&2
  fi
else
  echo "setup: system packages present"
fi

# Meson, pinned, in a private virtual environment.
venv="$repo_root/.venv"
have_version=""
if [[ -x "$venv/bin/meson" ]]; then
  have_version=$("$venv/bin/meson" --version 2>/dev/null || true)
fi
install_meson() {
  [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv" || return 1
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "meson==$MESON_VERSION"
}
if [[ "$have_version" == "$MESON_VERSION" ]]; then
  echo "setup: meson $MESON_VERSION present in $venv"
else
  echo "setup: installing meson==$MESON_VERSION into $venv (PyPI; the build system, pinned)"
  if ! install_meson; then
    # Offline machines (the GPU box) may still carry a usable meson of their own.
    rm -rf "$venv"
    if command -v meson >/dev/null 2>&1; then
      echo "setup: WARNING: could not install meson==$MESON_VERSION; using $(command -v meson) ($(meson --version))" >&2
    else
      echo "setup: ERROR: meson could not be installed and none is on PATH" >&2
      exit 1
    fi
  fi
fi

# pytest in .venv: the build finds .venv's python3 first, and the Python suites
# (end_to_end_harness, torch_launcher_py) run under it; without pytest they are reported skipped.
if [[ -x "$venv/bin/python" ]]; then
  if "$venv/bin/python" -c "import pytest" 2>/dev/null; then
    echo "setup: pytest present in $venv"
  else
    echo "setup: installing pytest into $venv (PyPI; runs the Python test suites)"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check pytest ||
      echo "setup: WARNING: could not install pytest; the Python suites are reported skipped" >&2
  fi
fi

# PyTorch, pinned to the GPU machine's 2.11.0 (torch's CUDAAllocator vtable changes with every
# minor release), without its dependencies: the plugin build needs only torch's headers and
# libraries, and its self-test runs on the simulated device. Only where the CUDA toolkit is, since
# the plugin sits on the CUDA backends.
TORCH_VERSION=2.11.0
if [[ "${VRAMLEDGER_SETUP_TORCH:-1}" == 0 ]]; then
  echo "setup: VRAMLEDGER_SETUP_TORCH=0: torch not installed (the PyTorch plugin is not built)"
elif ! command -v nvcc >/dev/null 2>&1 && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "setup: no CUDA toolkit (nvcc): torch not installed (the PyTorch plugin needs CUDA to build)"
elif [[ -x "$venv/bin/python" ]]; then
  if "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('torch') != '$TORCH_VERSION')" 2>/dev/null; then
    echo "setup: torch==$TORCH_VERSION present in $venv"
  else
    echo "setup: installing torch==$TORCH_VERSION into $venv (PyPI, ~530 MB, without its" \
         "dependencies): nvcc is here, so the PyTorch plugin is built and self-tested against it" \
         "(VRAMLEDGER_SETUP_TORCH=0 skips this)"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "torch==$TORCH_VERSION" ||
      echo "setup: WARNING: could not install torch==$TORCH_VERSION; the torch plugin is not built" >&2
  fi
fi

# What `import torch` needs beyond torch itself, for the CPU tests that run torch.distributed
# (tests/board/test_cluster.py: the cluster report over gloo): torch's pure-Python dependencies
# and the three CUDA libraries libtorch_cuda links that the CUDA toolkit lacks (cuFile,
# cuSPARSELt, NVSHMEM; ~230 MB, pinned to torch 2.11.0's own requirements; torch finds them in
# site-packages itself). Without them those tests report themselves skipped.
torch_runtime=(typing_extensions filelock sympy networkx jinja2 fsspec nvidia-cufile==1.15.1.6
               nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5)
if [[ "${VRAMLEDGER_SETUP_TORCH:-1}" != 0 && -x "$venv/bin/python" ]] &&
   "$venv/bin/python" -c "import importlib.metadata as m; m.version('torch')" 2>/dev/null; then
  if "$venv/bin/python" -c "import importlib.metadata as m
for name in ('typing_extensions', 'sympy', 'networkx', 'jinja2', 'fsspec', 'filelock',
             'nvidia-cufile', 'nvidia-cusparselt-cu13', 'nvidia-nvshmem-cu13'):
    m.version(name)" 2>/dev/null; then
    echo "setup: torch's runtime dependencies present in $venv"
  else
    echo "setup: installing torch's runtime dependencies into $venv (PyPI, ~230 MB: pure-Python" \
         "packages, cuFile, cuSPARSELt, NVSHMEM) so the CPU tests can import torch.distributed"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${torch_runtime[@]}" ||
      echo "setup: WARNING: could not install torch's runtime dependencies; the cluster report" \
           "test over gloo is reported skipped" >&2
  fi
fi

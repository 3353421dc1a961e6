#!/usr/bin/env bash
# Installs what building and testing vramledger needs on a Debian 12 (or Ubuntu) machine.
# Idempotent: packages already present are not reinstalled, and apt is not touched at all when
# nothing is missing (so it also works on machines without network access, such as the GPU box,
# as long as the tools are already there).
#
# Meson is pinned and installed from PyPI into .venv/ inside the checkout, so the build never
# depends on whichever meson a machine happens to carry; scripts/run_tests.sh and
# scripts/main_job.sh put .venv/bin first on PATH.
set -euo pipefail

MESON_VERSION=1.6.1
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Debian package names. python3-venv gives the system python its venv module; the CUDA toolkit
# is optional (meson is configured with -Dcuda=auto) and never installed here.
apt_packages=(
  g++ ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-venv
)

missing=()
for pkg in "${apt_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: system packages present"
fi

# Meson, pinned, in a private virtual environment.
venv="$repo_root/.venv"
have_version=""
if [[ -x "$venv/bin/meson" ]]; then
  have_version=$("$venv/bin/meson" --version 2>/dev/null || true)
fi
if [[ "$have_version" != "$MESON_VERSION" ]]; then
  echo "setup: installing meson==$MESON_VERSION into $venv"
  if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
  fi
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "meson==$MESON_VERSION"; then
    # Offline machines (the GPU box) may still carry a usable meson of their own.
    if command -v meson >/dev/null 2>&1; then
      echo "setup: WARNING: could not install meson==$MESON_VERSION; using $(command -v meson) ($(meson --version))" >&2
    else
      echo "setup: ERROR: meson could not be installed and none is on PATH" >&2
      exit 1
    fi
  fi
else
  echo "setup: meson $MESON_VERSION present in $venv"
fi

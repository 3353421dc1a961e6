#!/usr/bin/env python3
"""Prints what Meson needs to build against the installed torch, one `key=value` a line.

Importing torch is tried first (the authoritative answers), but the build must also work where
torch's own CUDA libraries are missing (a CI machine without a GPU has the wheel but maybe not its
nvidia-* dependencies), so every answer has a fallback that only reads files:

  version   torch/version.py
  cxx11_abi whether libc10.so's symbols use the new std::string (std::__cxx11)

Exit status 1 (and nothing printed) when torch is not installed at all.
"""
import importlib.util
import os
import re
import sys


def _version_from_file(root):
    text = open(os.path.join(root, "version.py"), encoding="utf-8").read()
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return match.group(1) if match else "0"


def _abi_from_library(lib_dir):
    # A library built with the new ABI mangles std::string as std::__cxx11::basic_string.
    path = os.path.join(lib_dir, "libc10.so")
    with open(path, "rb") as handle:
        return 1 if b"St7__cxx1112basic_string" in handle.read() else 0


def main():
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return 1
    root = list(spec.submodule_search_locations)[0]
    lib_dir = os.path.join(root, "lib")
    info = {
        "root": root,
        "include": os.path.join(root, "include"),
        "include_api": os.path.join(root, "include", "torch", "csrc", "api", "include"),
        "lib": lib_dir,
    }
    try:
        import torch  # noqa: F401  (may fail where torch's CUDA libraries are absent)

        info["version"] = torch.__version__
        info["cxx11_abi"] = "1" if torch.compiled_with_cxx11_abi() else "0"
        info["cuda"] = torch.version.cuda or ""
        info["importable"] = "1"
    except Exception:  # noqa: BLE001  fall back to reading files
        info["version"] = _version_from_file(root)
        info["cxx11_abi"] = str(_abi_from_library(lib_dir))
        info["cuda"] = ""
        info["importable"] = "0"
    for key, value in info.items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Lays out an importable `vramledger` package from the source tree and a meson build folder:

    python3 tests/torch/stage_package.py BUILD_DIR STAGE_DIR
    PYTHONPATH=STAGE_DIR python3 -c "import vramledger"

(The package's Python files, plus libvramledger_torch.so and, when built, the _C*.so extension
from BUILD_DIR/torch_plugin; _C finds the library next to it through its $ORIGIN run path.) `pip install
--no-build-isolation .` gives the same layout in site-packages.
"""

import glob
import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    build, stage = argv[1], argv[2]
    package = os.path.join(stage, "vramledger")
    if os.path.exists(package):
        shutil.rmtree(package)
    shutil.copytree(os.path.join(REPO, "python", "vramledger"), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    built = glob.glob(os.path.join(build, "torch_plugin", "libvramledger_torch.so"))
    if not built:
        print(f"stage_package: no libvramledger_torch.so in {build}/torch_plugin", file=sys.stderr)
        return 1
    extension = glob.glob(os.path.join(build, "torch_plugin", "_C*.so"))
    if not extension:
        print("stage_package: no _C extension (no Python headers?): the package uses ctypes")
    built += extension
    # The LD_PRELOAD shim next to the package: `vramledger run` then tracks non-torch memory.
    built += glob.glob(os.path.join(build, "preload", "libvramledger_preload.so"))
    # Its routing mode's cache, which the shim loads from its own folder.
    built += glob.glob(os.path.join(build, "preload", "libvramledger_route.so"))
    for path in built:
        shutil.copy2(path, package)
    shutil.copy2(os.path.join(REPO, "abi", "vramledger_c_api.h"), package)
    print(f"stage_package: {package}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

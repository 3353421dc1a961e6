"""Where libvramledger_torch.so is: next to this package once installed (meson-python or
`meson install`), or wherever the VRAMLEDGER_LIBRARY variable points. Where the LD_PRELOAD shim
libvramledger_preload.so is (preload_library_path): found without importing torch."""

from __future__ import annotations

import os
from typing import Optional

_NAME = "libvramledger_torch.so"
_PRELOAD_NAME = "libvramledger_preload.so"


def library_path() -> str:
    explicit = os.environ.get("VRAMLEDGER_LIBRARY")
    if explicit:
        return explicit
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), _NAME)
    if os.path.exists(here):
        return here
    import torch  # noqa: F401  (loads the libraries _C links against)

    from . import _C  # the loaded extension knows which copy the process uses

    return _C.library_path()  # ImportError here: neither next to the package nor built


def preload_library_path() -> Optional[str]:
    """The LD_PRELOAD shim, or None when it is not found. In order: $VRAMLEDGER_PRELOAD_LIBRARY
    (returned even if missing, so a wrong path is reported, not ignored); next to this package
    (tests/torch/stage_package.py puts it there); next to $VRAMLEDGER_LIBRARY; and, when that
    library sits in a meson build tree (BUILD/torch_plugin/), BUILD/preload/."""
    explicit = os.environ.get("VRAMLEDGER_PRELOAD_LIBRARY")
    if explicit:
        return explicit
    candidates = [os.path.join(os.path.dirname(os.path.abspath(__file__)), _PRELOAD_NAME)]
    plugin = os.environ.get("VRAMLEDGER_LIBRARY")
    if plugin:
        plugin_dir = os.path.dirname(os.path.abspath(plugin))
        candidates.append(os.path.join(plugin_dir, _PRELOAD_NAME))
        candidates.append(os.path.join(os.path.dirname(plugin_dir), "preload", _PRELOAD_NAME))
    for candidate in candidates:
        if os.path.exists(candidate):
            return candidate
    return None

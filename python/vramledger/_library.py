"""Where vramledger's three native libraries are:

- libvramledger_torch.so (library_path): torch's allocator; next to this package once installed
  (`pip install .` or `meson install`), or wherever $VRAMLEDGER_LIBRARY points;
- libvramledger_preload.so (preload_library_path): the LD_PRELOAD shim that counts non-torch
  memory by library; installed next to this package too;
- libvramledger_route.so (route_library_path): the shim's routing mode's cache, which the shim
  loads from its own folder.

The last two are found without importing torch."""

from __future__ import annotations

import os
from typing import Optional

_NAME = "libvramledger_torch.so"
_PRELOAD_NAME = "libvramledger_preload.so"
_ROUTE_NAME = "libvramledger_route.so"


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


def route_library_path() -> Optional[str]:
    """The routing mode's library, or None when it is not found: the shim dlopens it from its own
    folder (docs/preload.md), so it is looked for next to preload_library_path() only."""
    shim = preload_library_path()
    if shim is None:
        return None
    candidate = os.path.join(os.path.dirname(os.path.abspath(shim)), _ROUTE_NAME)
    return candidate if os.path.exists(candidate) else None

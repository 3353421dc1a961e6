"""Where libvramledger_torch.so is: next to this package once installed (meson-python or
`meson install`), or wherever the VRAMLEDGER_LIBRARY variable points."""

from __future__ import annotations

import os

_NAME = "libvramledger_torch.so"


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

"""The per-GPU budget board (docs/board.md): several vramledger processes on one GPU publish
what they hold and claim what they are about to take, so instances started together budget
around each other instead of counting each other's loading as their own.

No torch needed to read it (`vramledger top`); publishing reads vramledger's own books.

    from vramledger import board
    b = board.open_for_device(0)                       # this GPU's board, a slot of our own
    board.claim_share(b, device_total, utilization=0.5)  # before loading (optional)
    ... prof.result(utilization=0.5, board=b) ...      # profiling.py: KV budget that fits
    board.enforce(0)                                   # optional: cap torch at the claim
"""

from .board import Board, BoardView
from .budget import BoardRoom, OtherInstance, claim_share, room_on_board
from .layout import BoardFormatError, Figures
from .shm_file import BoardError, board_directory, board_path, list_boards

__all__ = [
    "Board", "BoardView", "BoardRoom", "OtherInstance", "claim_share", "room_on_board",
    "BoardFormatError", "Figures", "BoardError", "board_directory", "board_path", "list_boards",
    "device_key", "open_for_device", "figures_from_report", "start_publishing",
    "stop_publishing", "enforce", "oom_note",
]


_LAZY = {"device_key": "publisher", "open_for_device": "publisher",
         "figures_from_report": "publisher", "start_publishing": "publisher",
         "stop_publishing": "publisher", "timeline": "publisher",
         "enforce": "enforcement", "oom_note": "enforcement"}


def __getattr__(name):  # the torch-facing parts load torch only when used
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # import_module, not `from . import`: that asks this __getattr__ again for the submodule.
    import importlib

    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)

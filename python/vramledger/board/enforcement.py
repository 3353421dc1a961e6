"""Optional enforcement: this process caps itself at its claim on the board.

An instance that claimed C bytes of a GPU should not take more, or the budgets the others
computed stop fitting. enforce() turns the claim into torch's per-process memory fraction (the
cap the allocator already applies to reserved memory, raising torch.OutOfMemoryError past it):
the torch part of the claim is C minus what the process holds outside torch at that moment
(context, libraries: process usage - torch reserved, from NVML's per-process figure), since the
fraction caps torch's reserved bytes only.

The OOM message then names the other instances: the note (oom_note()) is handed to the plugin
(vramledger_set_oom_note) now and after every publish, so the failing allocation only copies a
string.
"""

from __future__ import annotations

import json
from typing import Any, List, Optional

from .board import Board, BoardView
from .budget import room_on_board

GIB = 1 << 30


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f} GiB"


def oom_note(view: BoardView, device_total: int, claim_bytes: int,
             torch_cap_bytes: Optional[int]) -> str:
    """The sentence vramledger's OutOfMemoryError carries under enforcement."""
    room = room_on_board(view, device_total)
    parts: List[str] = []
    for other in room.others:
        parts.append(f"pid {other.pid}{f' ({other.label})' if other.label else ''} holds "
                     f"{_gib(other.holds_bytes)} and claims {_gib(other.claim_bytes)}")
    others = "; ".join(parts) if parts else "none"
    cap = f" (torch capped at {_gib(torch_cap_bytes)})" if torch_cap_bytes is not None else ""
    return (f"vramledger budget board ({view.path}): this process claimed "
            f"{_gib(claim_bytes)} of {_gib(device_total)}{cap}; other vramledger instances on "
            f"this GPU: {others}. Raise this instance's claim only if they leave room "
            f"({_gib(room.room_bytes)} not held or claimed by them).")


def _set_note_in_plugin(device: int, text: str) -> None:
    # The _C extension predates vramledger_set_oom_note: without it, the ctypes bridge (the
    # plugin is loaded already, so it reaches the same library and its notes).
    from .. import _native

    native = _native()
    if not hasattr(native, "set_oom_note"):
        from .. import _ctypes_api as native
    native.set_oom_note(device, text)


def enforce(device: Any = None, board: Optional[Board] = None) -> int:
    """Caps torch on `device` at this process's claim minus its non-torch memory now; returns
    the cap in bytes. Needs a claim (claim_share, or a profile's result(board=...))."""
    import torch

    from .. import _device_index, process_report, stats
    from .publisher import open_for_device, start_publishing

    index = _device_index(device)
    board = board or open_for_device(index)
    claim = board.claim_bytes
    if claim <= 0:
        raise ValueError("vramledger.board.enforce: this process has no claim on the board yet "
                         "(claim_share(), or MemoryProfile.result(board=...))")
    report = json.loads(process_report(index, format="json"))
    total = int(report["device_total_bytes"])
    # The fraction multiplies the allocator's device total (cudaMemGetInfo), not NVML's.
    allocator_total = int(stats(index).get("total_bytes", 0)) or torch.cuda.mem_get_info(index)[1]
    non_torch = int(report["process_usage_bytes"]) - int(report["torch"]["reserved"])
    if report["basis"] != "nvml_per_process":
        non_torch = int(report["non_torch"]["tracked_total"])
    torch_cap = max(0, claim - non_torch)
    torch.cuda.set_per_process_memory_fraction(min(1.0, torch_cap / allocator_total), index)
    board.set_enforcing(True)
    _set_note_in_plugin(index, oom_note(board.read(), total, claim, torch_cap))

    def refresh(published_device: int, published_board: Board, _figures: Any) -> None:
        if published_device == index:
            _set_note_in_plugin(index, oom_note(published_board.read(), total,
                                                published_board.claim_bytes, torch_cap))

    start_publishing().on_publish.append(refresh)
    return torch_cap

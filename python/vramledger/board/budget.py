"""How much of the GPU the other vramledger instances take from us, read off the board.

An instance counts against the others by max(what it holds, what it has claimed): holdings come
from its own books (NVML's per-process figure, so they include its context and non-torch
memory), claims are what it said it is about to take (its KV cache). A dead instance's slot is
not read at all, so its share comes back the moment the kernel reaps it.

The profiling API (profiling.MemoryProfile.result(board=...)) takes the smaller of the
utilization budget and this room, then claims what it decided under the board's decision lock,
so N instances deciding at once decide one after the other and their claims fit the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Dict, List, Optional

from .board import Board, BoardView


@dataclass
class OtherInstance:
    slot: int
    pid: int
    label: str
    holds_bytes: int     # process usage (per-process basis), else torch reserved + tracked
    claim_bytes: int
    counted_bytes: int   # max(holds, claim): what it takes from our room
    per_process: bool


@dataclass
class BoardRoom:
    device_total_bytes: int
    others: List[OtherInstance] = field(default_factory=list)
    others_bytes: int = 0
    room_bytes: int = 0  # device total - others' counted bytes (negative: over-committed)
    dead_slots: int = 0
    notes: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return {"device_total_bytes": self.device_total_bytes, "others_bytes": self.others_bytes,
                "room_bytes": self.room_bytes, "dead_slots": self.dead_slots,
                "others": [vars(other) for other in self.others], "notes": list(self.notes)}


def room_on_board(view: BoardView, device_total: int) -> BoardRoom:
    """What the live instances other than us take from a device of `device_total` bytes."""
    room = BoardRoom(device_total_bytes=device_total, dead_slots=view.dead_slots,
                     notes=list(view.problems))
    for slot in view.others():
        figures = slot.figures
        if figures.per_process:
            holds = figures.process_usage
        else:
            # Its process usage is a device-wide figure (it would count us too): only what its
            # books know for sure.
            holds = figures.torch_reserved + figures.non_torch_tracked
            room.notes.append(f"pid {slot.pid} publishes no per-process figure: its context and "
                              "untracked non-torch memory are not counted")
        if figures.device_total and figures.device_total != device_total:
            room.notes.append(f"pid {slot.pid} sees a device of {figures.device_total} bytes, we "
                              f"see {device_total}")
        counted = max(holds, slot.claim_bytes)
        room.others.append(OtherInstance(slot=slot.index, pid=slot.pid, label=slot.label,
                                         holds_bytes=holds, claim_bytes=slot.claim_bytes,
                                         counted_bytes=counted, per_process=figures.per_process))
        room.others_bytes += counted
    room.room_bytes = device_total - room.others_bytes
    return room


def claim_share(board: Board, device_total: int, utilization: Optional[float] = None,
                claim_bytes: Optional[int] = None) -> int:
    """Claims floor(utilization * device_total) (or claim_bytes) up front, before loading, so
    instances profiling meanwhile count it; limited to the room the others leave (never
    negative). Returns the bytes claimed."""
    if (utilization is None) == (claim_bytes is None):
        raise ValueError("give exactly one of utilization or claim_bytes")
    if claim_bytes is None:
        if not 0 <= utilization <= 1:
            raise ValueError("utilization must lie in [0, 1]")
        claim_bytes = math.floor(Fraction(utilization) * device_total)
    with board.decision() as view:
        room = room_on_board(view, device_total)
        granted = max(0, min(int(claim_bytes), room.room_bytes))
        board.set_claim(granted)
    return granted

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
from typing import Any, Callable, Dict, List, Optional, Tuple

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
    capacity_bytes: int = 0  # what processes can allocate: device total less the driver's share
    others: List[OtherInstance] = field(default_factory=list)
    others_bytes: int = 0
    outside_bytes: int = 0   # in use by processes not on the board (0 when not measured)
    room_bytes: int = 0      # capacity - others - outside (negative: over-committed)
    dead_slots: int = 0
    notes: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return {"device_total_bytes": self.device_total_bytes,
                "capacity_bytes": self.capacity_bytes, "others_bytes": self.others_bytes,
                "outside_bytes": self.outside_bytes, "room_bytes": self.room_bytes,
                "dead_slots": self.dead_slots,
                "others": [vars(other) for other in self.others], "notes": list(self.notes)}


def room_on_board(view: BoardView, device_total: int, capacity: Optional[int] = None,
                  device_used: Optional[int] = None,
                  own_usage: Optional[int] = None) -> BoardRoom:
    """What the live instances other than us take from a device of `device_total` bytes.

    capacity: what processes can allocate (cudaMemGetInfo's total; NVML's total also counts
    memory the driver keeps, ~615 MiB on the H200); defaults to device_total. With device_used
    (NVML's device figure, driver share included) and own_usage (our per-process figure) taken
    together, memory held by processes that are not on the board is subtracted too:
    device_used - driver share - own - the others' counted bytes, when positive (an instance
    that grew since it last published reads as outside until it publishes again: the error
    only ever shrinks the room)."""
    capacity = capacity or device_total
    room = BoardRoom(device_total_bytes=device_total, capacity_bytes=capacity,
                     dead_slots=view.dead_slots, notes=list(view.problems))
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
    if device_used is not None and own_usage is not None:
        driver_share = max(0, device_total - capacity)
        room.outside_bytes = max(0, device_used - driver_share - own_usage - room.others_bytes)
        if room.outside_bytes:
            room.notes.append(f"{room.outside_bytes} bytes in use outside the board (processes "
                              "without vramledger, or instances that grew since they published)")
    room.room_bytes = capacity - room.others_bytes - room.outside_bytes
    return room


def claim_share(board: Board, device_total: int, utilization: Optional[float] = None,
                claim_bytes: Optional[int] = None, capacity: Optional[int] = None,
                sample: Optional[Callable[[], Any]] = None) -> int:
    """Claims floor(utilization * device_total) (or claim_bytes) up front, before loading, so
    instances profiling meanwhile count it; limited to the room the others leave (never
    negative). capacity as in room_on_board; sample: a profiling.ProcessMemory sampler (e.g.
    profiling.nvml_process_memory()), read under the lock to subtract memory outside the board.
    Returns the bytes claimed."""
    if (utilization is None) == (claim_bytes is None):
        raise ValueError("give exactly one of utilization or claim_bytes")
    if claim_bytes is None:
        if not 0 <= utilization <= 1:
            raise ValueError("utilization must lie in [0, 1]")
        claim_bytes = math.floor(Fraction(utilization) * device_total)
    with board.decision() as view:
        used, own = _fresh_usage(sample)
        room = room_on_board(view, device_total, capacity, used, own)
        granted = max(0, min(int(claim_bytes), room.room_bytes))
        board.set_claim(granted)
    return granted


def _fresh_usage(sample: Optional[Callable[[], Any]]) -> Tuple[Optional[int], Optional[int]]:
    """(device used, own per-process usage) from one sample, or (None, None) without a
    per-process figure (then nothing outside the board is subtracted)."""
    if sample is None:
        return None, None
    memory = sample()
    if memory.process_used_bytes is None:
        return None, None
    return memory.device_used_bytes, memory.process_used_bytes

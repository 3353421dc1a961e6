"""`vramledger top`: the processes on each GPU with their additive lines, from the budget boards
(docs/board.md), refreshed like nvidia-smi but by category. Needs no torch and no GPU: it only
reads this user's boards in /dev/shm (read-only).

    vramledger top                  # refreshed every --interval seconds until Ctrl-C
    vramledger top --once           # one table
    vramledger top --json           # one JSON document (schema vramledger.top, below), then exit

Every board is validated as untrusted input; a board that fails is shown with the reason and
makes the exit status 1, the others are still shown.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, List, Optional

from .board.board import Board
from .board.budget import room_on_board
from .board.shm_file import BoardError, board_directory, list_boards

SCHEMA = "vramledger.top"
SCHEMA_VERSION = 1
LINES = ("live", "pending_frees", "cached_usable", "fragmentation", "unmapped_physical",
         "non_torch_tracked", "remainder")
HEADINGS = ("LIVE", "PENDING", "CACHED", "FRAG", "UNMAPPED", "NONTORCH", "CONTEXT")


def _process(slot, now_ns: int) -> Dict[str, Any]:
    figures = slot.figures
    return {
        "slot": slot.index, "pid": slot.pid, "label": slot.label,
        "per_process": figures.per_process, "enforcing": slot.enforcing,
        "device_index": figures.device_index,
        "lines": {name: getattr(figures, name) for name in LINES},
        "process_usage_bytes": figures.process_usage,
        "torch_reserved_bytes": figures.torch_reserved,
        "peak_reserved_bytes": figures.peak_reserved,
        "peak_allocated_bytes": figures.peak_allocated,
        "num_ooms": figures.num_ooms,
        "claim_bytes": slot.claim_bytes,
        "counted_bytes": max(figures.process_usage if figures.per_process
                             else figures.torch_reserved + figures.non_torch_tracked,
                             slot.claim_bytes),
        "published_age_s": round(max(0, now_ns - slot.published_ns) / 1e9, 3),
    }


def snapshot(directory: Optional[str] = None) -> Dict[str, Any]:
    """The document `vramledger top --json` prints."""
    directory = directory or board_directory()
    boards: List[Dict[str, Any]] = []
    now_ns = time.time_ns()
    for key, path in list_boards(directory):
        entry: Dict[str, Any] = {"device_key": key, "path": path, "error": None}
        try:
            view = Board.open(key, directory, create=False, writable=False).read()
        except (BoardError, OSError, ValueError) as error:
            entry["error"] = str(error)
            boards.append(entry)
            continue
        processes = [_process(slot, now_ns) for slot in view.slots]
        totals = [slot.figures.device_total for slot in view.slots if slot.figures.device_total]
        device_total = max(totals) if totals else 0
        room = room_on_board(view, device_total)  # own_index is None: every slot is "other"
        entry.update({
            "slot_count": view.slot_count, "device_total_bytes": device_total,
            "processes": processes,
            "sum_process_usage_bytes": sum(p["process_usage_bytes"] for p in processes),
            "sum_counted_bytes": room.others_bytes,
            "unclaimed_bytes": room.room_bytes,
            "dead_slots": view.dead_slots, "problems": view.problems + room.notes,
        })
        boards.append(entry)
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "directory": directory,
            "time_ns": now_ns, "boards": boards}


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 30):8.2f}"


def render(document: Dict[str, Any]) -> str:
    """The table: one block per GPU, one row per process, sizes in GiB."""
    out: List[str] = [f"vramledger top  {time.strftime('%H:%M:%S')}  boards in "
                      f"{document['directory']}  (GiB; the lines add up to USAGE)"]
    if not document["boards"]:
        out.append("no boards: no vramledger process of this user has published yet")
    for board in document["boards"]:
        out.append("")
        if board["error"]:
            out.append(f"{board['device_key']}: ERROR: {board['error']}")
            continue
        out.append(f"{board['device_key']}: total {_gib(board['device_total_bytes']).strip()}, "
                   f"{len(board['processes'])} process(es) use "
                   f"{_gib(board['sum_process_usage_bytes']).strip()}, held or claimed "
                   f"{_gib(board['sum_counted_bytes']).strip()}, unclaimed "
                   f"{_gib(board['unclaimed_bytes']).strip()}"
                   + (f", {board['dead_slots']} dead slot(s) ignored" if board['dead_slots']
                      else ""))
        header = (f"{'PID':>8} {'LABEL':<16} {'USAGE':>8} = "
                  + " ".join(f"{h:>8}" for h in HEADINGS)
                  + f" {'PEAKRES':>8} {'CLAIM':>8} {'OOMS':>4} {'AGE':>5}")
        out.append(header)
        for process in board["processes"]:
            lines = " ".join(_gib(process["lines"][name]) for name in LINES)
            flags = ("" if process["per_process"] else " (device-wide usage)") + \
                    (" [enforcing]" if process["enforcing"] else "")
            out.append(f"{process['pid']:>8} {process['label'][:16]:<16} "
                       f"{_gib(process['process_usage_bytes'])} = {lines} "
                       f"{_gib(process['peak_reserved_bytes'])} {_gib(process['claim_bytes'])} "
                       f"{process['num_ooms']:>4} {process['published_age_s']:>5.0f}{flags}")
        for problem in board["problems"]:
            out.append(f"  PROBLEM: {problem}")
    return "\n".join(out)


def main(as_json: bool, once: bool, interval_s: float, directory: Optional[str]) -> int:
    if as_json:
        document = snapshot(directory)
        print(json.dumps(document, indent=1))
        return 1 if any(board["error"] for board in document["boards"]) else 0
    tty = sys.stdout.isatty()
    try:
        while True:
            document = snapshot(directory)
            text = render(document)
            sys.stdout.write(("\x1b[H\x1b[2J" if tty and not once else "") + text + "\n")
            sys.stdout.flush()
            if once:
                return 1 if any(board["error"] for board in document["boards"]) else 0
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return 0

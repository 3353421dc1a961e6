"""Publishing this process's figures on its GPUs' boards: a background thread, not the
allocation path (an allocation costs ~100 ns; a publish reads the process report, tens of µs
plus a few NVML queries).

Every `interval_s` (default 1 s, $VRAMLEDGER_BOARD_INTERVAL_S) the thread reads, for each device
vramledger has used, the process report (docs/report_schema.md) and the stats, and writes the
board only when a figure moved by at least `threshold_bytes` (default 2 MiB, one driver page) or
`heartbeat_s` passed. It also keeps the last samples per device, the timeline the cluster report
draws (measured at the samples' instants, not an event trace).

vramledger.install() starts it unless $VRAMLEDGER_BOARD is 0. A failure is printed once and
stops publishing; it never reaches the program.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

from .board import Board
from .layout import Figures

_TIMELINE_SAMPLES = 720


def device_key(device: int) -> str:
    """The board key of CUDA device `device`: its UUID (the same in every process, whatever
    CUDA_VISIBLE_DEVICES says), else idx<N> (then processes must see the same numbering)."""
    import torch

    try:
        text = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:  # no uuid attribute, no CUDA: the index will do
        return f"idx{device}"
    uuid = "".join(c for c in text if c.isascii() and (c.isalnum() or c == "-"))
    if not uuid.strip("-"):
        return f"idx{device}"
    uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    return uuid[:64]


def figures_from_report(report: Dict[str, Any], stats: Dict[str, Any]) -> Figures:
    """The board's figures from a process report (JSON, docs/report_schema.md) and stats().
    Non-torch and remainder come from the report's `lines`, which sum to the usage by
    construction (with several devices the library figures are left out of the lines and the
    remainder holds them, while non_torch.tracked_total still counts them)."""
    torch_lines = report["torch"]
    by_kind: Dict[str, int] = {}
    for line in report["lines"]:
        by_kind[line["kind"]] = by_kind.get(line["kind"], 0) + int(line["bytes"])
    return Figures(
        device_index=int(report["device"]), device_total=int(report["device_total_bytes"]),
        process_usage=int(report["process_usage_bytes"]),
        per_process=report["basis"] == "nvml_per_process",
        live=int(torch_lines["requested"]) + int(torch_lines["rounding"]),
        pending_frees=int(torch_lines["pending_frees"]),
        cached_usable=int(torch_lines["cached_usable"]),
        fragmentation=int(torch_lines["fragmentation"]),
        unmapped_physical=int(torch_lines["unmapped_physical"]),
        non_torch_tracked=by_kind.get("non_torch", 0),
        remainder=by_kind.get("remainder", 0),
        peak_reserved=int(stats["reserved_bytes"]["all"]["peak"]),
        peak_allocated=int(stats["allocated_bytes"]["all"]["peak"]),
        num_ooms=int(stats.get("num_ooms", 0)))


def _vramledger_figures(device: int) -> Figures:
    from .. import process_report, stats

    return figures_from_report(json.loads(process_report(device, format="json")), stats(device))


def _label() -> str:
    return os.environ.get("VRAMLEDGER_BOARD_LABEL") or os.path.basename(sys.argv[0] or "python")


def open_for_device(device: int, label: Optional[str] = None) -> Board:
    """This GPU's board (created if missing), with a slot of this process's own."""
    board = Board.open(device_key(device))
    board.acquire(label if label is not None else _label())
    return board


class Publisher(threading.Thread):
    """The publishing thread; figures_fn/devices_fn/board_fn are replaceable for tests."""

    def __init__(self, interval_s: float = 1.0, threshold_bytes: int = 2 << 20,
                 heartbeat_s: float = 5.0, figures_fn=None, devices_fn=None,
                 board_fn=None) -> None:
        super().__init__(name="vramledger-board", daemon=True)
        self.interval_s = interval_s
        self.threshold_bytes = threshold_bytes
        self.heartbeat_s = heartbeat_s
        self._figures = figures_fn or _vramledger_figures
        self._devices = devices_fn or _used_devices
        self._board = board_fn or open_for_device
        self._stopping = threading.Event()
        self._last: Dict[int, Tuple[Figures, float]] = {}
        self.boards: Dict[int, Board] = {}
        self.timelines: Dict[int, Deque[List[int]]] = {}
        self.error: Optional[str] = None
        self.publishes = 0
        self.on_publish = []  # callables(device, board, figures): enforcement refreshes its note

    def _moved(self, old: Figures, new: Figures) -> bool:
        for name in ("process_usage", "live", "pending_frees", "cached_usable", "fragmentation",
                     "unmapped_physical", "non_torch_tracked", "peak_reserved"):
            if abs(getattr(old, name) - getattr(new, name)) >= self.threshold_bytes:
                return True
        return old.num_ooms != new.num_ooms

    def tick(self) -> None:
        now = time.monotonic()
        for device in self._devices():
            figures = self._figures(device)
            timeline = self.timelines.setdefault(
                device, collections.deque(maxlen=_TIMELINE_SAMPLES))
            timeline.append([time.time_ns(), figures.process_usage, figures.torch_reserved,
                             figures.live])
            last = self._last.get(device)
            if last is not None and not self._moved(last[0], figures) \
                    and now - last[1] < self.heartbeat_s:
                continue
            board = self.boards.get(device)
            if board is None:
                board = self.boards[device] = self._board(device)
            board.publish(figures)
            self.publishes += 1
            self._last[device] = (figures, now)
            for callback in list(self.on_publish):
                callback(device, board, figures)

    def run(self) -> None:
        # The first tick waits an interval: install() runs as `import torch` completes, and
        # nothing has been allocated before then anyway.
        while not self._stopping.wait(self.interval_s):
            try:
                self.tick()
            except Exception as error:  # never into the program: say it once and stop
                self.error = f"{type(error).__name__}: {error}"
                print(f"vramledger board: publishing stopped: {self.error}", file=sys.stderr)
                return

    def stop(self) -> None:
        self._stopping.set()


def _used_devices() -> List[int]:
    from .. import used_devices

    return used_devices()


_publisher: Optional[Publisher] = None
_publisher_lock = threading.Lock()


def start_publishing(interval_s: Optional[float] = None) -> Publisher:
    """Starts the publishing thread of this process (once; later calls return it)."""
    global _publisher
    with _publisher_lock:
        if _publisher is None or not _publisher.is_alive():
            if interval_s is None:
                interval_s = float(os.environ.get("VRAMLEDGER_BOARD_INTERVAL_S", "1.0"))
            _publisher = Publisher(interval_s=interval_s)
            _publisher.start()
        return _publisher


def publisher() -> Optional[Publisher]:
    return _publisher


def stop_publishing() -> None:
    with _publisher_lock:
        if _publisher is not None:
            _publisher.stop()


def timeline(device: int) -> List[List[int]]:
    """The publisher's samples of `device`: [time_ns, process usage, torch reserved, live]."""
    if _publisher is None:
        return []
    return list(_publisher.timelines.get(device, ()))


def _forget_after_fork() -> None:
    global _publisher, _publisher_lock
    _publisher = None  # the thread did not survive the fork
    _publisher_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)

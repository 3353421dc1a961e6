"""The per-GPU budget board: what each vramledger process on one GPU holds and has claimed.

    board = Board.open("GPU-8f6c...")        # creates it (0600) if this user has none yet
    board.acquire(label="engine-0")          # a slot of our own, until we exit
    board.publish(figures)                   # our additive lines (layout.Figures)
    with board.decision() as view:           # one process at a time
        ... decide a budget from view.others() ...
        board.set_claim(budget)              # others now count it as ours
    for slot in board.read().others(): ...   # anyone: the live instances and their figures

Concurrency (docs/board.md, "Why it survives a crash"): each slot is written only by its owner,
who holds a record lock on it for its life (record_locks.py); a slot whose lock no process
holds is dead, its figures and claim ignored, and the next process to acquire it overwrites it.
A reader copies a slot in one go and believes it only when its checksum matches and its sequence
is even, retrying a torn copy. Decisions (claims) take a short lock the kernel releases if its
holder dies. No state on the board can block a live process on a dead one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional

from . import layout, record_locks
from .shm_file import BoardError, open_board_file

# A torn copy (the writer is mid-publish) is retried at once a few times, then with pauses
# doubling up to 5 ms, for up to a quarter second of wall time. A count of retries (200, every
# 0.1 ms) gave up after ~20 ms, shorter than a writer descheduled mid-publish waits on a loaded
# machine: with both cores busy, a live slot was left out of a read now and then.
_TORN_READ_QUICK_RETRIES = 3
_TORN_READ_FIRST_PAUSE_S = 0.0001
_TORN_READ_LONGEST_PAUSE_S = 0.005
_TORN_READ_PATIENCE_S = 0.25


@dataclass
class BoardView:
    """One read of the board: the live slots, and what was wrong with the others."""

    path: str
    device_key: str
    slot_count: int
    slots: List[layout.Slot] = field(default_factory=list)
    own_index: Optional[int] = None
    dead_slots: int = 0           # slots holding a dead process's figures: ignored
    problems: List[str] = field(default_factory=list)

    def others(self) -> List[layout.Slot]:
        return [slot for slot in self.slots if slot.index != self.own_index]

    def own(self) -> Optional[layout.Slot]:
        for slot in self.slots:
            if slot.index == self.own_index:
                return slot
        return None


def _process_start_time() -> int:
    """This process's start time in clock ticks since boot (/proc/self/stat field 22), stored
    next to the pid so a reader can tell a recycled pid apart; 0 where /proc is missing."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return 0


class Board:
    """One board file opened by this process. Use Board.open (one object per file per process:
    closing a second descriptor would drop this process's record locks)."""

    _registry: Dict[str, "Board"] = {}
    _registry_lock = threading.Lock()

    def __init__(self, device_key: str, directory: Optional[str], create: bool,
                 writable: bool, slot_count: int) -> None:
        self.device_key = device_key
        self.writable = writable
        self._fd, self._map, self.path = open_board_file(device_key, directory, create, writable,
                                                         slot_count)
        header = layout.decode_header(bytes(self._map[:layout.HEADER_SIZE]), len(self._map))
        self.slot_count = header.slot_count
        self._own: Optional[int] = None
        self._seq = 0
        self._label = ""
        self._figures = layout.Figures()
        self._claim = 0
        self._claim_ns = 0
        self._flags = 0
        self._write_lock = threading.Lock()  # threads of this process share the slot
        self._decision_lock = threading.Lock()

    @classmethod
    def open(cls, device_key: str, directory: Optional[str] = None, create: bool = True,
             writable: bool = True, slot_count: int = layout.DEFAULT_SLOTS) -> "Board":
        """The board of `device_key` (a GPU UUID, or idx<N>), created if missing and `create`.
        BoardError when it cannot be trusted (a clear message saying why and what to do)."""
        from .shm_file import board_path

        path = os.path.realpath(board_path(device_key, directory))
        key = path + ("" if writable else ":ro")
        with cls._registry_lock:
            # A reader in a process that owns a slot reads through the owner's object: record
            # locks never conflict with their own process, so only it knows which slot is ours.
            board = cls._registry.get(path) if not writable else None
            board = board or cls._registry.get(key)
            if board is None:
                board = cls(device_key, directory, create, writable, slot_count)
                cls._registry[key] = board
            return board

    # --- writing (the owner) ----------------------------------------------------------------

    def acquire(self, label: str = "") -> int:
        """A slot of this process's own (the same one when called again); BoardError when every
        slot is held by a live process."""
        if not self.writable:
            raise BoardError(f"vramledger board {self.path}: opened read-only")
        with self._write_lock:
            if self._own is not None:
                if label and label != self._label:  # the publisher may have taken it first
                    self._label = label
                    self._write_locked()
                return self._own
            for index in range(self.slot_count):
                if record_locks.try_lock(self._fd, layout.slot_offset(index)):
                    self._own = index
                    self._label = label
                    self._seq = 0
                    self._write_locked()
                    return index
        raise BoardError(f"vramledger board {self.path}: all {self.slot_count} slots are held by "
                         "live processes")

    def _write_locked(self) -> None:
        assert self._own is not None
        self._seq += 2
        data = layout.encode_slot(self._seq, os.getpid(), self._flags, _START_TIME,
                                  time.time_ns(), self._figures, self._claim, self._claim_ns,
                                  self._label)
        offset = layout.slot_offset(self._own)
        # The sequence goes odd first, so a reader that copies during the write sees either the
        # odd mark or a checksum mismatch, and retries.
        odd = (self._seq - 1).to_bytes(8, "little")
        self._map[offset:offset + 8] = odd
        self._map[offset + 8:offset + layout.SLOT_SIZE] = data[8:]
        self._map[offset:offset + 8] = data[:8]

    def publish(self, figures: layout.Figures) -> None:
        """Our figures for this GPU (checked: impossible figures raise ValueError)."""
        self.acquire()
        problem = figures.problem()
        if problem is not None:
            raise ValueError(f"vramledger board: refusing to publish impossible figures: {problem}")
        with self._write_lock:
            self._figures = figures
            self._write_locked()

    def set_claim(self, claim_bytes: int) -> None:
        """The total this process intends to hold on the GPU (0: no claim). Other instances
        count max(what we hold, what we claim) against their room."""
        if not 0 <= claim_bytes <= layout.MAX_BYTES:
            raise ValueError(f"vramledger board: claim {claim_bytes} outside [0, 1 PiB]")
        self.acquire()
        with self._write_lock:
            self._claim = int(claim_bytes)
            self._claim_ns = time.time_ns()
            self._write_locked()

    def set_enforcing(self, enforcing: bool) -> None:
        self.acquire()
        with self._write_lock:
            self._flags = (self._flags | layout.FLAG_ENFORCING) if enforcing \
                else (self._flags & ~layout.FLAG_ENFORCING)
            self._write_locked()

    @property
    def claim_bytes(self) -> int:
        return self._claim

    @property
    def own_index(self) -> Optional[int]:
        return self._own

    @contextlib.contextmanager
    def decision(self, timeout_s: float = 5.0) -> Iterator[BoardView]:
        """Holds the board's decision lock (one process at a time; the kernel frees it if we
        die) and yields a fresh view: read, decide, set_claim, all before another decides."""
        if not self.writable:
            raise BoardError(f"vramledger board {self.path}: opened read-only")
        # Record locks exclude other processes only: threads of this one queue here first.
        if not self._decision_lock.acquire(timeout=timeout_s):
            raise TimeoutError(f"another thread of this process holds the board's decision "
                               f"lock for more than {timeout_s:.1f} s")
        try:
            record_locks.lock_waiting(self._fd, record_locks.DECISION_OFFSET, timeout_s)
            try:
                yield self.read()
            finally:
                record_locks.unlock(self._fd, record_locks.DECISION_OFFSET)
        finally:
            self._decision_lock.release()

    # --- reading (anyone) -------------------------------------------------------------------

    def _read_slot(self, index: int) -> Optional[layout.Slot]:
        offset = layout.slot_offset(index)
        attempt = 0
        pause = _TORN_READ_FIRST_PAUSE_S
        deadline: Optional[float] = None
        while True:
            data = bytes(self._map[offset:offset + layout.SLOT_SIZE])
            try:
                return layout.decode_slot(index, data)
            except layout.BoardFormatError:
                attempt += 1
                if attempt <= _TORN_READ_QUICK_RETRIES:
                    continue
                now = time.monotonic()
                if deadline is None:
                    deadline = now + _TORN_READ_PATIENCE_S
                elif now >= deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, _TORN_READ_LONGEST_PAUSE_S)

    def read(self) -> BoardView:
        """The live slots (every figure validated). A slot no live process holds is ignored and
        counted in dead_slots when it still carries figures; a live slot whose bytes stay wrong
        after retries is left out with a problem line naming it."""
        view = BoardView(path=self.path, device_key=self.device_key, slot_count=self.slot_count,
                         own_index=self._own)
        for index in range(self.slot_count):
            offset = layout.slot_offset(index)
            if index == self._own:
                with self._write_lock:
                    try:
                        view.slots.append(self._read_slot(index))
                    except layout.BoardFormatError as error:  # someone wrote over our slot
                        view.problems.append(f"{error} (our own slot; rewritten at the next "
                                             "publish)")
                continue
            holder = record_locks.holder(self._fd, offset)
            if holder is None:
                if any(self._map[offset:offset + layout.SLOT_SIZE]):
                    view.dead_slots += 1
                continue
            try:
                slot = self._read_slot(index)
            except layout.BoardFormatError as error:
                view.problems.append(f"{error} (slot held by pid {holder}; left out)")
                continue
            if slot is None:
                continue  # just acquired, not written yet
            if holder not in (0, slot.pid):
                # A new owner that has not written yet, over a dead owner's figures.
                continue
            view.slots.append(slot)
        return view

    def close(self) -> None:
        """Gives the slot back (zeroed) and closes the file. Only for tests and orderly exits;
        dying without it is fine."""
        with self._write_lock:
            if self._own is not None and self.writable:
                offset = layout.slot_offset(self._own)
                self._map[offset:offset + layout.SLOT_SIZE] = bytes(layout.SLOT_SIZE)
                record_locks.unlock(self._fd, offset)
                self._own = None
            self._map.close()
            os.close(self._fd)
        with Board._registry_lock:
            for key, board in list(Board._registry.items()):
                if board is self:
                    del Board._registry[key]


_START_TIME = _process_start_time()
_INHERITED: List[Board] = []


def _forget_after_fork() -> None:
    """A forked child inherits the descriptors but none of the record locks: it must open its
    own board. The inherited descriptors are left open (closing one would drop the locks the
    child takes later on the same file)."""
    global _START_TIME
    # Kept alive for good: Python's mmap holds a duplicate descriptor and closes it when
    # collected, which would drop the record locks the child takes on the same file.
    _INHERITED.extend(Board._registry.values())
    Board._registry = {}
    Board._registry_lock = threading.Lock()
    _START_TIME = _process_start_time()


os.register_at_fork(after_in_child=_forget_after_fork)

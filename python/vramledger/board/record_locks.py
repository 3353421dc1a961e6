"""Ownership and liveness through POSIX record locks (fcntl F_SETLK / F_GETLK) on the board.

Why record locks and not a pid field with kill(pid, 0): the kernel drops a process's record
locks the instant it dies, however it dies (SIGKILL included), so a lock can never outlive its
owner, and a recycled pid cannot pass for the dead owner. Readers ask F_GETLK, which changes
nothing and needs no write access.

Byte ranges (one byte each, outside the data's meaning):
  offset 0                  the decision lock: held for microseconds while a process reads the
                            board and writes its claim, so claims are decided one at a time;
  slot_offset(i)            slot i's owner lock: held by the slot's owner for its whole life.

Caveat, by POSIX design: a process loses all its record locks on a file when it closes ANY
descriptor of that file. The board module therefore keeps one descriptor per board per process
(board.py's registry) and never opens a second.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from typing import Optional

# struct flock on Linux (x86-64 and aarch64): short l_type, short l_whence, off_t l_start,
# off_t l_len, pid_t l_pid, padding.
_FLOCK = struct.Struct("@hhqqi4x")
DECISION_OFFSET = 0


def try_lock(fd: int, offset: int) -> bool:
    """Takes the write lock on byte `offset` without waiting; False when another process holds
    it. A lock this process already holds is granted again (POSIX locks are per process)."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset, os.SEEK_SET)
        return True
    except OSError as error:
        if error.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise


def unlock(fd: int, offset: int) -> None:
    fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset, os.SEEK_SET)


def holder(fd: int, offset: int) -> Optional[int]:
    """The pid holding a lock on byte `offset` as the kernel reports it (0 when the holder is in
    another pid namespace), or None when no OTHER process holds one (this process's own locks
    never conflict with itself, so they read as None here)."""
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    l_type, _, _, _, l_pid = _FLOCK.unpack(answer)
    if l_type == fcntl.F_UNLCK:
        return None
    return l_pid


def lock_waiting(fd: int, offset: int, timeout_s: float) -> None:
    """Takes the write lock on byte `offset`, polling (never blocking for good: the holder may be
    a live process stuck in a debugger); TimeoutError names the holder."""
    deadline = time.monotonic() + timeout_s
    pause = 0.0005
    while not try_lock(fd, offset):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the board's decision lock is held by pid {holder(fd, offset)} "
                               f"for more than {timeout_s:.1f} s")
        time.sleep(pause)
        pause = min(pause * 2, 0.01)

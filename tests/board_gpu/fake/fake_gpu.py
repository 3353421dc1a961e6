"""A stand-in GPU for running tests/board_gpu on a machine without one (test_offline.py): the
processes of one run share a folder ($FAKE_GPU_DIR) where each writes its usage; NVML's and
cudaMemGetInfo's figures are computed from it as the H200 gives them (NVML's total includes
615 MiB the driver keeps, plus 9 MiB NVML counts as used without a process). Allocation beyond
what is free raises, after the cache was given back, like the real allocator. Only the figures
and rules the board check depends on; no data is stored."""

from __future__ import annotations

import fcntl
import os

MIB = 1 << 20
NVML_TOTAL = 143_771 * MIB
CAPACITY = NVML_TOTAL - 615 * MIB      # cudaMemGetInfo's total
UNATTRIBUTED = 624 * MIB               # NVML device used minus every process's usage
CONTEXT = 519 * MIB
PAGE = 2 * MIB
FOLDER = os.environ.get("FAKE_GPU_DIR", "/tmp/fake-gpu")


class OutOfMemory(RuntimeError):
    pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def usage_of(pid: int):
    try:
        with open(os.path.join(FOLDER, str(pid)), encoding="ascii") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    return int(text) if text and _alive(pid) else None


def all_usage() -> int:
    total = 0
    for name in os.listdir(FOLDER):
        if name.isdigit():
            total += usage_of(int(name)) or 0
    return total


class Device:
    """This process's side of the fake GPU: its context, torch's counters, the memory cap."""

    def __init__(self) -> None:
        os.makedirs(FOLDER, exist_ok=True)
        self.allocated = self.peak_allocated = self.reserved = self.peak_reserved = 0
        self.cap = 0
        self.num_ooms = 0
        self.note = ""
        self.used = False
        self._write()

    def usage(self) -> int:
        return CONTEXT + self.reserved

    def _write(self) -> None:
        path = os.path.join(FOLDER, str(os.getpid()))
        with open(path + ".tmp", "w", encoding="ascii") as handle:
            handle.write(str(self.usage()))
        os.replace(path + ".tmp", path)

    def free_bytes(self) -> int:
        return CAPACITY - all_usage() - (UNATTRIBUTED - (NVML_TOTAL - CAPACITY))

    def allocate(self, num_bytes: int) -> None:
        self.used = True
        if self.reserved - self.allocated < num_bytes:
            with open(os.path.join(FOLDER, "lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                grow = -(-(self.allocated + num_bytes) // PAGE) * PAGE - self.reserved
                if self._refused(grow):  # give the cache back and try again, as vramledger does
                    self.reserved = -(-self.allocated // PAGE) * PAGE
                    grow = -(-(self.allocated + num_bytes) // PAGE) * PAGE - self.reserved
                if self._refused(grow):
                    self._write()
                    self.num_ooms += 1
                    raise OutOfMemory(f"CUDA out of memory. Tried to allocate {num_bytes} bytes "
                                      f"(fake GPU; cap {self.cap}). {self.note}")
                self.reserved += grow
                self._write()
        self.allocated += num_bytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _refused(self, grow: int) -> bool:
        if self.cap and self.reserved + grow > self.cap:
            return True
        return grow > self.free_bytes()

    def release(self, num_bytes: int) -> None:
        self.allocated -= num_bytes

    def reset_peaks(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved


DEVICE = None


def device() -> Device:
    global DEVICE
    if DEVICE is None:
        DEVICE = Device()
    return DEVICE

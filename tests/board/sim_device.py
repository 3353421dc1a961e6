"""A GPU shared by several test processes, simulated: a device total and each process's bytes in
shared memory, allocation refused past the total (as the driver would), and the figures a
process's books would give (stats shaped like vramledger.stats(), NVML-like samples). Only for
the board tests: the C++ simulated device (allocator/simulated) serves one process."""

from __future__ import annotations

import multiprocessing
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from vramledger.board import Figures  # noqa: E402
from vramledger.profiling import ProcessMemory  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
H200_TOTAL = 143_771 * MIB
SEGMENT = 20 * MIB   # torch's large segment: reserved grows by whole segments
CONTEXT = 519 * MIB  # a CUDA context's share, as on the H200


class SimOutOfMemory(RuntimeError):
    pass


class SimDevice:
    """Per-process usage in a shared array (index = instance number)."""

    def __init__(self, processes: int, total: int = H200_TOTAL, context=None,
                 driver_share: int = 0) -> None:
        context = context or multiprocessing.get_context("fork")
        self.total = total  # what processes can allocate (cudaMemGetInfo's total)
        self.driver_share = driver_share  # in NVML's total and used, never allocatable
        self.usage = context.Array("q", processes)  # with its own lock

    def allocate(self, who: int, num_bytes: int) -> None:
        with self.usage.get_lock():
            used = sum(self.usage[:])
            if used + num_bytes > self.total:
                raise SimOutOfMemory(f"instance {who}: {num_bytes} bytes asked, "
                                     f"{self.total - used} free")
            self.usage[who] += num_bytes

    def release(self, who: int, num_bytes: int) -> None:
        with self.usage.get_lock():
            self.usage[who] -= num_bytes

    def reap(self, who: int) -> None:
        """What the driver does when a process dies: everything it held comes back."""
        with self.usage.get_lock():
            self.usage[who] = 0

    def used(self) -> int:
        return sum(self.usage[:])

    def sample(self, who: int) -> ProcessMemory:
        return ProcessMemory(device_used_bytes=self.used() + self.driver_share,
                             device_total_bytes=self.total + self.driver_share,
                             process_used_bytes=self.usage[who])


class SimProcess:
    """One instance's allocator on the SimDevice: allocated bytes, reserved in whole segments,
    a CUDA context, peaks; stats() shaped like vramledger.stats()."""

    def __init__(self, device: SimDevice, who: int) -> None:
        self.device, self.who = device, who
        self.allocated = self.peak = self.reserved = self.peak_reserved = 0
        device.allocate(who, CONTEXT)

    def alloc(self, num_bytes: int) -> None:
        need = -(-(self.allocated + num_bytes) // SEGMENT) * SEGMENT
        if need > self.reserved:
            self.device.allocate(self.who, need - self.reserved)  # may raise: nothing changed
            self.reserved = need
        self.allocated += num_bytes
        self.peak = max(self.peak, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, num_bytes: int) -> None:
        self.allocated -= num_bytes  # cached: reserved stays

    def reset_peaks(self) -> None:
        self.peak = self.allocated
        self.peak_reserved = self.reserved

    def stats(self) -> dict:
        def pooled(current: int, peak: int) -> dict:
            stat = {"current": current, "peak": peak, "allocated": 0, "freed": 0}
            return {"all": stat, "small_pool": dict(stat), "large_pool": dict(stat)}

        return {"device": 0, "backend": "sim", "total_bytes": self.device.total,
                "allocated_bytes": pooled(self.allocated, self.peak),
                "reserved_bytes": pooled(self.reserved, self.peak_reserved),
                "num_ooms": 0, "num_alloc_retries": 0, "tags": {},
                "fragmentation": {"gmlake_ratio": 0.0, "overhead_ratio": 1.0}}

    def figures(self) -> Figures:
        usage = self.device.usage[self.who]
        return Figures(device_index=0, device_total=self.device.total, process_usage=usage,
                       per_process=True, live=self.allocated,
                       cached_usable=self.reserved - self.allocated,
                       remainder=usage - self.reserved, peak_reserved=self.peak_reserved,
                       peak_allocated=self.peak)

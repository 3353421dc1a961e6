"""tests/classification_gpu/_common.py's GPU-facing helpers over fake_gpu (NVML read from the
shared folder), for the offline run of tests/board_gpu."""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import fake_gpu

GIB = 1 << 30
MIB = 1 << 20


def gpu_skip_reason() -> Optional[str]:
    return None


def cuda_pci_bus_id(ordinal: int = 0) -> str:
    return "00000000:00:00.0"


class Nvml:
    def __init__(self, bus_id: str) -> None:
        os.makedirs(fake_gpu.FOLDER, exist_ok=True)

    def process_used(self, pid: Optional[int] = None) -> Optional[int]:
        used = fake_gpu.usage_of(os.getpid() if pid is None else pid)
        # $FAKE_GPU_NVML_SKEW: NVML disagrees with the books by that many bytes (test_offline
        # checks that the driver then fails).
        return used if used is None else used + int(os.environ.get("FAKE_GPU_NVML_SKEW", "0"))

    def device_used_total(self) -> Tuple[int, int]:
        return fake_gpu.all_usage() + fake_gpu.UNATTRIBUTED, fake_gpu.NVML_TOTAL


def worker_env(drop_preload: bool = False) -> Dict[str, str]:
    return dict(os.environ)

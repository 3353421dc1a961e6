"""torch.cuda of the stand-in torch: one device, figures from fake_gpu."""

from __future__ import annotations

import types

import fake_gpu


def set_device(_index) -> None:
    fake_gpu.device()


def current_device() -> int:
    return 0


def is_initialized() -> bool:
    return True


def synchronize(_device=None) -> None:
    pass


def get_device_properties(_index):
    return types.SimpleNamespace(uuid="00000000-fake-gpu0-0000-000000000000")


def mem_get_info(_index=0):
    return fake_gpu.device().free_bytes(), fake_gpu.CAPACITY


def max_memory_allocated(_index=0) -> int:
    return fake_gpu.device().peak_allocated


def memory_reserved(_index=0) -> int:
    return fake_gpu.device().reserved


def set_per_process_memory_fraction(fraction: float, _index=0) -> None:
    fake_gpu.device().cap = int(fraction * fake_gpu.CAPACITY)

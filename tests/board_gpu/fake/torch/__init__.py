"""A stand-in `torch` for tests/board_gpu/test_offline.py: the calls the board check makes, over
fake_gpu.Device. Tensors hold no data; they only take and give back device memory."""

from __future__ import annotations

import fake_gpu

from . import cuda  # noqa: F401

__version__ = "2.11.0"
uint8 = "uint8"
float32 = "float32"
_SIZES = {"uint8": 1, "float32": 4}


class OutOfMemoryError(RuntimeError):
    pass


class Tensor:
    def __init__(self, num_bytes: int, owner: bool = True) -> None:
        self.num_bytes = num_bytes
        self.owner = owner
        if owner:
            try:
                fake_gpu.device().allocate(num_bytes)
            except fake_gpu.OutOfMemory as error:
                self.owner = False
                raise OutOfMemoryError(str(error)) from None

    def __del__(self) -> None:
        if getattr(self, "owner", False):
            fake_gpu.device().release(self.num_bytes)

    def fill_(self, _value) -> "Tensor":
        return self

    def __getitem__(self, _index) -> "Tensor":
        return Tensor(0, owner=False)

    def __matmul__(self, other: "Tensor") -> "Tensor":
        return Tensor(self.num_bytes)

    def sum(self) -> "Tensor":
        return Tensor(4)

    def item(self) -> float:
        return 0.0


def empty(*shape, dtype=float32, device=None) -> Tensor:
    count = 1
    for size in shape:
        count *= size
    return Tensor(count * _SIZES[dtype])


def randn(*shape, device=None) -> Tensor:
    return empty(*shape, dtype=float32)

"""Sleep and wake by tag (docs/sleep.md), for serving engines that give a model's GPU memory back
between jobs and bring it back without re-capturing CUDA graphs:

    with vramledger.tag("weights"): model = load_model()          # allocate under tags
    with vramledger.tag("kv_cache"): kv = allocate_kv_cache()
    vramledger.sleep(tags=["weights", "kv_cache", "graphs"], offload=["weights"])  # to the driver
    vramledger.wake()                                              # back, weights bitwise intact

"graphs" names every CUDA graph private pool (torch.cuda.graph, torch.compile(mode=
"reduce-overhead")): their memory goes back too and a captured graph replays bitwise the same
after the wake (VMM backend; docs/sleep.md).

While asleep every tensor pointer stays valid (its address stays reserved) but must not be used:
freeing a sleeping tensor or allocating under a sleeping tag raises. The functions reach
libvramledger_torch.so through ctypes, whether or not the _C extension was built.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Iterable, Optional


class _SleepResult(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "blocks", "bytes", "offloaded_bytes", "released_bytes", "mapped_bytes", "resident_bytes")]


@dataclass(frozen=True)
class SleepResult:
    """What one sleep() or wake() did. released_bytes: physical memory given back (sleep);
    mapped_bytes: block bytes given memory again (wake); resident_bytes: sleeping bytes left on pages shared with
    awake neighbours (sleep; at most a page at each end of a block)."""

    blocks: int
    bytes: int
    offloaded_bytes: int
    released_bytes: int
    mapped_bytes: int
    resident_bytes: int


class WakeOutOfMemoryError(RuntimeError):
    """wake() found too little free device memory. Nothing is lost: the tags stay asleep with
    their host copies; free memory and call wake() again."""


_lib: Optional[ctypes.CDLL] = None


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        from . import _native  # torch first, then the plugin the package uses
        from ._library import library_path

        _native()
        lib = ctypes.CDLL(library_path(), mode=ctypes.RTLD_GLOBAL)
        if not hasattr(lib, "vramledger_sleep"):
            raise RuntimeError("vramledger_sleep missing: the plugin predates sleep and wake; "
                               "reinstall vramledger")
        lib.vramledger_sleep.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                                         ctypes.POINTER(_SleepResult)]
        lib.vramledger_sleep.restype = ctypes.c_int
        lib.vramledger_wake.argtypes = [ctypes.c_int, ctypes.c_char_p,
                                        ctypes.POINTER(_SleepResult)]
        lib.vramledger_wake.restype = ctypes.c_int
        lib.vramledger_prepare_offload.argtypes = [ctypes.c_int, ctypes.c_char_p,
                                                   ctypes.POINTER(ctypes.c_uint64)]
        lib.vramledger_prepare_offload.restype = ctypes.c_int
        lib.vramledger_sleeping_tags.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.vramledger_sleeping_tags.restype = ctypes.c_size_t
        lib.vramledger_last_error.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def _names(tags: Optional[Iterable[str]], what: str) -> bytes:
    if tags is None:
        return b""
    if isinstance(tags, str):
        tags = [tags]
    names = list(tags)
    for name in names:
        if not isinstance(name, str) or not name or "," in name:
            raise ValueError(f"vramledger.{what}: tag names are non-empty strings without ',': "
                             f"{name!r}")
    return ",".join(names).encode()


def _result(code: int, out: _SleepResult) -> SleepResult:
    if code != 0:
        message = (_library().vramledger_last_error() or b"").decode("utf-8", "replace")
        if code == -2:
            raise WakeOutOfMemoryError(message)
        raise RuntimeError(message)
    return SleepResult(*(int(getattr(out, name)) for name, _ in _SleepResult._fields_))


def sleep(tags: Iterable[str], offload: Optional[Iterable[str]] = None,
          device: Any = None) -> SleepResult:
    """Gives the physical memory of every live allocation under `tags` back to the driver.

    Waits for the device first. Tags in `offload` (each also in `tags`) are copied to pinned host
    memory and restored by wake(); the others come back with undefined contents. The name
    "graphs" stands for every CUDA graph private pool of the device: all of their memory goes
    back and comes back at the same addresses (in `offload`: the graphs' live outputs too).
    Raises RuntimeError, changing nothing, for an unknown tag, a tag (or "graphs") already
    asleep, "graphs" on a backend without virtual memory, or a CUDA graph capture underway.
    """
    from . import _device_index

    out = _SleepResult()
    code = _library().vramledger_sleep(_device_index(device), _names(tags, "sleep"),
                                       _names(offload, "sleep"), ctypes.byref(out))
    return _result(code, out)


def wake(tags: Optional[Iterable[str]] = None, device: Any = None) -> SleepResult:
    """Brings sleeping tags back (all of them by default, "graphs" included) at the same addresses.

    Raises WakeOutOfMemoryError when the device has too little free memory (nothing lost; call
    again later) and RuntimeError for a tag that is not asleep.
    """
    from . import _device_index

    out = _SleepResult()
    code = _library().vramledger_wake(_device_index(device), _names(tags, "wake"),
                                      ctypes.byref(out))
    return _result(code, out)


def prepare_offload(tags: Iterable[str], device: Any = None) -> int:
    """Pins host memory now for offloading `tags` at the next sleep (each tag's allocated bytes)
    and keeps it, so that sleep pays only for the copy; pinning 8 GiB takes seconds. Call once at
    start-up, after loading the weights: `vramledger.prepare_offload(["weights"])`. Returns the
    bytes of host memory kept ready for these tags. VRAMLEDGER_SLEEP_PIN=register pins through
    huge pages faulted in parallel and cudaHostRegister instead of cudaHostAlloc."""
    from . import _device_index

    kept = ctypes.c_uint64()
    code = _library().vramledger_prepare_offload(_device_index(device),
                                                 _names(tags, "prepare_offload"),
                                                 ctypes.byref(kept))
    if code != 0:
        raise RuntimeError((_library().vramledger_last_error() or b"").decode("utf-8", "replace"))
    return int(kept.value)


def sleeping_tags(device: Any = None) -> list:
    """The tags asleep on `device`."""
    from . import _device_index

    lib = _library()
    index = _device_index(device)
    length = lib.vramledger_sleeping_tags(index, None, 0)
    buffer = ctypes.create_string_buffer(length + 1)
    lib.vramledger_sleeping_tags(index, buffer, length + 1)
    text = buffer.raw[:length].decode("utf-8", "replace")
    return [name for name in text.split(",") if name]

"""vramledger: a CUDA caching allocator for PyTorch with exact memory accounting.

    import torch, vramledger
    vramledger.install()                 # before the first CUDA allocation
    with vramledger.tag("weights"):
        model = Model().cuda()
    print(vramledger.stats()["reserved_bytes"]["all"]["current"])
    print(vramledger.report())

Once installed, torch's own APIs (torch.cuda.memory_stats, memory_reserved,
max_memory_allocated, reset_peak_memory_stats, empty_cache, memory_snapshot, CUDA graphs)
answer with vramledger's numbers. To run an unmodified program with it:

    vramledger run -- python app.py

The configuration string uses PYTORCH_CUDA_ALLOC_CONF syntax ("backend:vmm,cap_gb:40"); see
allocator/config.hpp for every key. It can also come from the VRAMLEDGER_CONF variable.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator, Optional

from ._library import library_path


def _native():
    """The native functions, loaded on first use: torch first, since importing torch loads the
    libc10 / libcudart our library links against (and keeps `vramledger run` quick to start).
    The _C extension when it was built, else the same functions through ctypes."""
    import torch

    _check_torch_release(torch.__version__)
    try:
        from . import _C
    except ImportError:
        from . import _ctypes_api as _C
    return _C


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def _check_torch_release(loaded: str) -> None:
    """Refuses, before loading any native code, a plugin built for another torch release: torch's
    allocator interface (a C++ vtable) differs between minor releases, so such a plugin would
    fail to load or call the wrong methods. _build_info is written by the build; a package
    without it (a build tree staged by the tests) is checked by the native install instead."""
    try:
        from ._build_info import TORCH_VERSION as built
    except ImportError:
        return
    if _major_minor(built) != _major_minor(loaded):
        raise ImportError(
            f"vramledger was built for torch {built} but torch {loaded} is imported; torch's "
            "allocator interface differs between releases. Rebuild it against this torch: "
            "pip install --no-build-isolation --force-reinstall <vramledger source>"
        )

__all__ = [
    "install",
    "is_installed",
    "stats",
    "all_stats",
    "used_devices",
    "flat_stats",
    "report",
    "process_report",
    "tag",
    "empty_cache",
    "reset_peak_stats",
    "reset_accumulated_stats",
    "library_path",
    "pluggable_allocator",
    "cluster_report",
    "sleep",
    "wake",
    "sleeping_tags",
    "prepare_offload",
    "graph_pools",
    "graph_memory_table",
    "SleepResult",
    "WakeOutOfMemoryError",
]

__version__ = "0.1.0"


def install(conf: Optional[str] = None) -> None:
    """Makes vramledger torch's CUDA allocator.

    Must run before anything allocates CUDA memory through torch; afterwards it raises
    RuntimeError saying so. Installing again with the same configuration does nothing.
    conf defaults to $VRAMLEDGER_CONF, else "" (all defaults).
    """
    if conf is None:
        conf = os.environ.get("VRAMLEDGER_CONF", "")
    _native().install(conf)
    _start_board()


def _start_board() -> None:
    """Publishes this process's figures on its GPUs' budget boards (docs/board.md) from a
    background thread, unless $VRAMLEDGER_BOARD is 0. Never fails the install."""
    if os.environ.get("VRAMLEDGER_BOARD", "1") == "0":
        return
    try:
        from .board.publisher import start_publishing

        start_publishing()
    except Exception as error:  # the board is an extra; the allocator works without it
        import sys

        print(f"vramledger: budget board not started: {error}", file=sys.stderr)


def cluster_report(format: str = "json", group: Any = None) -> Any:
    """Every rank's books in one document, gathered over torch.distributed (gloo or NCCL; a
    collective: call it on every rank). format: "json", "dict", "html" or "prometheus";
    docs/report_schema.md, "Cluster report"."""
    from .cluster import cluster_report as gather

    return gather(format=format, group=group)


def is_installed() -> bool:
    """True when vramledger is torch's current CUDA allocator."""
    return bool(_native().is_installed())


def _device_index(device: Any) -> int:
    import torch

    if device is None:
        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(f"vramledger: not a CUDA device: {device}")
        return device.index if device.index is not None else torch.cuda.current_device()
    raise TypeError(f"vramledger: cannot interpret {device!r} as a CUDA device")


def stats(device: Any = None) -> dict:
    """Every counter of one device as a nested dict.

    Keys follow torch.cuda.memory_stats: stats()["allocated_bytes"]["all"]["peak"], with
    "all", "small_pool" and "large_pool" under each, plus counters torch lacks (mapped_bytes,
    virtual_bytes, physical_bytes, allocated_requested_bytes), "fragmentation" figures and
    per-tag usage under "tags". A device vramledger never used reports zeros.
    """
    return json.loads(_native().stats_json(_device_index(device)))


def all_stats() -> list:
    """stats() of every device vramledger used."""
    return json.loads(_native().stats_json(-1))


def flat_stats(device: Any = None) -> dict:
    """stats() flattened like torch.cuda.memory_stats: {"allocated_bytes.all.current": ...}."""
    result: dict = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else key, item)
        else:
            result[prefix] = value

    walk("", stats(device))
    return result


def report() -> str:
    """A text account of every device: reserved memory broken into lines that add up."""
    return _native().report()


def process_report(device: Any = None, format: str = "text") -> str:
    """This process's memory on one device, split into lines that add up exactly.

    torch's lines (live requested, rounding, pending frees, cached usable, fragmentation,
    unmapped physical) from vramledger's ledger, one line per library when the LD_PRELOAD shim
    is loaded (`vramledger run --track-non-torch`), and the remainder (CUDA context, modules,
    driver), summing to NVML's per-process used memory; other processes shown apart, a
    negative remainder reported as MISSING HOOK. Without NVML per-process data the figures fall
    back to the device's used memory, with a CAVEAT line (docs/classification.md).

    format: "text", or "json" (a str holding the document of docs/report_schema.md, "Process
    report"; json.loads it).
    """
    if format not in ("text", "json"):
        raise ValueError(f"vramledger.process_report: format must be 'text' or 'json', not {format!r}")
    return _native().process_report(_device_index(device), format)


def used_devices() -> list:
    """Indices of the CUDA devices vramledger has allocated on in this process."""
    return [entry["device"] for entry in all_stats()]


def empty_cache() -> None:
    """Returns cached memory to the device (torch.cuda.empty_cache does the same once installed)."""
    _native().empty_cache()


def reset_peak_stats(device: Any = None) -> None:
    _native().reset_peak_stats(_device_index(device))


def reset_accumulated_stats(device: Any = None) -> None:
    _native().reset_accumulated_stats(_device_index(device))


@contextlib.contextmanager
def tag(name: str) -> Iterator[None]:
    """Counts the CUDA allocations this thread makes inside the block under `name`.

    Tags nest; the innermost wins. They are per thread: work torch runs on its own threads (the
    autograd engine's backward pass) is not tagged by a scope opened on the main thread.
    """
    _native().tag_push(name)
    try:
        yield
    finally:
        _native().tag_pop()


def sleep(tags: Any, offload: Any = None, device: Any = None) -> Any:
    """Gives the memory of the live allocations under `tags` back to the driver; `offload` tags
    are kept in pinned host memory and restored by wake(). docs/sleep.md, vramledger.sleep_wake."""
    from . import sleep_wake as _sleep

    return _sleep.sleep(tags, offload, device)


def wake(tags: Any = None, device: Any = None) -> Any:
    """Brings sleeping tags (all by default) back at the same addresses. docs/sleep.md."""
    from . import sleep_wake as _sleep

    return _sleep.wake(tags, device)


def sleeping_tags(device: Any = None) -> list:
    from . import sleep_wake as _sleep

    return _sleep.sleeping_tags(device)


def prepare_offload(tags: Any, device: Any = None) -> int:
    """Pins host memory now for the next sleep's offload of `tags` (call once at start-up, after
    loading the weights), so that sleep pays only for the copy. Returns the bytes kept ready."""
    from . import sleep_wake as _sleep

    return _sleep.prepare_offload(tags, device)


def graph_pools(device: Any = None) -> list:
    """Each private pool's (CUDA graph, MemPool) reserved / live / cached / fragmentation bytes,
    exact. docs/graphs.md, vramledger.graph_memory."""
    from . import graph_memory as _graphs

    return _graphs.graph_pools(device)


def graph_memory_table(capture_fn: Any, batch_sizes: Any, device: Any = None,
                       shared: bool = True, warmup: int = 1, stream: Any = None) -> Any:
    """Captures capture_fn(batch_size) for each size, measures the graphs' pools and gives them
    back: `table.total_bytes` is what the captures will hold, known before sizing a KV cache.
    stream: the engine's capture stream (default torch.cuda.graph's). docs/graphs.md."""
    from . import graph_memory as _graphs

    return _graphs.graph_memory_table(capture_fn, batch_sizes, device, shared, warmup, stream)


def __getattr__(name: str) -> Any:
    # SleepResult and WakeOutOfMemoryError live in vramledger.sleep_wake (imported on first use).
    if name in ("SleepResult", "WakeOutOfMemoryError"):
        from . import sleep_wake as _sleep

        return getattr(_sleep, name)
    raise AttributeError(f"module 'vramledger' has no attribute {name!r}")


def pluggable_allocator() -> Any:
    """vramledger's malloc/free as a torch.cuda.memory.CUDAPluggableAllocator.

    For torch.cuda.MemPool(allocator=...) or change_current_allocator. With a pluggable allocator
    torch's own statistics are unavailable; read vramledger.stats() instead. Prefer install().
    """
    import torch

    return torch.cuda.memory.CUDAPluggableAllocator(
        library_path(), "vramledger_malloc", "vramledger_free"
    )

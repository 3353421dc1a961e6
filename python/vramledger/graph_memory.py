"""CUDA-graph memory known before it is needed (issue 17, part 3; docs/graphs.md).

An engine sizes its KV cache before capturing its CUDA graphs, so it has to know what the graphs
will take. vramledger counts every private pool's blocks, so it can measure that instead of
guessing:

    table = vramledger.graph_memory_table(lambda n: model(inputs[:n]), batch_sizes=[1, 2, 4, 8])
    kv_cache_bytes = budget_bytes - table.total_bytes          # what the captures will hold

graph_memory_table captures each batch size (after a warm-up, on a side stream, as torch asks),
reads the pool's figures, and gives all of it back before returning. `graph_pools()` reads the
same figures for the pools that exist now (after an engine's own captures). Each figure is the
pool's census, exact: reserved = live + cached.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, List, Optional, Tuple

GIB = 1 << 30


@dataclass(frozen=True)
class GraphPool:
    """One private pool (a CUDA graph pool or a torch.cuda.MemPool) at one instant.

    reserved_bytes: device memory the pool holds; live_bytes: its allocated blocks (graph
    outputs and intermediates kept alive); cached_bytes: its free blocks (a replay writes its
    temporaries there, so they stay while the graph lives); fragmentation_bytes: cached bytes
    outside the largest free block of their size class. sleepable: a CUDA graph pool that
    sleep(tags=["graphs"]) puts to sleep (docs/sleep.md); asleep: it sleeps now (reserved_bytes
    0, its live blocks' bytes in sleeping_bytes)."""

    id: Tuple[int, int]
    use_count: int
    segments: int
    blocks: int
    reserved_bytes: int
    live_bytes: int
    requested_bytes: int
    cached_bytes: int
    largest_free_bytes: int
    fragmentation_bytes: int
    sleepable: bool = False
    asleep: bool = False
    sleeping_bytes: int = 0

    @classmethod
    def from_json(cls, pool: dict) -> "GraphPool":
        """From one object of vramledger_graph_pools(); keys a newer plugin adds are ignored."""
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{key: value for key, value in dict(pool, id=tuple(pool["id"])).items()
                      if key in known})


def graph_pools(device: Any = None) -> List[GraphPool]:
    """Every private pool of `device` (live, or released by torch and not yet emptied)."""
    from . import _device_index
    from .sleep_wake import _library

    lib = _library()
    if not hasattr(lib, "vramledger_graph_pools"):
        raise RuntimeError("vramledger_graph_pools missing: the plugin predates graph pool "
                           "figures; reinstall vramledger")
    lib.vramledger_graph_pools.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.vramledger_graph_pools.restype = ctypes.c_size_t
    index = _device_index(device)
    length = lib.vramledger_graph_pools(index, None, 0)
    buffer = ctypes.create_string_buffer(length + 1)
    lib.vramledger_graph_pools(index, buffer, length + 1)
    pools = json.loads(buffer.raw[:length].decode() or "[]")
    return [GraphPool.from_json(pool) for pool in pools]


@dataclass(frozen=True)
class GraphMemoryRow:
    """One batch size: its pool's figures when captured alone, and (shared_reserved_bytes) the
    shared pool's reserved bytes once this and every earlier size of the table were captured
    into it."""

    batch_size: Any
    reserved_bytes: int
    live_bytes: int
    cached_bytes: int
    fragmentation_bytes: int
    shared_reserved_bytes: Optional[int] = None


@dataclass
class GraphMemoryTable:
    """What graph_memory_table measured. total_bytes is the figure to keep free for the
    captures: the shared pool's reserved bytes (all sizes in one pool, in the order given, as
    engines capture them), or the sum of the separate pools when shared=False."""

    rows: List[GraphMemoryRow]
    shared: bool
    total_bytes: int
    released: bool  # every pool the measurement made was given back
    notes: List[str] = field(default_factory=list)

    def row(self, batch_size: Any) -> GraphMemoryRow:
        for row in self.rows:
            if row.batch_size == batch_size:
                return row
        raise KeyError(f"batch size {batch_size!r} was not measured")

    def log_lines(self) -> List[str]:
        lines = [f"CUDA graphs: {self.total_bytes / GIB:.4f} GiB for batch sizes "
                 f"{[row.batch_size for row in self.rows]} "
                 f"({'one shared pool' if self.shared else 'one pool each'})"]
        for row in self.rows:
            shared = "" if row.shared_reserved_bytes is None else \
                f"; shared pool {row.shared_reserved_bytes / GIB:.4f} GiB"
            lines.append(f"  batch {row.batch_size}: reserved {row.reserved_bytes / GIB:.4f} "
                         f"GiB (live {row.live_bytes / GIB:.4f}, cached "
                         f"{row.cached_bytes / GIB:.4f}, fragmentation "
                         f"{row.fragmentation_bytes / GIB:.4f}){shared}")
        return lines + [f"  note: {note}" for note in self.notes]


def _pool_of(handle: Any, device: Any) -> Optional[GraphPool]:
    for pool in graph_pools(device):
        if pool.id == tuple(handle):
            return pool
    return None


def _capture(torch: Any, capture_fn: Callable[[Any], Any], batch_size: Any, pool: Any,
             warmup: int, stream: Any) -> Tuple[Any, Any]:
    graph = torch.cuda.CUDAGraph()
    capture = torch.cuda.graph(graph, pool=pool, stream=stream)
    # Warm up outside the capture on the capture stream itself (a side stream, as torch asks):
    # torch gives each stream its own cuBLAS workspace (32 MiB on Hopper) the first time a matmul
    # runs there, and one made inside a capture would live in the graph's pool for good.
    capture_stream = capture.capture_stream
    capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture_stream):
        for _ in range(warmup):
            capture_fn(batch_size)
    torch.cuda.current_stream().wait_stream(capture_stream)
    with capture:
        output = capture_fn(batch_size)
    torch.cuda.synchronize()
    return graph, output


def graph_memory_table(capture_fn: Callable[[Any], Any], batch_sizes: Iterable[Any],
                       device: Any = None, shared: bool = True,
                       warmup: int = 1, stream: Any = None) -> GraphMemoryTable:
    """Captures capture_fn(batch_size) for each batch size, measures each graph's pool, and gives
    every graph and pool back before returning (the engine then sizes its KV cache and captures
    for real). Each size is captured alone in its own pool (the rows); with `shared`, also all
    sizes into one pool in the order given (vLLM captures largest first), whose reserved bytes
    are total_bytes. capture_fn must only read its inputs (they are made before the call).
    stream: the stream the engine will capture on (default: torch.cuda.graph's own capture
    stream); the warm-up runs there, so per-stream state such as the cuBLAS workspace exists
    before the captures and is counted in neither the table nor the engine's pools."""
    import torch

    from . import empty_cache

    sizes = list(batch_sizes)
    if not sizes:
        raise ValueError("graph_memory_table: no batch size given")
    rows = []
    for size in sizes:
        handle = torch.cuda.graph_pool_handle()
        graph, output = _capture(torch, capture_fn, size, handle, warmup, stream)
        pool = _pool_of(handle, device)
        if pool is None:
            raise RuntimeError(f"graph_memory_table: the pool of batch size {size!r} is not "
                               f"listed (is vramledger torch's allocator? vramledger.install())")
        rows.append(GraphMemoryRow(size, pool.reserved_bytes, pool.live_bytes, pool.cached_bytes,
                                   pool.fragmentation_bytes))
        del graph, output
    total = sum(row.reserved_bytes for row in rows)
    if shared:
        handle = torch.cuda.graph_pool_handle()
        kept = []
        for i, size in enumerate(sizes):
            kept.append(_capture(torch, capture_fn, size, handle, warmup, stream))
            pool = _pool_of(handle, device)
            rows[i] = replace(rows[i], shared_reserved_bytes=pool.reserved_bytes)
        total = rows[-1].shared_reserved_bytes
        del kept
    torch.cuda.synchronize()
    empty_cache()  # pools torch released are emptied and destroyed
    left = [pool for pool in graph_pools(device) if pool.use_count == 0]
    notes = [f"{len(left)} released pool(s) still hold {sum(p.reserved_bytes for p in left)} "
             f"bytes"] if left else []
    return GraphMemoryTable(rows=rows, shared=shared, total_bytes=total, released=not left,
                            notes=notes)

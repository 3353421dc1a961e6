"""The allocator configurations the end-to-end comparison runs (compare_allocators.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional


@dataclass(frozen=True)
class Allocator:
    name: str
    description: str
    env: Dict[str, str] = field(default_factory=dict)
    vramledger_conf: Optional[str] = None      # install() argument; None: not vramledger
    expected_backend: str = "native"          # torch.cuda.memory.get_allocator_backend()


NATIVE_AGAIN = "native-again"
ALLOCATORS: Dict[str, Allocator] = {a.name: a for a in [
    Allocator("native", "PyTorch caching allocator, default settings"),
    # The A/A control: native once more, run after the other allocators (before them with
    # --native-last), so that the others run between two natives. Its paired step ratio
    # against native is the measurement's own noise and position effect, and the mean of the
    # two natives is the reference that cancels a linear drift (ABA).
    Allocator(NATIVE_AGAIN, "PyTorch caching allocator, default settings, run again (A/A "
              "control)"),
    Allocator("expandable", "PyTorch, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
              env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    Allocator("malloc_async", "PyTorch, PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync",
              env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
              expected_backend="cudaMallocAsync"),
    Allocator("vramledger", 'vramledger.install("backend:vmm")', vramledger_conf="backend:vmm",
              expected_backend="vramledger"),
    Allocator("vramledger-pages", 'vramledger.install("backend:vmm,map_chunk_mb:2")',
              vramledger_conf="backend:vmm,map_chunk_mb:2", expected_backend="vramledger"),
    # The physical chunks of the default until 2026-12-02 (4 MiB since; docs/configuration.md).
    Allocator("vramledger-chunk16", 'vramledger.install("backend:vmm,map_chunk_mb:16")',
              vramledger_conf="backend:vmm,map_chunk_mb:16", expected_backend="vramledger"),
    # Half the default cross-stream slack: <= 1.01 on every replayed trace, to be measured here.
    Allocator("vramledger-slack05",
              'vramledger.install("backend:vmm,cross_stream_slack_permille:5")',
              vramledger_conf="backend:vmm,cross_stream_slack_permille:5",
              expected_backend="vramledger"),
    Allocator("vramledger-noslack", 'vramledger.install("backend:vmm,cross_stream_slack_pct:0")',
              vramledger_conf="backend:vmm,cross_stream_slack_pct:0", expected_backend="vramledger"),
    Allocator("vramledger-nostreamorder",
              'vramledger.install("backend:vmm,alias_pending_pages:false,adopt_pending_frees:false")',
              vramledger_conf="backend:vmm,alias_pending_pages:false,adopt_pending_frees:false",
              expected_backend="vramledger"),
    Allocator("vramledger-placed",
              'vramledger.install("backend:vmm,place_by_mapped_pages:true")',
              vramledger_conf="backend:vmm,place_by_mapped_pages:true",
              expected_backend="vramledger"),
    # Moves unmapped in place before the map, as before unmap_in_background (2026-12-03).
    Allocator("vramledger-unmapinplace",
              'vramledger.install("backend:vmm,unmap_in_background:false")',
              vramledger_conf="backend:vmm,unmap_in_background:false",
              expected_backend="vramledger"),
    # Per-thread front caches (docs/configuration.md): the latency option, measured end to end
    # before it can be a default; parked blocks go back before the heap grows (2026-12-04).
    Allocator("vramledger-front",
              'vramledger.install("backend:vmm,front_cache_mb:256")',
              vramledger_conf="backend:vmm,front_cache_mb:256",
              expected_backend="vramledger"),
    Allocator("vramledger-cuda_malloc", 'vramledger.install("backend:cuda_malloc")',
              vramledger_conf="backend:cuda_malloc", expected_backend="vramledger"),
]}
REFERENCE = "native"
QUICK_ALLOCATORS = ["native", "expandable", "vramledger"]


def is_vramledger(allocator: str) -> bool:
    return ALLOCATORS[allocator].vramledger_conf is not None


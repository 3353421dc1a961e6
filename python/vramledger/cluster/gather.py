"""vramledger.cluster_report(): every rank's books in one document, over the job's own
torch.distributed process group (gloo or NCCL; all_gather_object, so every rank gets it).

Collective: every rank of the group must call it, like any torch.distributed call. The documents
travel as JSON bytes in uint8 tensors (two all_gathers: lengths, then the padded bytes), not as
pickles: unpickling what another process sent can run its code, and all_gather_object also needs
numpy. With NCCL the tensors live on the current CUDA device (torch.cuda.set_device first, as for
any NCCL collective); the documents are a few KB per rank.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Optional

from .document import assemble, local_rank_document

FORMATS = ("json", "dict", "html", "prometheus")


def cluster_report(format: str = "json", group: Any = None,
                   local: Optional[Callable[[int, int], Dict[str, Any]]] = None) -> Any:
    """The cluster document (docs/report_schema.md, "Cluster report") on every rank.

    format: "json" (str), "dict", "html" (a self-contained page: per-rank table, timeline of the
    rank with the highest peak) or "prometheus" (text exposition labelled by rank and device).
    local: (rank, world_size) -> this rank's document; default: vramledger's own books.
    """
    if format not in FORMATS:
        raise ValueError(f"vramledger.cluster_report: format must be one of {FORMATS}, "
                         f"not {format!r}")
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("vramledger.cluster_report: torch.distributed is not initialised "
                           "(call torch.distributed.init_process_group first; "
                           "process_report() gives this process alone)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    mine = (local or local_rank_document)(rank, world)
    backend = str(dist.get_backend(group))
    document = assemble(_all_gather_json(mine, world, backend, group), backend)
    if format == "dict":
        return document
    if format == "json":
        return json.dumps(document, indent=1)
    if format == "html":
        from .html import to_html

        return to_html(document)
    from .prometheus import to_prometheus

    return to_prometheus(document)


def _all_gather_json(mine: Dict[str, Any], world: int, backend: str, group: Any) -> list:
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    data = json.dumps(mine).encode("utf-8")
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    lengths = [torch.empty_like(length) for _ in range(world)]
    dist.all_gather(lengths, length, group=group)
    longest = max(int(entry.item()) for entry in lengths)
    buffer = torch.zeros(longest, dtype=torch.uint8, device=device)
    buffer[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    buffers = [torch.empty_like(buffer) for _ in range(world)]
    dist.all_gather(buffers, buffer, group=group)
    return [json.loads(bytes(entry[:int(size.item())].cpu().tolist()).decode("utf-8"))
            for entry, size in zip(buffers, lengths)]

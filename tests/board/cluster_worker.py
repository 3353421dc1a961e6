"""One rank of the cluster-report test: joins a gloo group through a file store, builds its
document from made-up but well-shaped books (stats as vramledger.stats() gives them, a process
report as docs/report_schema.md describes it, publisher samples), and calls
vramledger.cluster.cluster_report in every format. Writes what it got to OUT/rank<R>.json.

    python cluster_worker.py RANK WORLD STORE_FILE OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
warnings.filterwarnings("ignore")  # torch without numpy says so at import

from vramledger.cluster import cluster_report, device_entry, rank_document  # noqa: E402

MIB = 1 << 20


def books(rank: int) -> tuple:
    """Rank r holds (r + 1) GiB live; rank 2's peak is the highest (a skewed pipeline stage)."""
    live = (rank + 1) << 30
    reserved = live + 64 * MIB
    peak = reserved + (5 << 30 if rank == 2 else 0)

    def stat(current: int, peak_value: int) -> dict:
        entry = {"current": current, "peak": peak_value, "allocated": 0, "freed": 0}
        return {"all": entry, "small_pool": dict(entry), "large_pool": dict(entry)}

    stats = {"device": 0, "allocated_bytes": stat(live, live), "reserved_bytes":
             stat(reserved, peak), "num_ooms": rank, "num_alloc_retries": 0,
             "fragmentation": {"gmlake_ratio": 0.01 * rank, "overhead_ratio": 1.02}}
    torch_lines = {"requested": live - 1000, "rounding": 1000, "pending_frees": 0,
                   "cached_usable": 64 * MIB, "fragmentation": 0, "unmapped_physical": 0,
                   "reserved": reserved}
    nccl = 300 * MIB + rank
    context = 519 * MIB
    lines = [{"kind": "torch", "name": f"torch {name}", "bytes": torch_lines[name]}
             for name in ("requested", "rounding", "pending_frees", "cached_usable",
                          "fragmentation", "unmapped_physical")]
    lines += [{"kind": "non_torch", "name": "non-torch: nccl", "bytes": nccl},
              {"kind": "remainder", "name": "context, modules, driver", "bytes": context}]
    report = {"basis": "nvml_per_process", "device_total_bytes": 143_771 * MIB, "lines": lines,
              "process_usage_bytes": reserved + nccl + context, "torch": torch_lines,
              "non_torch": {"tracked_total": nccl, "by_library": {"nccl": nccl}},
              "remainder": {"label": "context, modules, driver", "bytes": context}}
    timeline = [[1_000_000_000 * i, reserved + nccl + context, reserved, live] for i in range(5)]
    return stats, report, timeline


def main() -> int:
    import torch.distributed as dist  # here: test_cluster.py imports books() without torch

    rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)

    def local(my_rank: int, world_size: int) -> dict:
        assert (my_rank, world_size) == (rank, world)
        return rank_document(my_rank, world_size, [device_entry(*books(my_rank))])

    got = {"dict": cluster_report(format="dict", local=local),
           "json": cluster_report(format="json", local=local),
           "html": cluster_report(format="html", local=local),
           "prometheus": cluster_report(format="prometheus", local=local)}
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(got, handle)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""One rank of the GPU cluster-report check (run_board_gpu.py, scenarios cluster2/cluster4):
vramledger installed, (rank + 1) GiB held on cuda:0 (the last rank also peaks 2 GiB higher
once), the board publisher sampling, then vramledger.cluster_report() over gloo (several ranks
share the one GPU; NCCL refuses two ranks on one device) in every format. Rank 0 writes the
documents to OUT; every rank prints `RESULT {json}` with NVML's per-process figure, read
independently right after its own document was taken.

    python cluster_rank.py RANK WORLD STORE_FILE OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "classification_gpu"))
GIB = 1 << 30


def main() -> int:
    rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    import torch
    import torch.distributed as dist

    import vramledger
    from _common import Nvml, cuda_pci_bus_id
    from vramledger.cluster import local_rank_document

    vramledger.install()
    torch.cuda.set_device(0)
    held = torch.empty((rank + 1) * GIB, dtype=torch.uint8, device="cuda")
    if rank == world - 1:
        spike = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda")
        del spike
    nvml = Nvml(cuda_pci_bus_id(0))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    time.sleep(1.2)  # a few of the publisher's samples (every 0.2 s here) for the timeline
    mine = {}

    def local(my_rank: int, world_size: int) -> dict:
        document = local_rank_document(my_rank, world_size)
        mine["nvml"] = nvml.process_used()  # right after: nothing allocates in between
        return document

    documents = {"dict": vramledger.cluster.cluster_report(format="dict", local=local)}
    mine["doc_nvml"] = mine["nvml"]
    documents["html"] = vramledger.cluster_report(format="html")
    documents["prometheus"] = vramledger.cluster_report(format="prometheus")
    if rank == 0:
        with open(os.path.join(out, f"cluster{world}.json"), "w", encoding="utf-8") as handle:
            json.dump(documents["dict"], handle, indent=1)
        with open(os.path.join(out, f"cluster{world}.html"), "w", encoding="utf-8") as handle:
            handle.write(documents["html"])
        with open(os.path.join(out, f"cluster{world}.prom"), "w", encoding="utf-8") as handle:
            handle.write(documents["prometheus"])
    print("RESULT " + json.dumps({"rank": rank, "pid": os.getpid(), "nvml": mine["doc_nvml"],
                                  "html_has_timeline": "<polyline" in documents["html"],
                                  "prometheus_ranks": documents["prometheus"].count(
                                      "vramledger_rank_up{")}), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    del held
    return 0


if __name__ == "__main__":
    sys.exit(main())

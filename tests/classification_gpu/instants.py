#!/usr/bin/env python3
"""Checks 1 and 3 (docs/classification.md, "Checks still to run on the H200"): the process
report is exact at every instant of a real workload, with and without the LD_PRELOAD shim.

    python tests/classification_gpu/instants.py [--out DIR]

Two fresh workers run the same workload (cuBLAS matmuls, a CUDA graph captured and replayed,
raw cudaMalloc/cudaFree of known sizes through ctypes, NCCL with world size 1 over a TCP
rendezvous on a free port, torch allocations and empty_cache):

  shim      `vramledger run --track-non-torch` (the shim attributes non-torch memory by library)
  no_shim   `vramledger run --no-track-non-torch` (non-torch memory is inside the remainder)

At every instant (>= 20) the worker takes vramledger.process_report(format="json") bracketed by
two reads of NVML of our own (ctypes, not the plugin's code). Asserted at every instant:
Σ lines == process usage == NVML's per-process figure for our PID (exact), basis
nvml_per_process, every line >= 0, no missing_hook, no problems, non_torch.hooked as the
variant says. Around each raw cudaMalloc of S bytes (nothing else happening): process usage and
non-torch bytes grow by exactly S rounded up to 2 MiB and torch's reserved does not move;
without the shim the remainder grows by exactly that; with it the tracked libraries grow by
exactly S and the remainder by the rounding. Frees give it all back. Check 1: at the first
instant (context just created) process usage is present and within 0.4-1 GiB (printed).
Without a GPU: "skipped: no GPU", exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import DRIVER_GRANULE, GIB, MIB, Outcome, round_up  # noqa: E402

CHECK = "instants"
# Sizes not multiples of the granule, all above it (smaller ones share the driver's pages).
RAW_SIZES = (3 * MIB + 5, 6 * MIB + 4096, 34 * MIB + 1, 128 * MIB)
MIN_INSTANTS = 20
CONTEXT_RANGE = (0.4 * GIB, 1.0 * GIB)


def worker(variant: str) -> int:
    import datetime

    import torch
    import torch.distributed as dist

    import vramledger

    assert vramledger.is_installed(), "vramledger run did not install vramledger"
    torch.cuda.synchronize()  # creates the context; nothing allocated by torch yet
    nvml = _common.Nvml(_common.cuda_pci_bus_id(torch.cuda.current_device()))
    instants: List[Dict[str, Any]] = []
    raw_events: List[Dict[str, Any]] = []

    def instant(label: str) -> int:
        """One report, bracketed by our own NVML reads (retried until they agree)."""
        for _ in range(5):
            torch.cuda.synchronize()
            before = nvml.process_used()
            report = json.loads(vramledger.process_report(format="json"))
            after = nvml.process_used()
            if before == after:
                break
        device_used, device_total = nvml.device_used_total()
        instants.append({
            "label": label, "nvml_before": before, "nvml_after": after,
            "nvml_device_used": device_used, "nvml_device_total": device_total,
            "basis": report["basis"], "source": report["process_memory_source"],
            "lines": report["lines"], "sum_bytes": report["sum_bytes"],
            "process_usage_bytes": report["process_usage_bytes"],
            "non_torch_bytes": report["non_torch_bytes"],
            "reserved": report["torch"]["reserved"],
            "remainder": report["remainder"]["bytes"],
            "hooked": report["non_torch"]["hooked"],
            "tracked_total": report["non_torch"]["tracked_total"],
            "by_library": report["non_torch"]["by_library"],
            "all_lines_non_negative": report["all_lines_non_negative"],
            "missing_hook": report["missing_hook"], "problems": report["problems"],
            "notes": report["notes"],
        })
        return len(instants) - 1

    instant("context created")
    x = torch.randn(2048, 2048, device="cuda")
    instant("first torch tensor")
    y = x @ x  # cuBLAS: handle and workspace
    instant("cuBLAS matmul fp32")
    z = (x.half() @ x.half()).float()
    instant("cuBLAS matmul fp16")

    raw = _common.RawCuda()
    for size in RAW_SIZES:  # one alloc, then its free, each between two instants
        start = instant(f"before raw {size}")
        address = raw.alloc(size)
        allocated = instant(f"after raw alloc {size}")
        raw.free(address)
        freed = instant(f"after raw free {size}")
        raw_events.append({"size": size, "before": start, "after_alloc": allocated,
                           "after_free": freed})
    held = [raw.alloc(size) for size in RAW_SIZES]
    instant("raw allocations held")

    static_in = torch.randn(1024, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            static_out = torch.relu(static_in @ static_in)
    torch.cuda.current_stream().wait_stream(side)
    instant("graph warm-up")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = torch.relu(static_in @ static_in)
    instant("graph captured")
    for _ in range(3):
        static_in.normal_()
        graph.replay()
    instant("graph replayed")

    port = _common.free_port()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=60),
                            device_id=torch.device("cuda", torch.cuda.current_device()))
    instant("NCCL process group")
    total = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(total)
    instant("NCCL all_reduce")
    gathered = [torch.empty_like(total)]
    dist.all_gather(gathered, total)
    instant("NCCL all_gather")

    big = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in (7 * MIB + 3, 300 * MIB)]
    instant("torch allocations")
    del big, y, z
    instant("torch frees (cached)")
    for address in held:
        raw.free(address)
    instant("raw allocations freed")
    torch.cuda.empty_cache()
    instant("empty_cache")
    del graph, static_out
    torch.cuda.empty_cache()
    instant("graph released")
    dist.destroy_process_group()
    instant("NCCL destroyed")
    _common.emit({"variant": variant, "raw_via": raw.via, "instants": instants,
                  "raw_events": raw_events})
    return 0


def analyse(result: Dict[str, Any], outcome: Outcome) -> None:
    """The assertions on one worker's RESULT (pure: test_offline.py feeds it made-up data)."""
    variant = result["variant"]
    shim = variant == "shim"
    instants = result["instants"]
    prefix = f"{variant}: "
    outcome.expect(len(instants) >= MIN_INSTANTS,
                   f"{prefix}{len(instants)} instants, fewer than {MIN_INSTANTS}")
    worst_nvml_gap = 0
    for at in instants:
        where = f"{prefix}instant '{at['label']}'"
        lines_sum = sum(int(line["bytes"]) for line in at["lines"])
        outcome.expect(lines_sum == at["process_usage_bytes"] == at["sum_bytes"],
                       f"{where}: Σ lines {lines_sum} != process usage "
                       f"{at['process_usage_bytes']}")
        outcome.expect(at["basis"] == "nvml_per_process" and at["source"] == "nvml",
                       f"{where}: basis {at['basis']} from {at['source']}")
        if at["nvml_before"] == at["nvml_after"]:
            gap = at["process_usage_bytes"] - (at["nvml_before"] or 0)
            worst_nvml_gap = max(worst_nvml_gap, abs(gap))
            outcome.expect(gap == 0, f"{where}: process usage {at['process_usage_bytes']} != "
                                     f"NVML (read here) {at['nvml_before']}")
        else:
            outcome.notes.append(f"{where}: NVML moved during the report "
                                 f"({at['nvml_before']} -> {at['nvml_after']}); not compared")
        negative = [line for line in at["lines"] if int(line["bytes"]) < 0]
        outcome.expect(not negative and at["all_lines_non_negative"],
                       f"{where}: negative lines {negative}")
        outcome.expect(at["missing_hook"] is None, f"{where}: {at['missing_hook']}")
        outcome.expect(not at["problems"], f"{where}: problems {at['problems']}")
        outcome.expect(at["hooked"] == shim, f"{where}: non_torch.hooked is {at['hooked']}")
    outcome.figures[f"{variant}: instants"] = (
        f"{len(instants)}; max |process usage - NVML| {worst_nvml_gap} B")

    for event in result["raw_events"]:
        size = event["size"]
        rounded = round_up(size, DRIVER_GRANULE)
        before, after, freed = (instants[event[k]] for k in ("before", "after_alloc", "after_free"))
        grew = {key: after[key] - before[key]
                for key in ("process_usage_bytes", "non_torch_bytes", "reserved", "remainder",
                            "tracked_total")}
        back = {key: freed[key] - before[key] for key in grew}
        where = f"{prefix}raw {size} B (rounded {rounded})"
        outcome.figures[where] = (f"usage +{grew['process_usage_bytes']}, remainder "
                                  f"+{grew['remainder']}, tracked +{grew['tracked_total']}; "
                                  f"after free {back['process_usage_bytes']:+d}")
        outcome.expect(grew["reserved"] == 0, f"{where}: torch reserved moved {grew['reserved']}")
        outcome.expect(grew["process_usage_bytes"] == rounded,
                       f"{where}: process usage grew {grew['process_usage_bytes']}, not {rounded}")
        outcome.expect(grew["non_torch_bytes"] == rounded,
                       f"{where}: non-torch bytes grew {grew['non_torch_bytes']}, not {rounded}")
        if shim:
            outcome.expect(grew["tracked_total"] == size,
                           f"{where}: the shim's libraries grew {grew['tracked_total']}, not {size}")
            outcome.expect(grew["remainder"] == rounded - size,
                           f"{where}: remainder grew {grew['remainder']}, not {rounded - size}")
        else:
            outcome.expect(grew["remainder"] == rounded,
                           f"{where}: remainder grew {grew['remainder']}, not {rounded}")
        outcome.expect(all(v == 0 for v in back.values()),
                       f"{where}: not all given back after cudaFree: {back}")

    first = instants[0] if instants else None
    if first is not None:
        usage = first["process_usage_bytes"]
        outcome.figures[f"{variant}: check 1, process usage right after init"] = (
            f"{usage} B ({usage / MIB:.1f} MiB); torch reserved {first['reserved']} B; "
            f"device used (NVML) {first['nvml_device_used']} B")
        outcome.expect(CONTEXT_RANGE[0] <= usage <= CONTEXT_RANGE[1],
                       f"{prefix}check 1: process usage after init {usage} B outside "
                       f"0.4-1 GiB")
    if shim and instants:
        outcome.figures["shim: libraries at 'NCCL all_gather'"] = next(
            (at["by_library"] for at in instants if at["label"] == "NCCL all_gather"), {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("main", "worker"), default="main")
    parser.add_argument("--variant", choices=("shim", "no_shim"), default="no_shim")
    parser.add_argument("--out", default=None)
    parser.add_argument("--timeout", type=float, default=60.0, help="per worker, seconds")
    args = parser.parse_args()
    if args.role == "worker":
        return worker(args.variant)

    _common.skip_without_gpu(CHECK)
    folder = _common.out_dir(args.out, CHECK)
    outcome = Outcome(CHECK)
    for variant, track in (("shim", True), ("no_shim", False)):
        command = _common.vramledger_run(os.path.abspath(__file__),
                                         ["--role", "worker", "--variant", variant],
                                         track_non_torch=track)
        result, why = _common.run_worker(command, args.timeout,
                                         os.path.join(folder, f"worker-{variant}.log"),
                                         env=_common.worker_env(),
                                         result_path=os.path.join(folder, f"{variant}.json"))
        if result is None:
            outcome.failures.append(f"worker {variant}: {why} (see worker-{variant}.log)")
            continue
        analyse(result, outcome)
    outcome.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

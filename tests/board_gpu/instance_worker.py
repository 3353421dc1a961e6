#!/usr/bin/env python3
"""One engine instance of the H200 board check (run_board_gpu.py drives it over stdin/stdout).

It installs vramledger (the board publisher starts with it), loads a "model" (uint8 tensors of
the chosen size, written so the pages are real), profiles a forward pass (activations and a
matmul) with vramledger.profiling fed by NVML, decides its KV cache with the board, allocates
it, and reports: its decision, what vLLM's formula gives in the same run at the same instant,
and its books against NVML's per-process figure read independently (ctypes).

Lines out: `<TAG> {json}`; lines in: commands the driver sends when every instance got there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from fractions import Fraction

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "classification_gpu"))

GIB = 1 << 30
CHUNK = 512 << 20


def say(tag: str, payload=None) -> None:
    print(f"{tag} {json.dumps(payload or {})}", flush=True)


def wait_for(command: str) -> None:
    line = sys.stdin.readline()
    if line.strip() != command:
        raise SystemExit(f"expected {command!r} from the driver, got {line.strip()!r}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--who", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--weights-gib", type=float, required=True)
    parser.add_argument("--activation-gib", type=float, required=True)
    parser.add_argument("--upfront", action="store_true", help="claim the share before loading")
    parser.add_argument("--pause-in-profile", action="store_true",
                        help="say IN_PROFILE and wait for CONTINUE (a neighbour is killed then)")
    parser.add_argument("--utilization-after", type=float, default=None,
                        help="after the pause, decide for this utilization (the recovered share)")
    parser.add_argument("--enforce", action="store_true")
    args = parser.parse_args()
    utilization = 1.0 / args.count

    import torch

    import vramledger
    from _common import Nvml, cuda_pci_bus_id
    from vramledger.board import claim_share, enforce, open_for_device
    from vramledger.profiling import memory_profile, nvml_process_memory

    vramledger.install()
    torch.cuda.set_device(0)
    torch.empty(1, device="cuda")  # context; vramledger now uses device 0
    board = open_for_device(0, label=f"instance-{args.who}")
    sampler = nvml_process_memory(0)
    nvml = Nvml(cuda_pci_bus_id(0))
    capacity = int(vramledger.stats(0)["total_bytes"])
    say("READY", {"pid": os.getpid(), "slot": board.own_index, "key": board.device_key,
                  "capacity": capacity})
    wait_for("GO")
    upfront = None
    if args.upfront:
        upfront = claim_share(board, sampler().device_total_bytes, utilization=utilization,
                              capacity=capacity, sample=sampler)
    with memory_profile(process_memory=sampler) as profile:
        weights = []
        with vramledger.tag("weights"), profile.loading():
            for _ in range(int(args.weights_gib * GIB) // CHUNK):
                weights.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda").fill_(1))
        with profile.profiling():
            activations = [torch.empty(CHUNK, dtype=torch.uint8, device="cuda").fill_(2)
                           for _ in range(int(args.activation_gib * GIB) // CHUNK)]
            a = torch.randn(4096, 4096, device="cuda")
            (a @ a).sum().item()
            del activations, a
            torch.cuda.synchronize()
            if args.pause_in_profile:
                say("IN_PROFILE")
                wait_for("CONTINUE")
            # vLLM's formula, same instant: total x util - (torch peak + (device used - torch
            # reserved)), device figures from cudaMemGetInfo as vLLM reads them.
            free, total = torch.cuda.mem_get_info(0)
            torch_peak = torch.cuda.max_memory_allocated(0)
            torch_reserved = torch.cuda.memory_reserved(0)
            vllm_non_torch = (total - free) - torch_reserved
            vllm_kv = math.floor(Fraction(utilization) * total) - (torch_peak + vllm_non_torch)
    decided = {"who": args.who, "pid": os.getpid(), "slot": board.own_index,
               "upfront_claim": upfront, "vllm": {"total": total, "torch_peak": torch_peak,
                                                  "device_used": total - free,
                                                  "torch_reserved": torch_reserved,
                                                  "non_torch": vllm_non_torch,
                                                  "kv": vllm_kv}}
    if args.utilization_after is not None:
        before = profile.result(utilization=args.utilization_after, board=board, claim=False)
        decided["cut_while_alive"] = before.board_cut_bytes
        decided["kv_while_alive"] = before.kv_cache_budget_bytes
        say("DECIDED_WHILE_ALIVE", {"cut": before.board_cut_bytes})
        wait_for("CONTINUE")
        utilization = args.utilization_after
    result = profile.result(utilization=utilization, board=board)
    decided["result"] = {key: value for key, value in vars(result).items() if key != "board"}
    decided["room"] = result.board
    kv_tensor = None
    decided["kv_oom"] = None
    if result.kv_cache_budget_bytes > 0:
        try:
            # The allocator maps physical pages at allocation; no kernel runs on it, since a
            # kernel not launched before would load its module now, after the decision.
            kv_tensor = torch.empty(result.kv_cache_budget_bytes, dtype=torch.uint8,
                                    device="cuda")
        except torch.OutOfMemoryError as error:
            decided["kv_oom"] = str(error)[:500]
    torch.cuda.synchronize()
    report = json.loads(vramledger.process_report(0, format="json"))
    independent = nvml.process_used()
    decided["books"] = {"basis": report["basis"], "usage": report["process_usage_bytes"],
                        "sum": sum(line["bytes"] for line in report["lines"]),
                        "non_negative": report["all_lines_non_negative"],
                        "torch_reserved": report["torch"]["reserved"],
                        "nvml_independent": independent}
    say("KV_HELD", {"who": args.who})
    wait_for("CHECKED")
    if args.enforce:
        cap = enforce(0, board)
        # More than the cap can hold whatever the cache has: allocated + this > cap.
        allocated = int(vramledger.stats(0)["allocated_bytes"]["all"]["current"])
        over = cap - allocated + GIB
        try:
            torch.empty(max(over, GIB), dtype=torch.uint8, device="cuda")
            decided["enforcement"] = {"cap": cap, "refused": False, "message": ""}
        except torch.OutOfMemoryError as error:
            decided["enforcement"] = {"cap": cap, "refused": True, "message": str(error)}
    say("RESULT", decided)
    wait_for("EXIT")
    del kv_tensor, weights
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Engine instances for the board tests: each a forked process on the SimDevice that loads a
"model", profiles a forward pass with vramledger.profiling and the board, takes the KV cache it
was given, and reports what it decided. Phases are driven by the test through events, so
instances really overlap (start together, profile together, die in the middle)."""

from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Any, Dict, Optional

from sim_device import SimDevice, SimOutOfMemory, SimProcess
from vramledger.board import Board, claim_share
from vramledger.profiling import MemoryProfile


def run_instance(who: int, device: SimDevice, key: str, utilization: float,
                 weights: int, activation: int, start, results, upfront: bool = False,
                 in_profile=None, go_on=None, utilization_after: Optional[float] = None,
                 use_board: bool = True, hold=None) -> None:
    """The instance's life; puts one dict in `results` (or {"error": ...})."""
    try:
        board = Board.open(key)
        board.acquire(f"instance-{who}")
        process = SimProcess(device, who)
        board.publish(process.figures())
        start.wait(30)  # every instance starts loading at once
        if upfront and use_board:
            claim_share(board, device.total, utilization=utilization)
        profile = MemoryProfile(stats_fn=process.stats, reset_peaks_fn=process.reset_peaks,
                                process_memory=lambda: device.sample(who))
        profile.begin()
        for _ in range(8):  # loading in chunks, published as the publisher thread would
            process.alloc(weights // 8)
            board.publish(process.figures())
            time.sleep(0.002)
        profile.end_load()
        with profile.profiling():
            process.alloc(activation)
            board.publish(process.figures())
            if in_profile is not None:
                in_profile.set()
                go_on.wait(30)  # the test kills a neighbour here
            process.free(activation)
        decided: Dict[str, Any] = {"who": who, "pid": os.getpid(), "slot": board.own_index}
        if utilization_after is not None:
            # What this instance would take with a larger share while the neighbour lives.
            before = profile.result(utilization=utilization_after, board=board, claim=False)
            decided["cut_while_alive"] = before.board_cut_bytes
            hold.wait(30)  # the test kills the neighbour, then lets us decide
            utilization = utilization_after
        result = profile.result(utilization=utilization, board=board if use_board else None)
        kv = result.kv_cache_budget_bytes
        decided.update({"kv": kv, "claimed": result.claimed_bytes, "cut": result.board_cut_bytes,
                        "own_without_kv": result.budget_bytes - result.kv_cache_budget_bytes
                        - result.board_cut_bytes, "warnings": result.warnings})
        try:
            if kv > 0:
                process.alloc(kv)  # the KV cache: must fit on the device
            decided["oom"] = None
        except SimOutOfMemory as error:
            decided["oom"] = str(error)
        board.publish(process.figures())
        decided["usage"] = device.usage[who]
        results.put(decided)
    except Exception:
        results.put({"who": who, "error": traceback.format_exc()})
    time.sleep(600)  # hold the slot until the test ends us


def kill(process) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)


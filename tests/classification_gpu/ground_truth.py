#!/usr/bin/env python3
"""Check 4 (docs/classification.md, "Checks still to run on the H200"): the profile's figures
equal the script's own byte counts.

    python tests/classification_gpu/ground_truth.py [--out DIR]

One worker under `vramledger run --conf backend:vmm,round_bytes:512` (the shim on when found)
loads N weight tensors of known sizes under tag "weights" and runs a scripted forward: a fixed
sequence of allocations and frees whose live-byte peak the script computes itself, while a raw
cudaMalloc of K bytes (outside torch) is held across the profiling scope. Everything runs once
before the profile as a warm-up, so the profile itself maps no new pages and loads no kernels.

Asserted, with the allocator's rounding taken from the configuration (round_bytes 512, paged
heap: a block is its request rounded up to 512 B) and cross-checked against the
requested/allocated statistics:
  weights_bytes == weights_tag_bytes == Σ round_up(nbytes, 512), and the requested bytes grew
  by exactly Σ nbytes during the load; other_torch_bytes == 0;
  peak_activation_bytes == the script's peak of Σ round_up(nbytes, 512) over live activations;
  non_torch_increase_bytes within [K, K + 2 MiB) (the driver's granularity), and the shim's
  tracked increase == K exactly when the shim is loaded;
  basis process_usage, no warnings, lines add up to the budget.
Without a GPU: "skipped: no GPU", exit 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import DRIVER_GRANULE, MIB, Outcome, round_up  # noqa: E402

CHECK = "ground_truth"
CONF = "backend:vmm,round_bytes:512"
ROUND_BYTES = 512
# (shape, dtype name): small-pool and large-pool sizes, some not multiples of 512.
WEIGHTS: Tuple[Tuple[Tuple[int, ...], str], ...] = (
    ((4096, 4096), "float32"), ((1000, 777), "float16"), ((3,), "float32"),
    ((50257, 768), "bfloat16"), ((12345,), "int64"), ((33, 65537), "uint8"),
)
# The scripted forward: ("alloc", name, bytes) / ("free", name), bytes of uint8 activations.
FORWARD: Tuple[Tuple[Any, ...], ...] = (
    ("alloc", "h1", 32 * MIB + 1000), ("alloc", "h2", 6_000_002), ("free", "h1"),
    ("alloc", "h3", 40 * MIB + 7), ("alloc", "h4", 100), ("alloc", "h5", 20_000),
    ("free", "h2"), ("alloc", "h6", 50 * MIB + 3), ("free", "h3"), ("free", "h4"),
    ("alloc", "h7", 8 * MIB), ("free", "h5"), ("free", "h6"), ("free", "h7"),
)
RAW_BYTES = 24 * MIB + 777


def itemsize(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "uint8": 1}[dtype]


def expected_weights() -> Tuple[int, int]:
    """(Σ requested bytes, Σ allocated bytes) of the weights, from the script alone."""
    requested = allocated = 0
    for shape, dtype in WEIGHTS:
        count = 1
        for extent in shape:
            count *= extent
        requested += count * itemsize(dtype)
        allocated += round_up(count * itemsize(dtype), ROUND_BYTES)
    return requested, allocated


def expected_peak() -> int:
    """The peak of live activation bytes (rounded as the allocator does) over FORWARD."""
    live: Dict[str, int] = {}
    peak = 0
    for step in FORWARD:
        if step[0] == "alloc":
            live[step[1]] = round_up(step[2], ROUND_BYTES)
            peak = max(peak, sum(live.values()))
        else:
            del live[step[1]]
    return peak


def worker() -> int:
    import torch

    import vramledger
    from vramledger.profiling import memory_profile, nvml_process_memory, preload_non_torch

    assert vramledger.is_installed(), "vramledger run did not install vramledger"
    torch.cuda.synchronize()
    raw = _common.RawCuda()

    def load() -> List[Any]:
        tensors = []
        for shape, dtype in WEIGHTS:
            tensors.append(torch.empty(shape, dtype=getattr(torch, dtype), device="cuda").fill_(1))
        return tensors

    def forward() -> None:
        live: Dict[str, Any] = {}
        for step in FORWARD:
            if step[0] == "alloc":
                live[step[1]] = torch.empty(step[2], dtype=torch.uint8, device="cuda").fill_(7)
            else:
                del live[step[1]]
        torch.cuda.synchronize()

    # Warm-up: the same tensors, kernels and raw allocation once, all freed again.
    warm = load()
    forward()
    raw.free(raw.alloc(RAW_BYTES))
    del warm
    torch.cuda.synchronize()

    def requested() -> int:
        return int(vramledger.stats()["requested_bytes"]["all"]["current"])

    def allocated() -> int:
        return int(vramledger.stats()["allocated_bytes"]["all"]["current"])

    tracker = preload_non_torch()
    with memory_profile(process_memory=nvml_process_memory(), non_torch=tracker) as prof:
        requested_begin, allocated_begin = requested(), allocated()
        with prof.loading():
            with vramledger.tag("weights"):
                weights = load()
        requested_loaded, allocated_loaded = requested(), allocated()
        with prof.profiling():
            address = raw.alloc(RAW_BYTES)
            forward()
    raw.free(address)
    result = prof.result(utilization=0.9)
    _common.emit({
        "raw_via": raw.via, "shim": tracker is not None,
        "weights_bytes": result.weights_bytes, "weights_tag_bytes": result.weights_tag_bytes,
        "requested_growth_during_load": requested_loaded - requested_begin,
        "allocated_growth_during_load": allocated_loaded - allocated_begin,
        "other_torch_bytes": result.other_torch_bytes,
        "peak_activation_bytes": result.peak_activation_bytes,
        "non_torch_increase_bytes": result.non_torch_increase_bytes,
        "non_torch_tracked_increase_bytes": result.non_torch_tracked_increase_bytes,
        "non_torch_basis": result.non_torch_basis,
        "accounted_equals_budget": result.accounted_bytes() == result.budget_bytes,
        "warnings": result.warnings, "log_lines": result.log_lines(),
        "weight_count": len(weights),
    })
    return 0


def analyse(result: Dict[str, Any], outcome: Outcome) -> None:
    """The assertions on the worker's RESULT (pure: test_offline.py feeds it made-up data)."""
    want_requested, want_weights = expected_weights()
    want_peak = expected_peak()
    got = result
    outcome.figures["weights (ours / script)"] = f"{got['weights_bytes']} / {want_weights} B"
    outcome.figures["activation peak (ours / script)"] = (
        f"{got['peak_activation_bytes']} / {want_peak} B")
    outcome.figures["non-torch increase / raw K"] = (
        f"{got['non_torch_increase_bytes']} / {RAW_BYTES} B (tracked by shim: "
        f"{got['non_torch_tracked_increase_bytes'] if got['shim'] else 'shim not loaded'})")
    outcome.expect(got["weights_bytes"] == want_weights,
                   f"weights_bytes {got['weights_bytes']} != script's {want_weights}")
    outcome.expect(got["weights_tag_bytes"] == want_weights,
                   f"weights_tag_bytes {got['weights_tag_bytes']} != script's {want_weights}")
    outcome.expect(got["requested_growth_during_load"] == want_requested,
                   f"requested bytes grew {got['requested_growth_during_load']} during the load, "
                   f"the script asked for {want_requested}")
    outcome.expect(got["allocated_growth_during_load"] == got["weights_bytes"],
                   f"allocated stat grew {got['allocated_growth_during_load']} but weights_bytes "
                   f"is {got['weights_bytes']}")
    outcome.expect(got["other_torch_bytes"] == 0,
                   f"other_torch_bytes {got['other_torch_bytes']}, expected 0")
    outcome.expect(got["peak_activation_bytes"] == want_peak,
                   f"peak_activation_bytes {got['peak_activation_bytes']} != script's {want_peak}")
    excess = got["non_torch_increase_bytes"] - RAW_BYTES
    outcome.expect(0 <= excess < DRIVER_GRANULE,
                   f"non-torch increase {got['non_torch_increase_bytes']} B is not within "
                   f"[K, K + 2 MiB) of the raw K = {RAW_BYTES} B (excess {excess} B)")
    if got["shim"]:
        outcome.expect(got["non_torch_tracked_increase_bytes"] == RAW_BYTES,
                       f"shim's tracked increase {got['non_torch_tracked_increase_bytes']} B "
                       f"!= K = {RAW_BYTES} B")
    else:
        outcome.notes.append("the LD_PRELOAD shim was not loaded: tracked figures not checked")
    outcome.expect(got["non_torch_basis"] == "process_usage",
                   f"basis {got['non_torch_basis']}, not process_usage")
    outcome.expect(got["accounted_equals_budget"], "lines do not add up to the budget")
    outcome.expect(not got["warnings"], f"warnings: {got['warnings']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("main", "worker"), default="main")
    parser.add_argument("--out", default=None)
    parser.add_argument("--timeout", type=float, default=45.0, help="worker, seconds")
    args = parser.parse_args()
    if args.role == "worker":
        return worker()

    _common.skip_without_gpu(CHECK)
    folder = _common.out_dir(args.out, CHECK)
    outcome = Outcome(CHECK)
    command = _common.vramledger_run(os.path.abspath(__file__), ["--role", "worker"],
                                     track_non_torch=None, conf=CONF)
    outcome.run_worker_then_finish(command, args.timeout, folder, analyse)
    return 0


if __name__ == "__main__":
    sys.exit(main())

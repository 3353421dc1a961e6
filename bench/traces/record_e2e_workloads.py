#!/usr/bin/env python3
"""Records the allocation trace of compare_allocators.py's own workloads (same models, same
seeded schedule of shapes, same deterministic settings) under PyTorch's native allocator, so that
a figure seen on the GPU end to end can be replayed and studied offline with vramledger-replay.

    python3 bench/traces/record_e2e_workloads.py --out DIR [--steps 24] [--seed 0] NAME [NAME ...]

Each workload runs in a fresh process; writes DIR/NAME.e2e.vlt.gz (docs/workload_trace_format.md)
and DIR/NAME.e2e.json (torch's figures for that run and the trace's summary).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "end_to_end"))

import e2e_common  # noqa: E402
import torch_snapshot_to_workload as converter  # noqa: E402


def record(name: str, steps: int, seed: int, out_dir: Path) -> None:
    """Child: one workload with torch's memory history on."""
    import torch

    import compare_allocators as e2e

    workload = e2e.WORKLOADS[name]
    e2e.apply_deterministic_settings(torch)
    schedule = workload.schedule(random.Random(seed), steps)
    torch.manual_seed(seed)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=10_000_000)
    started = time.time()
    state = workload.build(torch)
    for shape in schedule:
        workload.step(torch, state, shape)
    torch.cuda.synchronize()
    seconds = time.time() - started
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats()
    figures = {"workload": name, "steps": steps, "seed": seed, "seconds": round(seconds, 3),
               "schedule": schedule, "torch_version": torch.__version__,
               "gpu": torch.cuda.get_device_name(),
               "peak_reserved_bytes": stats["reserved_bytes.all.peak"],
               "peak_requested_bytes": stats["requested_bytes.all.peak"]}
    summary = converter.write_workload(snapshot, out_dir / f"{name}.e2e.vlt.gz",
                                       source=f"torch {torch.__version__} e2e {name}",
                                       torch_figures=figures)
    figures.update({"trace_" + k: v for k, v in summary.items()})
    (out_dir / f"{name}.e2e.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "schedule"}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child:
        record(args.names[0], args.steps, args.seed, args.out)
        return 0
    failed = 0
    for name in args.names:  # a fresh process each: history and caches start empty
        env = dict(os.environ, **e2e_common.DETERMINISM_ENV)  # as compare_allocators' children
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        status = subprocess.call(env=env, args=[sys.executable, __file__, "--child", "--out", str(args.out),
                                  "--steps", str(args.steps), "--seed", str(args.seed), name])
        if status != 0:
            print(f"record_e2e_workloads: {name} failed (exit {status})", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Issue 14's several runs spread over the GPUs of one machine (scripts/e2e_runs.sh --gpus N).

The unit of work is one (run, workload): one compare_allocators.py invocation running every
allocator of that workload back to back on one GPU (native first, native-again last; on even runs
the reverse), so the paired step ratios of a unit compare processes that shared a GPU and a
stretch of time, as in the one-GPU series. Units go to the GPUs longest first, each to the GPU
with the least work queued (estimated from the H200's measured times per process); a GPU runs
its units one after the other. Afterwards the units of each run are merged into
RUN/compare_allocators.json (their `runs`, `comparisons` and `failures` joined) and
multi_run_table.py writes OUT/table.md from them.

    parallel_runs.py --gpus 8 [--runs 3] [--allocators A,B] [--workloads W,X] [--steps 24]
                     [--warmup 4] [--budget-s 540] --out DIR [--commit SHA] [--profile-steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e_workloads import WORKLOADS  # noqa: E402  (no torch: the workloads' names and shapes)

# Seconds per (workload, allocator) process on the H200 at 24 steps (2026-12-03, a47059b): the
# start-up (imports, model build, first steps) dominates; only the order of the units uses it.
SECONDS_PER_PROCESS = {
    "gpt2_generate": 32, "gpt2_train": 19, "t5_train": 18, "llama_train": 17,
    "two_stream_train": 12, "vit_train": 12, "resnet50_train": 11,
}


def plan(units: List[Tuple[int, str]], allocators: int, gpus: int) -> List[List[Tuple[int, str]]]:
    """Longest first, each to the least loaded GPU; a GPU's list runs in order."""
    lanes: List[List[Tuple[int, str]]] = [[] for _ in range(gpus)]
    load = [0.0] * gpus
    ordered = sorted(units, key=lambda u: (-SECONDS_PER_PROCESS.get(u[1], 20), u[0], u[1]))
    for unit in ordered:
        lane = min(range(gpus), key=lambda g: (load[g], g))
        lanes[lane].append(unit)
        load[lane] += SECONDS_PER_PROCESS.get(unit[1], 20) * allocators
    for lane in lanes:  # within a GPU, run 1's units before run 2's
        lane.sort(key=lambda u: (u[0], -SECONDS_PER_PROCESS.get(u[1], 20)))
    return lanes


def merge(unit_docs: List[dict]) -> dict:
    """One compare_allocators document from several single-workload ones of the same run."""
    merged = dict(unit_docs[0])
    merged["meta"] = dict(unit_docs[0].get("meta", {}))
    merged["meta"]["merged_from"] = len(unit_docs)
    merged["meta"]["gpu_ids"] = sorted({g for d in unit_docs
                                        for g in d.get("meta", {}).get("gpu_ids", [])})
    for key in ("runs", "comparisons", "failures"):
        merged[key] = [item for d in unit_docs for item in d.get(key, [])]
    return merged


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--allocators", default="native,vramledger,native-again")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", default=os.environ.get("VRAMLEDGER_GIT_COMMIT", "unknown"))
    parser.add_argument("--profile-steps", type=int, default=0)
    parser.add_argument("--hold", help="multi_run_table.py --hold: exit 1 when this allocator "
                                       "misses the memory goals")
    parser.add_argument("--together", action="store_true",
                        help="each unit's allocators at once, in lock step (compare_allocators)")
    args = parser.parse_args(argv)
    if args.gpus < 1 or args.runs < 1:
        parser.error("--gpus and --runs must be at least 1")
    allocators = [a for a in args.allocators.split(",") if a]
    workloads = [w for w in args.workloads.split(",") if w]
    inherited = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    gpu_ids = (inherited or [str(i) for i in range(args.gpus)])[:args.gpus]
    units = [(run, w) for run in range(1, args.runs + 1) for w in workloads]
    lanes = plan(units, len(allocators), len(gpu_ids))
    deadline = time.monotonic() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    for gpu, lane in zip(gpu_ids, lanes):
        print(f"parallel_runs: GPU {gpu}: " + ", ".join(f"run{r}:{w}" for r, w in lane),
              flush=True)

    def run_lane(gpu: str, lane: List[Tuple[int, str]]) -> None:
        for run, workload in lane:
            left = deadline - time.monotonic()
            unit_out = args.out / f"run{run}" / workload
            unit_out.mkdir(parents=True, exist_ok=True)
            if left < 10:
                print(f"parallel_runs: run{run}:{workload} not run (budget spent)", flush=True)
                continue
            command = [sys.executable, str(HERE / "compare_allocators.py"),
                       "--only", ",".join(allocators + [workload]),
                       "--steps", str(args.steps), "--warmup", str(args.warmup),
                       "--out", str(unit_out), "--commit", args.commit,
                       "--time-limit-s", str(int(left)), "--no-matplotlib",
                       "--profile-steps", str(args.profile_steps)]
            if args.together:
                command.append("--together")
            if run % 2 == 0:
                command.append("--native-last")  # alternate who runs first, as e2e_runs.sh does
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
            started = time.monotonic()
            with open(unit_out.parent / f"{workload}.log", "w") as log:
                code = subprocess.call(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            print(f"parallel_runs: GPU {gpu} run{run}:{workload} exit {code} in "
                  f"{time.monotonic() - started:.0f}s", flush=True)

    threads = [threading.Thread(target=run_lane, args=(g, lane), daemon=True)
               for g, lane in zip(gpu_ids, lanes) if lane]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    merged_files = []
    for run in range(1, args.runs + 1):
        docs = []
        for workload in workloads:
            path = args.out / f"run{run}" / workload / "compare_allocators.json"
            if path.is_file():
                try:
                    docs.append(json.loads(path.read_text()))
                except ValueError:
                    print(f"parallel_runs: {path}: not JSON", file=sys.stderr)
        if docs:
            target = args.out / f"run{run}" / "compare_allocators.json"
            target.write_text(json.dumps(merge(docs), indent=1) + "\n")
            merged_files.append(str(target))
    if not merged_files:
        print("parallel_runs: no unit wrote a result", file=sys.stderr)
        return 1
    return subprocess.call([sys.executable, str(HERE / "multi_run_table.py"), *merged_files,
                            "--md", str(args.out / "table.md")]
                           + (["--hold", args.hold] if args.hold else []))


if __name__ == "__main__":
    sys.exit(main())

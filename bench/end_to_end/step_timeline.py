"""Where one training step's time goes, native against vramledger (issue 14).

The step-time ratio of vramledger against native says *that* a step is slower, not *where*. This
runs a workload's seeded schedule (the one compare_allocators.py runs) in a fresh process per
allocator and profiles its largest steps with torch.profiler (CPU and CUDA activity), then reads
the GPU's own timeline from the trace:

  wall      the step from synchronize to synchronize (under the profiler);
  busy      the union of the GPU's kernels, copies and memsets;
  idle      wall - busy: time the GPU waited, on the CPU (launches not yet made) or on a
            synchronization;
  gaps      idle stretches of >= --gap-us, each charged to the innermost CPU operator running on
            the launching thread at the gap's middle (what the CPU was doing while the GPU
            starved), and summed by operator name.

A slower step whose busy time equals native's and whose extra idle sits in the allocating
operators is lost on the CPU (allocator calls, driver calls); more busy time means the work ran
slower. Under vramledger each profiled step also records its driver calls (maps, unmaps,
physical allocations). The same steps are timed unprofiled first (the profiler's own cost stays
out of that figure).

    python bench/end_to_end/step_timeline.py --workload vit_train \
        --allocators native,vramledger,native,vramledger --out DIR

Needs a GPU and, for vramledger, the staged package on PYTHONPATH (as compare_allocators.py).
Writes DIR/step_timeline.json and DIR/step_timeline.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import e2e_common as common  # noqa: E402
from e2e_allocators import ALLOCATORS  # noqa: E402

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


# --------------------------------------------------------------------------------------------
# The trace's analysis (pure: tested without a GPU)

def merged_intervals(intervals: Iterable[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """The union of [start, end) intervals, sorted and disjoint."""
    merged: List[Tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def launching_thread(events: Sequence[Dict[str, Any]]) -> Optional[Any]:
    """The thread that ran most CPU operator time: the training loop's."""
    per_thread: Dict[Any, float] = {}
    for event in events:
        if event.get("cat") == "cpu_op":
            per_thread[event.get("tid")] = per_thread.get(event.get("tid"), 0.0) + event["dur"]
    return max(per_thread, key=per_thread.get) if per_thread else None


def innermost_operator(ops: Sequence[Dict[str, Any]], at_us: float) -> str:
    """The shortest CPU operator running at at_us ('(between operators)' when none is)."""
    running = [op for op in ops if op["ts"] <= at_us < op["ts"] + op["dur"]]
    if not running:
        return "(between operators)"
    return min(running, key=lambda op: op["dur"])["name"]


def gpu_timeline(events: Sequence[Dict[str, Any]], window: Tuple[float, float],
                 gap_us: float) -> Dict[str, Any]:
    """busy / idle / gaps of the GPU within window (microseconds, the trace's clock)."""
    begin, end = window
    busy_spans = merged_intervals(
        (max(e["ts"], begin), min(e["ts"] + e["dur"], end)) for e in events
        if e.get("cat") in GPU_CATEGORIES and e.get("dur") is not None
        and e["ts"] < end and e["ts"] + e["dur"] > begin)
    busy = sum(stop - start for start, stop in busy_spans)
    thread = launching_thread(events)
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("tid") == thread]
    gaps: List[Tuple[float, float]] = []
    cursor = begin
    for start, stop in busy_spans + [(end, end)]:
        if start - cursor >= gap_us:
            gaps.append((cursor, start))
        cursor = max(cursor, stop)
    by_operator: Dict[str, Dict[str, float]] = {}
    for start, stop in gaps:
        name = innermost_operator(ops, (start + stop) / 2)
        entry = by_operator.setdefault(name, {"gaps": 0, "idle_us": 0.0})
        entry["gaps"] += 1
        entry["idle_us"] += stop - start
    wall = end - begin
    return {"wall_us": wall, "busy_us": busy, "idle_us": wall - busy,
            "gaps": len(gaps), "gap_idle_us": sum(stop - start for start, stop in gaps),
            "gap_us_threshold": gap_us,
            "idle_by_operator": dict(sorted(by_operator.items(),
                                            key=lambda item: -item[1]["idle_us"]))}


def profiled_window(events: Sequence[Dict[str, Any]]) -> Tuple[float, float]:
    """The span of the step: first to last CPU operator or GPU activity in the trace."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") in GPU_CATEGORIES + ("cpu_op",) and e.get("dur") is not None]
    return (min(s for s, _ in spans), max(t for _, t in spans)) if spans else (0.0, 0.0)


# --------------------------------------------------------------------------------------------
# Child: one allocator, one fresh process

# The order of compare_allocators.driver_calls' figures.
CALL_NAMES = ("maps", "unmaps", "device_allocs", "host_waits")


def child_main(args) -> int:
    from compare_allocators import apply_deterministic_settings, driver_calls
    from e2e_workloads import WORKLOADS

    allocator = ALLOCATORS[args.child]
    workload = WORKLOADS[args.workload]
    import torch
    from torch.profiler import ProfilerActivity, profile

    vramledger = None
    if allocator.vramledger_conf is not None:
        import vramledger  # noqa: F811

        vramledger.install(allocator.vramledger_conf)
    apply_deterministic_settings(torch)
    schedule = workload.schedule(random.Random(args.seed), args.steps)
    torch.manual_seed(args.seed)
    state = workload.build(torch)
    key = args.shape_key
    largest = max(shape.get(key, 0) for shape in schedule)
    timed_ms: List[float] = []
    every_step: List[Dict[str, Any]] = []   # each step of the first pass: time, driver calls
    for index, shape in enumerate(schedule):
        before = driver_calls(vramledger) if vramledger is not None else None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        workload.step(torch, state, shape)
        torch.cuda.synchronize()
        milliseconds = 1e3 * (time.perf_counter() - t0)
        step = {"shape": shape, "ms": milliseconds}
        if before is not None:
            step.update(zip(CALL_NAMES, (a - b for a, b in zip(driver_calls(vramledger), before))))
        every_step.append(step)
        if index >= args.warmup and shape.get(key, 0) == largest:
            timed_ms.append(milliseconds)
    # The profiled steps in their places: a second pass over the schedule after the warm-up,
    # profiling its first largest steps (each after the smaller step before it, as when timed,
    # so that the moves a largest step makes are in its profile).
    profiled: List[Dict[str, Any]] = []
    for index, shape in enumerate(schedule[args.warmup:], args.warmup):
        if len(profiled) == args.profiled_steps:
            break
        if shape.get(key, 0) != largest:
            workload.step(torch, state, shape)
            continue
        before = driver_calls(vramledger) if vramledger is not None else None
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            workload.step(torch, state, shape)
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "trace.json"
            prof.export_chrome_trace(str(path))
            events = [e for e in json.loads(path.read_text()).get("traceEvents", [])
                      if e.get("ph") == "X"]
        figures = gpu_timeline(events, profiled_window(events), args.gap_us)
        figures["after_shape"] = schedule[index - 1]
        if before is not None:
            after = driver_calls(vramledger)
            figures["driver_calls"] = dict(zip(CALL_NAMES, (a - b for a, b in zip(after, before))))
        profiled.append(figures)
    result = {"allocator": args.child, "workload": args.workload, "shape": {key: largest},
              "unprofiled_step_ms": timed_ms, "steps": every_step, "profiled": profiled,
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    common.write_json_atomic(Path(args.result_file), result)
    return 0


# --------------------------------------------------------------------------------------------
# Parent: the runs, one after another, and their table

def step_table(runs: Sequence[Dict[str, Any]]) -> List[str]:
    """One row per step of the schedule, one column per run: its time (and its maps)."""
    ok = [(number, run) for number, run in enumerate(runs, 1) if not run.get("error")]
    if not ok:
        return []
    lines = ["| step | shape | " + " | ".join(f"{n} {run['allocator']}" for n, run in ok) + " |",
             "|---|---|" + "---|" * len(ok)]
    for index, first in enumerate(ok[0][1].get("steps", [])):
        cells = []
        for _, run in ok:
            step = run["steps"][index] if index < len(run.get("steps", [])) else None
            if step is None:
                cells.append("")
                continue
            maps = (f" ({step['maps']}" + (f", {step['host_waits']}w" if step.get("host_waits")
                                           else "") + ")") if "maps" in step else ""
            cells.append(f"{step['ms']:.1f}{maps}")
        shape = ",".join(f"{k}={v}" for k, v in first["shape"].items())
        lines.append(f"| {index} | {shape} | " + " | ".join(cells) + " |")
    return lines


def render(runs: Sequence[Dict[str, Any]], top: int = 6) -> str:
    lines = ["| run | allocator | unprofiled step ms (median) | wall ms | GPU busy ms | GPU idle ms "
             "| gaps | driver calls (maps/unmaps/allocs), host waits |",
             "|---|---|---|---|---|---|---|---|"]
    for number, run in enumerate(runs, 1):
        if run.get("error"):
            lines.append(f"| {number} | {run.get('allocator')} | error: {run['error']} "
                         "| | | | | |")
            continue
        median = common.median(run["unprofiled_step_ms"])
        for figures in run["profiled"]:
            calls = figures.get("driver_calls")
            calls_text = ("/".join(str(calls[k]) for k in ("maps", "unmaps", "device_allocs"))
                          + f", {calls.get('host_waits', '?')}" if calls else "-")
            lines.append(
                f"| {number} | {run['allocator']} | {common.fmt_optional(median, '.1f')} "
                f"| {figures['wall_us'] / 1e3:.1f} | {figures['busy_us'] / 1e3:.1f} "
                f"| {figures['idle_us'] / 1e3:.1f} | {figures['gaps']} | {calls_text} |")
    lines += ["", "Every step of the first pass (unprofiled): ms, and under vramledger (maps, and "
              "host waits as Nw when there were any):", ""]
    lines += step_table(runs)
    lines += ["", "GPU idle in gaps by the CPU operator running at the gap's middle (first "
              "profiled step of each run, top operators):", ""]
    for number, run in enumerate(runs, 1):
        if run.get("error") or not run["profiled"]:
            continue
        first = run["profiled"][0]
        parts = [f"{name} {v['idle_us'] / 1e3:.2f} ms ({v['gaps']})"
                 for name, v in list(first["idle_by_operator"].items())[:top]]
        lines.append(f"- run {number} ({run['allocator']}): " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def parent_main(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: List[Dict[str, Any]] = []
    for number, name in enumerate(args.allocators.split(","), 1):
        result_file = out / f"run{number}.{name}.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--child", name,
                   "--workload", args.workload, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--seed", str(args.seed),
                   "--profiled-steps", str(args.profiled_steps), "--gap-us", str(args.gap_us),
                   "--shape-key", args.shape_key, "--result-file", str(result_file)]
        # compare_allocators' child environment (determinism settings included: cuBLAS's
        # workspace setting changes the kernels), so that the two tools time the same steps.
        env = common.child_environment(ALLOCATORS[name].env)
        with open(out / f"run{number}.{name}.log", "w") as log:
            status = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=args.timeout_s).returncode
        run = common.read_json(result_file) or {}
        if status != 0 or not run:
            run = {"allocator": name, "error": f"exit {status} "
                   f"({common.log_tail(out / f'run{number}.{name}.log', 3)!r})"}
        runs.append(run)
        common.write_json_atomic(out / "step_timeline.json", {"workload": args.workload,
                                                               "runs": runs})
        common.write_text_atomic(out / "step_timeline.md", render(runs))
    print(render(runs))
    return 0 if all(not run.get("error") for run in runs) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="vit_train")
    parser.add_argument("--allocators", default="native,vramledger,native,vramledger",
                        help="comma-separated, run in this order, one fresh process each")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape-key", default="batch",
                        help="the schedule's key whose largest value picks the profiled steps")
    parser.add_argument("--profiled-steps", type=int, default=2)
    parser.add_argument("--gap-us", type=float, default=20.0)
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--out", default=os.environ.get("OUT", "build-step-timeline"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return child_main(args) if args.child else parent_main(args)


if __name__ == "__main__":
    sys.exit(main())

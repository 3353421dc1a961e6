#!/usr/bin/env python3
"""The several-runs table of issue 14 from compare_allocators.py outputs: one invocation per run
(each runs native and the other allocators one after the other, so drift hits all of them), then

    python3 bench/end_to_end/multi_run_table.py RUN1/compare_allocators.json RUN2/... [--md OUT]

For each workload and allocator (ratio and paired median as compare_allocators derived them for
its own table): peak reserved / peak requested in every run that has it, the
spread (largest minus smallest), the median step time per run, the paired per-step median against
native's run of the same invocation (each timed step divided by the same step of native: the
schedule of shapes is the same, so this cancels the shapes and leaves the allocator), the GPU
time of the profiled extra steps against native's (compare_allocators --profile-steps: equal GPU
time puts a slower step on the CPU side), with the A/A control `native-again` also each step
against the mean of the two natives (they ran before and after: ABA), and the
driver calls vramledger made per step in the steady state (steps that did not raise peak reserved;
from the `per_step` record), and vramledger's waits for the GPU per timed step (each lets the
GPU's queue run dry). A verdict column holds each allocator to the issue's goals: every
ratio <= --max-ratio (1.02) with a spread <= --max-spread (0.005) over at least --min-runs (3),
and the median over runs of the paired per-step medians <= --max-step (1.00), taken against both
natives (ABA) when every run has the A/A control.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import e2e_common as common
from e2e_allocators import NATIVE_AGAIN, REFERENCE   # the reference and its A/A control


def load_runs(paths: Sequence[Path]) -> List[Dict[str, Dict[str, Any]]]:
    """One dict per invocation: "workload.allocator" -> that run's record (ok runs only), with
    the figures compare_allocators derived for it (ratio, paired per-step median vs native)."""
    invocations = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        runs = {}
        for record in doc.get("runs", []):
            if record.get("status") == "ok" and not record.get("control"):
                runs[f"{record['workload']}.{record['allocator']}"] = {
                    "result": record["result"], "derived": record["derived"]}
        invocations.append(runs)
    return invocations


def steady_calls_per_step(run: Dict[str, Any]) -> Optional[float]:
    """Maps + unmaps + physical creates per step over the steps that left peak reserved where
    it was (the per_step rows: reserved, peak reserved, then the running totals of the three)."""
    rows = run.get("per_step") or []
    calls = steps = 0
    for before, after in zip(rows, rows[1:]):
        if len(after) < 5 or len(before) < 5:
            return None   # not a vramledger run
        if after[1] == before[1]:
            steps += 1
            calls += sum(after[k] - before[k] for k in (2, 3, 4))
    return calls / steps if steps else None


def host_waits_per_step(run: Dict[str, Any]) -> Optional[float]:
    """The allocator's waits for the GPU per timed step (BlockCensus::host_waits: each lets the
    GPU's queue run dry); None where the run did not record them (not vramledger, or before
    2026-12-03)."""
    per_step = (run.get("vramledger_stats") or {}).get("per_timed_step") or {}
    return per_step.get("host_waits")


def rows_of(invocations: List[Dict[str, Dict[str, Any]]]) -> List[Dict[str, Any]]:
    keys: List[str] = []
    for runs in invocations:
        keys.extend(k for k in runs if k not in keys)
    rows = []
    for key in keys:
        workload, allocator = key.split(".", 1)
        row: Dict[str, Any] = {"workload": workload, "allocator": allocator, "runs": [],
                               "ratios": [], "medians": [], "paired": [], "aba": [], "gpu": [],
                               "steady": [], "waits": []}
        for number, runs in enumerate(invocations, start=1):
            run = runs.get(key)
            if run is None:
                continue
            derived = run["derived"]
            row["runs"].append(number)
            row["ratios"].append(derived.get("overhead_ratio"))
            row["medians"].append(run["result"].get("median_step_ms"))
            row["paired"].append(derived.get("paired_step_ratio")
                                 if allocator != REFERENCE else None)
            row["aba"].append(derived.get("paired_step_ratio_aba")
                              if allocator != REFERENCE else None)
            row["gpu"].append(derived.get("paired_gpu_time_ratio"))
            row["steady"].append(steady_calls_per_step(run["result"]))
            row["waits"].append(host_waits_per_step(run["result"]))
        rows.append(row)
    return rows


def memory_problems(row: Dict[str, Any], max_ratio: float, max_spread: float,
                    min_runs: int) -> Optional[List[str]]:
    """The memory goals `row` misses (ratio, spread, runs); None when it has no ratio at all."""
    ratios = [r for r in row["ratios"] if r is not None]
    if not ratios:
        return None
    spread = max(ratios) - min(ratios)
    problems = []
    if max(ratios) > max_ratio:
        problems.append(f"ratio {max(ratios):.4f} > {max_ratio}")
    if spread > max_spread:
        problems.append(f"spread {spread:.4f} > {max_spread}")
    if len(ratios) < min_runs:
        problems.append(f"{len(ratios)} of {min_runs} runs")
    return problems


def verdict(row: Dict[str, Any], max_ratio: float, max_spread: float, min_runs: int,
            max_step: float = 1.0) -> str:
    if row["allocator"] == REFERENCE:
        return "reference"
    if row["allocator"] == NATIVE_AGAIN:
        return "A/A control: its step ratio is the measurement's own"
    problems = memory_problems(row, max_ratio, max_spread, min_runs)
    if problems is None:
        return "no figure (no requested bytes)"
    # The runs' paired per-step medians, judged by their median; against the mean of the two
    # natives (ABA) where every run had the A/A control, since that cancels the position effect.
    judged = row["aba"] if row["aba"] and all(a is not None for a in row["aba"]) else row["paired"]
    middle = common.median([p for p in judged if p is not None])
    if middle is not None and middle > max_step:
        problems.append(f"step {middle:.3f}x > {max_step:.2f}x")
    return "meets" if not problems else "; ".join(problems)


def memory_goal_failures(rows: List[Dict[str, Any]], allocator: str, max_ratio: float,
                         max_spread: float, min_runs: int) -> List[str]:
    """Where `allocator` misses the memory goals (ratio, spread, runs) on any workload; the step
    goal is not held here: one call's step ratios are within the measurement's own noise."""
    failures = []
    mine = [row for row in rows if row["allocator"] == allocator]
    if not mine:
        return [f"{allocator}: no run of it in these results"]
    for row in mine:
        problems = memory_problems(row, max_ratio, max_spread, min_runs)
        if problems is None:
            problems = ["no peak reserved / peak requested figure"]
        failures += [f"{row['workload']}: {problem}" for problem in problems]
    return failures


def fmt(values: List[Optional[float]], spec: str) -> str:
    shown = [("n/a" if v is None else format(v, spec)) for v in values]
    return " / ".join(shown) if shown else "—"


def render(rows: List[Dict[str, Any]], max_ratio: float, max_spread: float,
           min_runs: int, max_step: float = 1.0) -> str:
    lines = ["| workload | allocator | runs | peak reserved / peak requested | spread | "
             "median step ms | paired per-step median vs native | vs mean of native and "
             "native-again (ABA) | GPU time vs native "
             "(profiled steps) | steady driver calls per step | host waits per step "
             f"| goal (≤ {max_ratio}, spread ≤ {max_spread}, {min_runs} runs, "
             f"step ≤ {max_step:.2f}x) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ratios = [r for r in row["ratios"] if r is not None]
        spread = f"{max(ratios) - min(ratios):.4f}" if ratios else "—"
        steady = ("—" if all(s is None for s in row["steady"]) else fmt(row["steady"], ".1f"))
        paired = ("—" if row["allocator"] == REFERENCE else fmt(row["paired"], ".3f"))
        aba = ("—" if all(a is None for a in row["aba"]) else fmt(row["aba"], ".3f"))
        gpu = ("—" if all(g is None for g in row["gpu"]) else fmt(row["gpu"], ".3f"))
        waits = ("—" if all(w is None for w in row["waits"]) else fmt(row["waits"], ".2f"))
        lines.append(f"| {row['workload']} | {row['allocator']} | "
                     f"{' / '.join(map(str, row['runs']))} | {fmt(row['ratios'], '.4f')} | "
                     f"{spread} | {fmt(row['medians'], '.1f')} | {paired} | {aba} | {gpu} | {steady} | {waits} | "
                     f"{verdict(row, max_ratio, max_spread, min_runs, max_step)} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="compare_allocators.json, one per run")
    parser.add_argument("--md", type=Path, help="also write the table here")
    parser.add_argument("--max-ratio", type=float, default=1.02)
    parser.add_argument("--max-spread", type=float, default=0.005)
    parser.add_argument("--min-runs", type=int, default=3)
    parser.add_argument("--max-step", type=float, default=1.0,
                        help="the median over runs of the paired per-step medians vs native")
    parser.add_argument("--hold", metavar="ALLOCATOR",
                        help="exit 1 when ALLOCATOR misses the memory goals (--max-ratio, "
                             "--max-spread, --min-runs) on any workload (the GPU suite's guard)")
    args = parser.parse_args(argv)
    for path in args.runs:
        if not path.is_file():
            parser.error(f"{path}: no such file")
    try:
        rows = rows_of(load_runs(args.runs))
        table = render(rows, args.max_ratio, args.max_spread, args.min_runs, args.max_step)
    except (ValueError, KeyError, TypeError) as error:
        print(f"multi_run_table: not a compare_allocators.json: {error!r}", file=sys.stderr)
        return 2
    sys.stdout.write(table)
    if args.md:
        args.md.write_text(table)
    if args.hold:
        failures = memory_goal_failures(rows, args.hold, args.max_ratio, args.max_spread,
                                        args.min_runs)
        for failure in failures:
            print(f"FAILURE: {args.hold}: {failure}")
        print(f"HOLD {args.hold}: " + ("missed on " + str(len(failures)) + " count(s)"
                                       if failures else "every workload meets the memory goals"))
        return 1 if failures else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tests of parallel_runs.py's plan and merge (no GPU, no torch): every unit planned once, the
GPUs' loads within one unit of each other, and merged runs read by multi_run_table as one run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import multi_run_table as mrt  # noqa: E402
import parallel_runs as pr  # noqa: E402


def test_plan_places_every_unit_once_and_balances():
    units = [(run, w) for run in (1, 2, 3) for w in pr.SECONDS_PER_PROCESS]
    for gpus in (1, 3, 7, 8):
        lanes = pr.plan(units, allocators=5, gpus=gpus)
        placed = sorted(u for lane in lanes for u in lane)
        assert placed == sorted(units)
        loads = [sum(pr.SECONDS_PER_PROCESS[w] * 5 for _, w in lane) for lane in lanes]
        longest_unit = max(pr.SECONDS_PER_PROCESS.values()) * 5
        assert max(loads) - min(loads) <= longest_unit
        for lane in lanes:  # a GPU takes run 1's units before run 2's
            assert [r for r, _ in lane] == sorted(r for r, _ in lane)


def unit_doc(workload, ratio_by_allocator, gpu):
    runs = []
    for allocator, ratio in ratio_by_allocator.items():
        runs.append({"workload": workload, "allocator": allocator, "status": "ok",
                     "control": False,
                     "result": {"median_step_ms": 10.0, "step_seconds": [0.01] * 3},
                     "derived": {"overhead_ratio": ratio, "paired_step_ratio": 1.0,
                                 "paired_step_ratio_aba": 1.0}})
    return {"meta": {"gpu_ids": [gpu]}, "runs": runs, "comparisons": [{"workload": workload}],
            "failures": []}


def test_merged_units_are_one_run_each(tmp_path):
    files = []
    for run in (1, 2, 3):
        docs = [unit_doc("a", {"native": 1.2, "vramledger": 1.0 + run / 1000}, str(run)),
                unit_doc("b", {"native": 1.1, "vramledger": 1.01}, str(run + 3))]
        merged = pr.merge(docs)
        assert len(merged["runs"]) == 4 and len(merged["comparisons"]) == 2
        assert merged["meta"]["gpu_ids"] == sorted({str(run), str(run + 3)})
        path = tmp_path / f"run{run}.json"
        path.write_text(json.dumps(merged))
        files.append(path)
    rows = {(r["workload"], r["allocator"]): r for r in mrt.rows_of(mrt.load_runs(files))}
    assert rows[("a", "vramledger")]["runs"] == [1, 2, 3]
    assert rows[("a", "vramledger")]["ratios"] == [1.001, 1.002, 1.003]
    assert rows[("b", "vramledger")]["ratios"] == [1.01] * 3

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


def _e2e_runs_invocations(tmp_path, *args):
    """Runs scripts/e2e_runs.sh with a stand-in python3 that only records how it was called."""
    import os
    import subprocess
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    fake = bin_dir / "python3"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n")
    fake.chmod(0o755)
    script = Path(__file__).resolve().parents[2] / "scripts" / "e2e_runs.sh"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    subprocess.run(["bash", str(script), "--out", str(tmp_path / "out"), "--runs", "1", *args],
                   env=env, capture_output=True, text=True, timeout=60)
    return calls.read_text().splitlines()


def test_e2e_runs_together_gives_each_allocator_a_gpu_when_there_are_enough(tmp_path):
    calls = _e2e_runs_invocations(tmp_path, "--together", "--gpus", "3",
                                  "--allocators", "vramledger,native-again")  # + native = 3
    compare = [c for c in calls if "compare_allocators.py" in c]
    assert len(compare) == 1 and "--together" in compare[0] and "--gpus 3" in compare[0]
    assert not any("parallel_runs.py" in c for c in calls)


def test_e2e_runs_together_on_fewer_gpus_spreads_units_over_them(tmp_path):
    calls = _e2e_runs_invocations(tmp_path, "--together", "--gpus", "2",
                                  "--allocators", "native,vramledger,native-again",
                                  "--hold", "vramledger")
    assert len(calls) == 1 and "parallel_runs.py" in calls[0] and "--together" in calls[0]
    assert "--hold vramledger" in calls[0]

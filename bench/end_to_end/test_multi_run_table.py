"""Tests of multi_run_table.py on hand-made compare_allocators documents (no GPU, no torch)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_allocators as ca  # noqa: E402
import multi_run_table as mrt  # noqa: E402


def result(reserved, requested, steps, warmup=1, per_step=None):
    out = {"status": "ok", "peak_reserved_bytes": reserved, "peak_requested_bytes": requested,
           "step_seconds": steps, "warmup": warmup,
           "median_step_ms": 1e3 * sorted(steps[warmup:])[len(steps[warmup:]) // 2]}
    if per_step is not None:
        out["per_step"] = per_step
    return out


def document(tmp_path, name, runs):
    records = [{"workload": w, "allocator": a, "status": "ok", "control": False, "result": r}
               for (w, a), r in runs.items()]
    for record in records:   # the figures compare_allocators derives for every run it keeps
        native = next(n for n in records if n["workload"] == record["workload"]
                      and n["allocator"] == "native")
        again = next((n for n in records if n["workload"] == record["workload"]
                      and n["allocator"] == "native-again"), None)
        record["derived"] = ca.derive_figures(record, native, again)
    records.append({"workload": "w", "allocator": "native", "status": "ok", "control": True,
                    "result": result(1, 1, [9.0, 9.0]),
                    "derived": {}})   # a control run: not a run of the table
    records.append({"workload": "w", "allocator": "broken", "status": "failed"})
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"runs": records}))
    return path


# Steady steps: peak reserved (column 1) unchanged; the running driver-call totals (columns 2-4)
# grow by 3 + 1 + 0 in step 2 (steady) and by 10 + 0 + 5 in step 3 (a new peak: not counted).
PER_STEP = [[100, 100, 5, 0, 5], [90, 100, 8, 1, 5], [120, 120, 18, 1, 10]]


def test_table_of_three_runs(tmp_path):
    paths = []
    for run, reserved in enumerate((1010, 1012, 1030), start=1):
        mine = result(reserved, 1000, [1.0, 0.09, 0.22, 0.30], per_step=PER_STEP)
        mine["vramledger_stats"] = {"per_timed_step": {"maps": 1.0, "host_waits": run / 4}}
        paths.append(document(tmp_path, f"run{run}", {
            ("w", "native"): result(2000, 1000, [1.0, 0.10, 0.20, 0.30]),
            ("w", "vramledger"): mine,
        }))
    rows = mrt.rows_of(mrt.load_runs(paths))
    assert [(r["workload"], r["allocator"]) for r in rows] == [("w", "native"), ("w", "vramledger")]
    mine = rows[1]
    assert mine["runs"] == [1, 2, 3]
    assert mine["ratios"] == pytest.approx([1.010, 1.012, 1.030])
    assert mine["paired"] == pytest.approx([1.0, 1.0, 1.0])       # median of 0.9, 1.1, 1.0
    assert mine["steady"] == pytest.approx([4.0, 4.0, 4.0])        # one steady step, 4 calls
    assert mine["waits"] == pytest.approx([0.25, 0.5, 0.75])
    assert rows[0]["waits"] == [None, None, None]
    assert mrt.verdict(mine, 1.02, 0.005, 3) == "ratio 1.0300 > 1.02; spread 0.0200 > 0.005"
    assert mrt.verdict(rows[0], 1.02, 0.005, 3) == "reference"
    table = mrt.render(rows, 1.02, 0.005, 3)
    assert "| w | vramledger | 1 / 2 / 3 | 1.0100 / 1.0120 / 1.0300 | 0.0200 |" in table
    assert "| 4.0 / 4.0 / 4.0 | 0.25 / 0.50 / 0.75 |" in table
    assert "| w | native | 1 / 2 / 3 |" in table and "| — | — | reference |" in table


def test_slower_steps_fail_the_goal_by_the_median_of_the_runs(tmp_path):
    paths = []
    for run, slowdown in enumerate((1.3, 1.1, 0.9), start=1):
        paths.append(document(tmp_path, f"run{run}", {
            ("w", "native"): result(2000, 1000, [1.0, 0.1, 0.1, 0.1]),
            ("w", "vramledger"): result(1005, 1000, [1.0] + [0.1 * slowdown] * 3),
        }))
    mine = mrt.rows_of(mrt.load_runs(paths))[1]
    assert mine["paired"] == pytest.approx([1.3, 1.1, 0.9])
    assert mrt.verdict(mine, 1.02, 0.005, 3) == "step 1.100x > 1.00x"
    assert mrt.verdict(mine, 1.02, 0.005, 3, max_step=1.2) == "meets"


def test_a_run_missing_from_an_invocation_is_counted_short(tmp_path):
    first = document(tmp_path, "a", {("w", "native"): result(2, 1, [1, 1]),
                                     ("w", "vramledger"): result(1010, 1000, [1, 1])})
    second = document(tmp_path, "b", {("w", "native"): result(2, 1, [1, 1])})
    rows = mrt.rows_of(mrt.load_runs([first, second]))
    assert rows[1]["runs"] == [1]
    assert mrt.verdict(rows[1], 1.02, 0.005, 3) == "1 of 3 runs"
    assert rows[1]["steady"] == [None]   # no per_step record: shown as "—", not as 0


def test_cli_writes_the_table_and_refuses_other_json(tmp_path, capsys):
    good = document(tmp_path, "a", {("w", "native"): result(2, 1, [1, 1]),
                                    ("w", "vramledger"): result(1005, 1000, [1, 1])})
    out = tmp_path / "table.md"
    assert mrt.main([str(good), "--md", str(out), "--min-runs", "1"]) == 0
    assert "| meets |" in out.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"runs": [{"status": "ok", "workload": "w"}]}))
    assert mrt.main([str(bad)]) == 2
    assert "not a compare_allocators.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mrt.main([str(tmp_path / "missing.json")])


def test_with_the_a_a_control_the_step_verdict_is_against_both_natives(tmp_path):
    # The allocator ran between two natives; the series got faster as it went (position effect):
    # against the first native alone it looks 1.1x slower, against the mean of both it is 1.0x.
    paths = []
    for run in (1, 2, 3):
        paths.append(document(tmp_path, f"run{run}", {
            ("w", "native"): result(2000, 1000, [1.0, 0.10, 0.10, 0.10]),
            ("w", "vramledger"): result(1005, 1000, [1.0, 0.11, 0.11, 0.11]),
            ("w", "native-again"): result(2000, 1000, [1.0, 0.12, 0.12, 0.12]),
        }))
    rows = {r["allocator"]: r for r in mrt.rows_of(mrt.load_runs(paths))}
    mine = rows["vramledger"]
    assert mine["paired"] == pytest.approx([1.1] * 3)
    assert mine["aba"] == pytest.approx([1.0] * 3)
    assert mrt.verdict(mine, 1.02, 0.005, 3) == "meets"
    assert rows["native-again"]["paired"] == pytest.approx([1.2] * 3)
    assert mrt.verdict(rows["native-again"], 1.02, 0.005, 3).startswith("A/A control")
    table = mrt.render(list(rows.values()), 1.02, 0.005, 3)
    assert "| 1.100 / 1.100 / 1.100 | 1.000 / 1.000 / 1.000 |" in table


def test_hold_fails_only_on_the_memory_goals_of_the_held_allocator(tmp_path, capsys):
    def runs(vram_reserved):
        return [document(tmp_path, f"run{run}-{reserved}", {
            ("w", "native"): result(2000, 1000, [1.0, 0.1, 0.1]),
            ("w", "expandable"): result(1100, 1000, [1.0, 0.1, 0.1]),   # not held: 1.10 is fine
            ("w", "vramledger"): result(reserved, 1000, [1.0, 0.2, 0.2]),  # 2x slower: not held
        }) for run, reserved in enumerate(vram_reserved, start=1)]
    good = [str(p) for p in runs((1010, 1012, 1011))]
    assert mrt.main(good + ["--hold", "vramledger"]) == 0
    assert "HOLD vramledger: every workload meets the memory goals" in capsys.readouterr().out
    over = [str(p) for p in runs((1010, 1030, 1011))]
    assert mrt.main(over + ["--hold", "vramledger"]) == 1
    out = capsys.readouterr().out
    assert "FAILURE: vramledger: w: ratio 1.0300 > 1.02" in out
    assert "FAILURE: vramledger: w: spread 0.0200 > 0.005" in out
    assert mrt.main(good[:2] + ["--hold", "vramledger"]) == 1           # two runs of three
    assert "w: 2 of 3 runs" in capsys.readouterr().out
    assert mrt.main(good + ["--hold", "vramledger-pages"]) == 1         # never ran: not a pass

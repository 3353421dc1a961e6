"""step_timeline.py's reading of a trace, on hand-made events (no GPU, no torch)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import step_timeline as st  # noqa: E402


def op(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid}


def kernel(ts, dur):
    return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur, "tid": 7}


def test_merged_intervals_joins_overlaps_and_keeps_holes():
    assert st.merged_intervals([(5, 8), (0, 2), (1, 3), (8, 9)]) == [(0, 3), (5, 9)]


def test_busy_idle_and_gaps_are_charged_to_the_innermost_operator():
    events = [
        op("aten::linear", 0, 100), op("aten::empty", 40, 30),   # CPU in empty while GPU idles
        op("aten::add", 100, 10),
        kernel(0, 30), kernel(20, 20),        # busy 0-40
        kernel(80, 20),                       # gap 40-80 (40 us) at mid 60: aten::empty
        kernel(105, 5),                       # gap 100-105: under the threshold
        {"ph": "X", "cat": "gpu_memcpy", "name": "c", "ts": 110, "dur": 10, "tid": 8},
    ]
    figures = st.gpu_timeline(events, (0, 150), gap_us=20)
    assert figures["wall_us"] == 150
    assert figures["busy_us"] == 40 + 20 + 5 + 10
    assert figures["idle_us"] == 150 - 75
    # 40-80 in aten::empty; 120-150 after the last operator ended.
    assert figures["gaps"] == 2
    assert figures["gap_idle_us"] == 40 + 30
    assert figures["idle_by_operator"]["aten::empty"] == {"gaps": 1, "idle_us": 40}
    assert figures["idle_by_operator"]["(between operators)"] == {"gaps": 1, "idle_us": 30}


def test_the_launching_thread_is_the_one_with_most_operator_time():
    events = [op("a", 0, 10, tid=1), op("b", 0, 50, tid=2), op("c", 60, 5, tid=1)]
    assert st.launching_thread(events) == 2
    assert st.launching_thread([kernel(0, 1)]) is None


def test_window_spans_operators_and_gpu_work():
    events = [op("a", 10, 10), kernel(15, 30), {"ph": "X", "cat": "python_function", "ts": 0,
                                                 "dur": 100}]
    assert st.profiled_window(events) == (10, 45)


def test_render_lists_each_profiled_step_and_the_errors():
    runs = [{"allocator": "native", "unprofiled_step_ms": [10.0, 12.0],
             "profiled": [{"wall_us": 11000, "busy_us": 9000, "idle_us": 2000, "gaps": 3,
                           "idle_by_operator": {"aten::mm": {"gaps": 3, "idle_us": 1500}}}]},
            {"allocator": "vramledger", "error": "exit 1"}]
    text = st.render(runs)
    assert "| 1 | native | 11.0 | 11.0 | 9.0 | 2.0 | 3 | - |" in text
    assert "| 2 | vramledger | error: exit 1" in text
    assert "aten::mm 1.50 ms (3)" in text


def test_step_table_has_a_row_per_step_and_the_maps_of_vramledger_runs():
    runs = [{"allocator": "native", "steps": [{"shape": {"batch": 16}, "ms": 10.0},
                                              {"shape": {"batch": 96}, "ms": 50.0}]},
            {"allocator": "vramledger", "steps": [{"shape": {"batch": 16}, "ms": 11.0, "maps": 0},
                                                  {"shape": {"batch": 96}, "ms": 55.5,
                                                   "maps": 40, "host_waits": 2}]},
            {"allocator": "vramledger", "error": "exit 1"}]
    lines = st.step_table(runs)
    assert lines[0] == "| step | shape | 1 native | 2 vramledger |"
    assert lines[2] == "| 0 | batch=16 | 10.0 | 11.0 (0) |"
    assert lines[3] == "| 1 | batch=96 | 50.0 | 55.5 (40, 2w) |"

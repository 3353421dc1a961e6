#!/usr/bin/env python3
"""Tests of pivot.py on testdata/synthetic_gpu_latency.json.

The fixture is SYNTHETIC: round, invented figures (including one invented failure and one case
with repetitions whose median differs from its mean) so that every expected cell below can be
worked out by hand. It is not a measurement and must never be quoted as one.

    python3 bench/gpu_latency/test_pivot.py      (also `meson test gpu_latency_pivot`)
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "testdata" / "synthetic_gpu_latency.json"
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(HERE))
import pivot  # noqa: E402


def run_pivot(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = pivot.main(list(args))
    return status, out.getvalue(), err.getvalue()


class PivotOnSyntheticFixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        tmp = Path(cls.tmp.name)
        cls.md_path, cls.svg_path = tmp / "out.md", tmp / "out.svg"
        cls.status, cls.stdout, _ = run_pivot(str(FIXTURE), "--md", str(cls.md_path),
                                              "--svg", str(cls.svg_path), "--plain-svg")
        cls.md = cls.md_path.read_text()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_exit_status_and_summary_line(self):
        self.assertEqual(self.status, 0)
        self.assertEqual(
            self.stdout.strip().splitlines()[-1],
            "summary: mixed ns/pair vramledger-vmm=250 torch-native=500 cudaMallocAsync=600 "
            "(vmm/torch-native=0.50, vmm/cudaMallocAsync=0.42); 77 cases ok, 1 failed")

    def test_latency_rows(self):
        # Columns: 512B 64KiB 1MiB 16MiB 256MiB mixed "4 streams".
        self.assertIn("| vramledger-vmm | 200 | 200 | 200 | 200 | 400 | 250 | 375 |", self.md)
        # cudaMalloc's figures are in microseconds in the JSON: converted to ns.
        self.assertIn("| cudaMalloc | 60,000 | 60,000 | 60,000 | 60,000 | 120,000 | 60,000 | 90,000 |",
                      self.md)
        # torch-native's "4 streams" ran 3 repetitions (600, 700, 1700; mean 1000): the median.
        self.assertIn("| torch-native | 800 | 800 | 800 | 800 | 1,600 | 500 | 700 |", self.md)
        # The invented failure shows as such, never as a number.
        self.assertIn("| vramledger-malloc_async | 300 | 300 | 300 | 300 | failed | 300 | 450 |",
                      self.md)

    def test_rows_follow_the_fixed_allocator_order(self):
        rows = [line.split("|")[1].strip() for line in self.md.split("## Host ns")[1]
                .split("## Mixed")[0].splitlines() if line.startswith("| ")]
        self.assertEqual(rows, ["allocator", "vramledger-vmm", "vramledger-cuda_malloc",
                                "vramledger-malloc_async", "torch-native", "cudaMallocAsync",
                                "cudaMalloc"])

    def test_threads_table(self):
        # N threads: wall ns per op = mixed * N / 2 in the fixture; rate = 1e9 / that.
        self.assertIn("| allocator | 1 thr | 2 thr | 4 thr | 8 thr | 16 thr |", self.md)
        self.assertIn("| torch-native | 500 (2.00) | 500 (2.00) | 1,000 (1.00) | 2,000 (0.50) | "
                      "4,000 (0.25) |", self.md)

    def test_ratio_tables(self):
        torch_section = self.md.split("## Ratio to torch-native")[1].split("## Ratio to")[0]
        self.assertIn("| vramledger-vmm | 0.25 | 0.25 | 0.25 | 0.25 | 0.25 | 0.50 | 0.54 | 0.50 | "
                      "0.50 | 0.50 | 0.50 |", torch_section)
        # The failed cell has no ratio; the reference has no row of its own.
        self.assertIn("| vramledger-malloc_async | 0.38 | 0.38 | 0.38 | 0.38 | — |", torch_section)
        self.assertNotIn("| torch-native |", torch_section)
        async_section = self.md.split("## Ratio to cudaMallocAsync")[1].split("## Growth")[0]
        self.assertIn("| vramledger-vmm | 0.33 | 0.33 | 0.33 | 0.33 | 0.33 | 0.42 |", async_section)
        self.assertIn("| torch-native | 1.33 |", async_section)

    def test_growth_table(self):
        self.assertIn("| allocator | 1GiB total ms | 1GiB alloc ms | 8GiB total ms | 8GiB alloc ms |",
                      self.md)
        self.assertIn("| torch-expandable | 50 | 25 | 400 | 200 |", self.md)
        self.assertIn("| cudaMalloc | 10 | 5 | 80 | 40 |", self.md)
        # vramledger-malloc_async has no growth case: no row.
        self.assertNotIn("| vramledger-malloc_async | ", self.md.split("## Growth")[1].split("##")[0])

    def test_failed_cases_and_provenance(self):
        self.assertIn("- vramledger-malloc_async / 256MiB: out of memory: invented failure", self.md)
        self.assertIn("**Not GPU measurements:**", self.md)  # the fixture's context says synthetic

    def test_plain_svg_has_one_bar_per_figure(self):
        root = ET.parse(self.svg_path).getroot()
        bars = [r for r in root.iter("{http://www.w3.org/2000/svg}rect")
                if r.find("{http://www.w3.org/2000/svg}title") is not None]
        # Latency panel: 6 allocators x 11 cases - 1 failed; growth panel: 6 allocators x 2.
        self.assertEqual(len(bars), 6 * 11 - 1 + 6 * 2)
        for bar in bars:
            self.assertGreater(float(bar.get("height")), 0)

    @unittest.skipIf(importlib.util.find_spec("matplotlib") is None, "matplotlib not installed")
    def test_matplotlib_svg(self):
        with tempfile.TemporaryDirectory() as tmp:
            svg = Path(tmp) / "chart.svg"
            status, _, _ = run_pivot(str(FIXTURE), "--md", str(Path(tmp) / "x.md"), "--svg", str(svg))
            self.assertEqual(status, 0)
            ET.parse(svg)  # well-formed


class NameParsing(unittest.TestCase):
    def test_google_benchmark_suffixes_are_dropped(self):
        parsed = pivot.parse_name("BM_Mixed/torch-native/min_time:0.200/real_time/threads:8", 8)
        self.assertEqual((parsed.allocator, parsed.case, parsed.threads), ("torch-native", "mixed x8", 8))
        parsed = pivot.parse_name("BM_Pair/vramledger-vmm/64KiB/min_time:0.050/real_time", 1)
        self.assertEqual((parsed.family, parsed.allocator, parsed.case), ("BM_Pair", "vramledger-vmm", "64KiB"))
        parsed = pivot.parse_name("BM_Growth/cudaMalloc/8GiB/iterations:4/real_time", 1)
        self.assertEqual(parsed.case, "8GiB")
        self.assertEqual(pivot.parse_name("BM_Streams/cudaMallocAsync/4/real_time", 1).case, "4 streams")
        self.assertEqual(pivot.parse_name("BM_Mixed/x/real_time/threads:1", 1).case, "mixed")

    def test_foreign_names_are_ignored(self):
        self.assertIsNone(pivot.parse_name("FixedSize/bytes:512/paged:1", 1))
        self.assertIsNone(pivot.parse_name("BM_Pair", 1))


class TraceCases(unittest.TestCase):
    """BM_Trace (a recorded program's operations): its own table. Invented figures."""

    def test_trace_table(self):
        benchmarks = [
            {"name": "BM_Trace/vramledger-vmm/t5_train.e2e/min_time:0.200/real_time",
             "run_type": "iteration", "real_time": 40.0, "time_unit": "ms",
             "ns_per_op": 300.0, "calls_per_kop": 0.5},
            {"name": "BM_Trace/torch-native/t5_train.e2e/min_time:0.200/real_time",
             "run_type": "iteration", "real_time": 20.0, "time_unit": "ms", "ns_per_op": 150.0},
            {"name": "BM_Trace/cudaMallocAsync/t5_train.e2e/min_time:0.200/real_time",
             "run_type": "iteration", "error_occurred": True, "error_message": "out of memory"},
        ]
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "trace.json"
            source.write_text(json.dumps({"context": {}, "benchmarks": benchmarks}))
            md = Path(tmp) / "trace.md"
            status, self.last_stdout, _ = run_pivot(str(source), "--md", str(md), "--svg",
                                                    str(Path(tmp) / "t.svg"), "--plain-svg")
            text = md.read_text()
        self.assertEqual(status, 0)
        self.assertIn("## Recorded programs (BM_Trace)", text)
        self.assertIn("| allocator | t5_train.e2e ns/op | t5_train.e2e calls/kop |", text)
        self.assertIn("| vramledger-vmm | 300 (2.00x) | 0.50 |", text)
        self.assertIn("| torch-native | 150 | — |", text)
        self.assertIn("| cudaMallocAsync | failed | — |", text)
        self.assertIn("; traces t5_train.e2e vmm/torch-native=2.00;", self.last_stdout)
        # Not mistaken for a latency column.
        self.assertNotIn("trace t5", text.split("## Recorded programs")[0])

    def test_trace_cases_alone_make_an_svg_with_or_without_matplotlib(self):
        benchmarks = [{"name": "BM_Trace/torch-native/t5/min_time:0.200/real_time",
                       "run_type": "iteration", "real_time": 20.0, "time_unit": "ms",
                       "ns_per_op": 150.0}]
        for plain in (True, False):
            with tempfile.TemporaryDirectory() as tmp:
                source = Path(tmp) / "trace.json"
                source.write_text(json.dumps({"context": {}, "benchmarks": benchmarks}))
                svg = Path(tmp) / "t.svg"
                args = [str(source), "--md", str(Path(tmp) / "t.md"), "--svg", str(svg)]
                status, _, _ = run_pivot(*(args + (["--plain-svg"] if plain else [])))
                self.assertEqual(status, 0)
                ET.parse(svg)  # well-formed

    def test_trace_name(self):
        parsed = pivot.parse_name("BM_Trace/torch-native/gpt2_train.e2e/min_time:0.200/real_time", 1)
        self.assertEqual((parsed.family, parsed.case), ("BM_Trace", "trace gpt2_train.e2e"))


class BadInput(unittest.TestCase):
    def test_missing_empty_and_malformed_files_fail_clearly(self):
        with tempfile.TemporaryDirectory() as tmp:
            status, _, err = run_pivot(str(Path(tmp) / "absent.json"))
            self.assertEqual(status, 1)
            self.assertIn("cannot read", err)
            empty = Path(tmp) / "empty.json"
            empty.write_text(json.dumps({"context": {}, "benchmarks": []}))
            status, _, err = run_pivot(str(empty))
            self.assertEqual(status, 1)
            self.assertIn("holds no vramledger-bench-gpu-latency benchmark", err)
            broken = Path(tmp) / "broken.json"
            broken.write_text('{"benchmarks": [')
            self.assertEqual(run_pivot(str(broken))[0], 1)


if __name__ == "__main__":
    unittest.main()

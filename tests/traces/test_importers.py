"""Importers of foreign allocation logs into workload traces: PyTorch snapshots and RMM logs.

Run by Meson (suite unit) as: python3 test_importers.py [path to vramledger-replay]; with the
replay binary given, every converted trace is also read back by the C++ reader.
"""

import gzip
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "traces"))

import rmm_log_to_workload as rmm  # noqa: E402
import torch_snapshot_to_workload as torch_snapshot  # noqa: E402

REPLAY = os.environ.get("VRAMLEDGER_REPLAY") or None

RMM_LOG = """Thread,Time,Action,Pointer,Size,Stream
140,09:00:00:000001,allocate,0x7f0000000000,1000,0x0
140,09:00:00:000002,allocate,0x7f0000100000,3000000,0x55
140,09:00:00:000003,allocate failure,0x0,99999999999,0x0
140,09:00:00:000004,free,0x7f0000000000,1000,0x0
140,09:00:00:000005,allocate,0x7f0000000000,2048,0x0
140,09:00:00:000006,free,0x7f0000100000,3000000,0x55
"""


def read_back(test, path):
    """The C++ reader accepts the file and finds the same peak requested."""
    if REPLAY is None:
        return
    result = subprocess.run([REPLAY, "--check", "--conf", "", str(path)], capture_output=True,
                            text=True)
    test.assertEqual(result.returncode, 0, result.stderr)


class RmmLogTest(unittest.TestCase):
    def test_converts_allocations_frees_and_streams(self):
        lines, summary = rmm.convert(RMM_LOG.splitlines(keepends=True))
        self.assertEqual(lines, ["s 0 0", "a 0 1000 0", "s 1 85", "a 1 3000000 1", "f 0",
                                 "a 2 2048 0", "f 1"])
        self.assertEqual(summary["peak_requested_bytes"], 3000000 + 2048)
        self.assertEqual(summary["allocation_failures_skipped"], 1)
        self.assertEqual(summary["still_live"], 1)

    def test_errors_name_the_line(self):
        bad_free = RMM_LOG + "140,09:00:00:000007,free,0x1234,8,0x0\n"
        with self.assertRaisesRegex(rmm.RmmLogError, "line 8: free of 0x1234"):
            rmm.convert(bad_free.splitlines(keepends=True))
        bad_size = "Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,ten,0x0\n"
        with self.assertRaisesRegex(rmm.RmmLogError, "line 2: bad size"):
            rmm.convert(bad_size.splitlines(keepends=True))
        with self.assertRaisesRegex(rmm.RmmLogError, "missing column"):
            rmm.convert(["a,b,c\n", "1,2,3\n"])
        with self.assertRaisesRegex(rmm.RmmLogError, "unknown action"):
            rmm.convert(["Thread,Time,Action,Pointer,Size,Stream\n", "1,t,grow,0x10,8,0x0\n"])

    def test_written_trace_reads_back(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "rmm.vlt.gz"
            rmm.write_workload(RMM_LOG.splitlines(keepends=True), path, "test")
            with gzip.open(path, "rt") as f:
                self.assertEqual(f.readline().strip(), rmm.FORMAT_LINE)
            read_back(self, path)


class TorchSnapshotTest(unittest.TestCase):
    SNAPSHOT = {"device_traces": [[
        {"action": "segment_alloc", "addr": 0, "size": 2097152, "stream": 0},
        {"action": "alloc", "addr": 0, "size": 1000, "stream": 0},
        {"action": "alloc", "addr": 1024, "size": 512, "stream": 7},
        {"action": "free_requested", "addr": 0, "size": 1000, "stream": 0},
        {"action": "free_completed", "addr": 0, "size": 1000, "stream": 0},
        {"action": "free_requested", "addr": 1024, "size": 512, "stream": 7},
        {"action": "alloc", "addr": 0, "size": 2048, "stream": 0},
        {"action": "free_completed", "addr": 1024, "size": 512, "stream": 7},
    ]]}

    def test_delayed_frees_become_r_and_c(self):
        lines, summary = torch_snapshot.convert(self.SNAPSHOT)
        self.assertEqual(lines, ["s 0 0", "a 0 1000 0", "s 1 7", "a 1 512 1", "f 0", "r 1",
                                 "a 2 2048 0", "c 1"])
        # The block awaiting the other stream still counts: 512 + 2048.
        self.assertEqual(summary["peak_requested_bytes"], 2560)
        self.assertEqual(summary["torch_peak_segment_bytes"], 2097152)

    def test_snapshot_without_history_is_refused(self):
        with self.assertRaisesRegex(torch_snapshot.SnapshotError, "device_traces"):
            torch_snapshot.convert({"segments": []})

    def test_written_trace_reads_back(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "torch.vlt"
            torch_snapshot.write_workload(self.SNAPSHOT, path, "test")
            read_back(self, path)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        REPLAY = sys.argv.pop(1)
    unittest.main()

"""Importers of foreign allocation logs into workload traces: PyTorch snapshots and RMM logs.

Run by Meson (suite unit) as: python3 test_importers.py [path to vramledger-replay]; with the
replay binary given, every converted trace is also read back by the C++ reader.
"""

import gzip
import os
import pickle
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


class RmmHostileInputTest(unittest.TestCase):
    """Bad bytes and out-of-range numbers end in RmmLogError naming the line, not tracebacks."""

    HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"

    def test_bytes_that_are_not_utf8(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bad.csv"
            path.write_bytes(self.HEADER.encode() + b"1,t,allocate,0x10,8,0x0\n\xff\xfe,\x80\n")
            with open(path, "rb") as binary:
                with self.assertRaisesRegex(rmm.RmmLogError, "line 3: not UTF-8 text"):
                    rmm.convert(rmm.decoded_lines(binary))
            with open(path, newline="") as rows:  # a text-mode file: the line is approximate
                with self.assertRaisesRegex(rmm.RmmLogError, "not UTF-8 text"):
                    rmm.convert(rows)

    def test_nul_bytes(self):
        # Python < 3.11's csv refuses NUL itself ("not CSV"); later ones pass it to the field.
        with self.assertRaisesRegex(rmm.RmmLogError, "line 2: (not CSV|bad pointer)"):
            rmm.convert([self.HEADER, "1,t,allocate,0x10\x00,8,0x0\n"])

    def test_field_beyond_the_csv_limit(self):
        with self.assertRaisesRegex(rmm.RmmLogError, "line 2: not CSV: field larger"):
            rmm.convert([self.HEADER, "1,t,allocate," + "1" * 200000 + ",8,0x0\n"])

    def test_sizes_and_streams_the_format_cannot_hold(self):
        with self.assertRaisesRegex(rmm.RmmLogError, "line 2: allocation of size 17592186044417"):
            rmm.convert([self.HEADER, "1,t,allocate,0x10,17592186044417,0x0\n"])
        with self.assertRaisesRegex(rmm.RmmLogError, "line 2: allocation of size -8"):
            rmm.convert([self.HEADER, "1,t,allocate,0x10,-8,0x0\n"])
        with self.assertRaisesRegex(rmm.RmmLogError, "line 2: stream -1"):
            rmm.convert([self.HEADER, "1,t,allocate,0x10,8,-1\n"])
        with self.assertRaisesRegex(rmm.RmmLogError, "line 2: bad size"):
            rmm.convert([self.HEADER, "1,t,allocate,0x10," + "9" * 5000 + ",0x0\n"])

    def test_too_many_streams(self):
        rows = [self.HEADER] + [f"1,t,allocate,{i + 1},8,{i}\n" for i in range(rmm.MAX_STREAMS + 1)]
        with self.assertRaisesRegex(rmm.RmmLogError, "more than 4096 streams"):
            rmm.convert(rows)

    def test_command_line_reports_bad_bytes_without_traceback(self):
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "bad.csv"
            log.write_bytes(self.HEADER.encode() + b"\xff\xff\n")
            converted = subprocess.run([sys.executable, str(ROOT / "bench" / "traces" /
                                                            "rmm_log_to_workload.py"),
                                        str(log), str(Path(tmp) / "out.vlt")],
                                       capture_output=True, text=True)
            self.assertIn("line 2: not UTF-8 text", converted.stderr)
            result = subprocess.run([sys.executable, str(ROOT / "bench" / "traces" /
                                                         "rmm_log_to_workload.py"),
                                     str(log), str(Path(tmp) / "out.vlt")],
                                    capture_output=True, text=True)
            self.assertEqual(result.returncode, 1)
            self.assertIn("not UTF-8 text", result.stderr)
            self.assertNotIn("Traceback", result.stderr)


class _RunsCode:
    """Pickles to 'call os.system(command)' when loaded, as a crafted snapshot would."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class TorchSnapshotSecurityTest(unittest.TestCase):
    """Snapshots are untrusted input: loading one never runs code, and a wrong shape is an
    error naming the entry."""

    def test_crafted_pickle_does_not_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            marker = Path(tmp) / "ran"
            data = pickle.dumps({"device_traces": [[_RunsCode(f"touch {marker}")]]})
            with self.assertRaisesRegex(torch_snapshot.SnapshotError,
                                        "refusing to load (posix|os).system"):
                torch_snapshot.loads_snapshot(data)
            self.assertFalse(marker.exists(), "the pickle's code ran")

    def test_crafted_pickle_through_the_command_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            marker = Path(tmp) / "ran"
            snapshot = Path(tmp) / "evil.pickle"
            snapshot.write_bytes(pickle.dumps(_RunsCode(f"touch {marker}")))
            result = subprocess.run([sys.executable, str(ROOT / "bench" / "traces" /
                                                         "torch_snapshot_to_workload.py"),
                                     str(snapshot), str(Path(tmp) / "out.vlt")],
                                    capture_output=True, text=True)
            self.assertEqual(result.returncode, 1, result.stderr)
            self.assertIn("refusing to load", result.stderr)
            self.assertNotIn("Traceback", result.stderr)
            self.assertFalse(marker.exists(), "the pickle's code ran")

    def test_every_class_is_refused_even_harmless_ones(self):
        import collections
        data = pickle.dumps({"device_traces": [collections.OrderedDict()]})
        with self.assertRaisesRegex(torch_snapshot.SnapshotError, "refusing to load collections"):
            torch_snapshot.loads_snapshot(data)

    def test_plain_data_loads(self):
        snapshot = dict(TorchSnapshotTest.SNAPSHOT, segments=[{"frames": (1, 2.5, None, True)}])
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            self.assertEqual(torch_snapshot.loads_snapshot(pickle.dumps(snapshot, protocol)),
                             snapshot)

    def test_memo_bomb_is_bounded(self):
        # PROTO 2, EMPTY_DICT, LONG_BINPUT 2^30, STOP: the C unpickler would size its memo to
        # 2^31 entries (16 GiB, every page touched) for these 9 bytes.
        bomb = b"\x80\x02}r" + (1 << 30).to_bytes(4, "little") + b"."
        with self.assertRaisesRegex(torch_snapshot.SnapshotError, "more than .* bytes of memory"):
            torch_snapshot.loads_snapshot(bomb)
        # The limit is lifted again afterwards: a normal load still works.
        self.assertEqual(torch_snapshot.loads_snapshot(pickle.dumps({"a": 1})), {"a": 1})

    def test_not_a_pickle(self):
        for data in (b"", b"not a pickle", b"\x80\x05\x95", pickle.dumps([1, 2])[:-3]):
            with self.assertRaises(torch_snapshot.SnapshotError):
                torch_snapshot.loads_snapshot(data)

    def test_wrong_shapes_name_the_entry(self):
        cases = [
            ([1, 2], "holds a list, not a dict"),
            ({"device_traces": "x"}, "no 'device_traces'"),
            ({"device_traces": [7]}, r"device_traces\[0\] is a int"),
            ({"device_traces": [["alloc"]]}, r"device_traces\[0\]\[0\] is a str"),
            ({"device_traces": [[{"action": 3}]]}, "'action' is 3"),
            ({"device_traces": [[{"action": "alloc", "addr": "0x10", "size": 8}]]},
             "'addr' is '0x10'"),
            ({"device_traces": [[{"action": "alloc", "addr": 16, "size": -8}]]}, "'size' is -8"),
            ({"device_traces": [[{"action": "alloc", "addr": 16, "size": 8.5}]]}, "'size' is 8.5"),
            ({"device_traces": [[{"action": "alloc", "addr": 16, "size": True}]]},
             "'size' is True"),
            ({"device_traces": [[{"action": "alloc", "addr": 16, "size": 0}]]},
             "allocation of 0 bytes"),
            ({"device_traces": [[{"action": "alloc", "addr": 16, "size": 1 << 45}]]},
             "allocation of 35184372088832 bytes"),
            ({"device_traces": [[{"action": "alloc", "addr": 16, "size": 8, "stream": -1}]]},
             "'stream' is -1"),
            ({"device_traces": [[{"action": "free_requested", "addr": [1]}]]}, "'addr' is"),
        ]
        for snapshot, words in cases:
            with self.subTest(words=words):
                with self.assertRaisesRegex(torch_snapshot.SnapshotError, words):
                    torch_snapshot.convert(torch_snapshot.loads_snapshot(pickle.dumps(snapshot)))

    def test_negative_or_missing_device(self):
        with self.assertRaisesRegex(torch_snapshot.SnapshotError, "not device -1"):
            torch_snapshot.convert(TorchSnapshotTest.SNAPSHOT, device=-1)
        with self.assertRaisesRegex(torch_snapshot.SnapshotError, "not device 5"):
            torch_snapshot.convert(TorchSnapshotTest.SNAPSHOT, device=5)

    def test_events_the_importer_does_not_read_are_skipped(self):
        snapshot = {"device_traces": [[{"action": "oom", "device_free": 0},
                                       {"action": "snapshot"}]]}
        lines, _ = torch_snapshot.convert(snapshot)
        self.assertEqual(lines, [])


class MutatedInputTest(unittest.TestCase):
    """A small deterministic mutation smoke run over both importers: whatever the bytes, the
    only exception is the importer's own error (no traceback, nothing run)."""

    ITERATIONS = 3000

    @staticmethod
    def mutate(rng, data: bytes) -> bytes:
        data = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            choice = rng.random()
            position = rng.randrange(len(data) + 1)
            if choice < 0.4 and data:
                data[min(position, len(data) - 1)] = rng.randrange(256)
            elif choice < 0.7:
                data[position:position] = bytes([rng.randrange(256)])
            elif data:
                del data[min(position, len(data) - 1)]
        return bytes(data)

    def test_snapshot_pickles(self):
        import random
        rng = random.Random(16)
        seeds = [pickle.dumps(TorchSnapshotTest.SNAPSHOT, protocol)
                 for protocol in range(pickle.HIGHEST_PROTOCOL + 1)]
        for _ in range(self.ITERATIONS):
            data = self.mutate(rng, rng.choice(seeds))
            try:
                torch_snapshot.convert(torch_snapshot.loads_snapshot(data))
            except torch_snapshot.SnapshotError:
                pass

    def test_rmm_logs(self):
        import random
        rng = random.Random(16)
        seed = RMM_LOG.encode()
        for _ in range(self.ITERATIONS):
            data = self.mutate(rng, seed)
            try:
                rmm.convert(rmm.decoded_lines(data.splitlines(keepends=True)))
            except rmm.RmmLogError:
                pass


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

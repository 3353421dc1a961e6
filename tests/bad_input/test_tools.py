"""Hostile input to the command-line tools (issue 16): vramledger-replay, vramledger-report,
vramledger-demo and `vramledger run`. Every case ends in a clear error and a non-zero exit, or
(for inputs that are legal) in a correct result, never in a crash, a hang or a silent exit 0.

Run by Meson (suite unit) as:
    python3 test_tools.py REPLAY REPORT DEMO
(an empty path skips that tool's tests). docs/reliability.md lists each case and its message.
"""

import gzip
import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from vramledger.cli import conf_problem, main as vramledger_main  # noqa: E402

REPLAY = REPORT = DEMO = ""
HEADER = "# vramledger workload trace v1\n"
TIMEOUT = 60  # seconds; every case here takes well under one


def run(args, **kwargs):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=TIMEOUT,
                          **kwargs)


class ToolTest(unittest.TestCase):
    TOOL = None  # the name of the module variable holding the tool's path

    def setUp(self):
        if self.TOOL is not None and not globals()[self.TOOL]:
            self.skipTest(f"{self.TOOL.lower()} not built")
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        if hasattr(self, "tmp"):
            self.tmp.cleanup()

    def trace(self, body, name="t.vlt"):
        path = self.dir / name
        path.write_text(HEADER + body)
        return path

    def expect_error(self, args, words, code=None):
        """The command fails (with `code` when given) and says `words` on stderr."""
        result = run(args)
        self.assertNotEqual(result.returncode, 0, f"{args} succeeded:\n{result.stdout}")
        self.assertGreater(result.returncode, 0, f"{args} died of a signal\n{result.stderr}")
        if code is not None:
            self.assertEqual(result.returncode, code, result.stderr)
        self.assertIn(words, result.stderr)
        return result

    def expect_ok(self, args):
        result = run(args)
        self.assertEqual(result.returncode, 0, f"{args}:\n{result.stderr}")
        return result


BIG_ID = "s 0 0\na 18446744073709551615 100 0\nf 18446744073709551615\n"


class ReplayTest(ToolTest):
    TOOL = "REPLAY"

    def test_id_near_2_pow_64_replays(self):
        result = self.expect_ok([REPLAY, "--conf", "", self.trace(BIG_ID)])
        self.assertIn("paged heap on simulated", result.stdout)

    def test_several_settings_of_one_heap_are_told_apart(self):
        trace = self.trace("s 0 0\na 1 3000000 0\nf 1\n")
        result = self.expect_ok([REPLAY, "--conf", "map_chunk_mb:2", "--conf",
                                 "map_chunk_mb:16", trace])
        self.assertIn("paged heap on simulated [map_chunk_mb:2]", result.stdout)
        self.assertIn("paged heap on simulated [map_chunk_mb:16]", result.stdout)
        alone = self.expect_ok([REPLAY, "--conf", "map_chunk_mb:2", trace])
        self.assertNotIn("[", alone.stdout, "one setting: the label stays as it was")

    def test_account_at_peak_is_the_instant_reserved_peaked(self):
        # Reserved peaks with allocation 2 (operation 2 of 6): both blocks live then, 4,000,000
        # bytes requested; by the end everything is freed.
        trace = self.trace("s 0 0\na 1 1000000 0\na 2 3000000 0\nf 1\na 3 500000 0\nf 2\nf 3\n")
        for lag in ("0", "1"):
            result = self.expect_ok([REPLAY, "--conf", "", "--gpu-lag-ops", lag,
                                     "--report-at-peak", trace])
            self.assertIn(f"at peak reserved: after operation 2 of 6, GPU lag {lag} operations",
                          result.stdout)
            live = next(line for line in result.stdout.splitlines()
                        if "requested by live allocations" in line)
            self.assertTrue(live.endswith(" 4000000"), live)
            self.assertNotIn("different instant", result.stdout)

    def test_dev_zero_is_refused(self):
        self.expect_error([REPLAY, "/dev/zero"], "line longer than 4096 bytes", 2)

    def test_gzip_bomb_is_refused(self):
        bomb = self.dir / "bomb.vlt.gz"
        bomb.write_bytes(gzip.compress(HEADER.encode() + b"\n" * (64 << 20), 9))
        self.expect_error([REPLAY, bomb], "expands more than 100-fold", 2)

    def test_truncated_gzip_is_an_error(self):
        text = HEADER + "s 0 0\n" + "".join(f"a {i} 512 0\nf {i}\n" for i in range(20000))
        data = gzip.compress(text.encode())
        path = self.dir / "cut.vlt.gz"
        path.write_bytes(data[: len(data) // 2])
        self.expect_error([REPLAY, path], "corrupt or truncated gzip data", 2)

    def test_200000_streams_are_refused_at_once(self):
        path = self.trace("".join(f"s {i} {i}\n" for i in range(200000)))
        self.expect_error([REPLAY, path], "t.vlt:4098: more than 4096 streams", 2)

    def test_reader_rejections_name_the_line(self):
        self.expect_error([REPLAY, self.trace("s 0 0\nx 1\n")], "t.vlt:3: unknown record 'x'", 2)
        self.expect_error([REPLAY, self.trace("s 0 0\na 1 0 0\n")], "t.vlt:3: allocation 1 has size 0", 2)
        self.expect_error([REPLAY, self.trace("s 0 0\nf 9\n")], "t.vlt:3: free of id 9", 2)

    def test_missing_trace(self):
        self.expect_error([REPLAY, self.dir / "none.vlt"], "File does not exist")

    def test_config_bounds(self):
        trace = self.trace(BIG_ID)
        self.expect_error([REPLAY, "--conf", "round_bytes:4611686018427387904", trace],
                          "key 'round_bytes' has invalid value '4611686018427387904': at most", 2)
        self.expect_error([REPLAY, "--conf", "round_bytes:8796093022208", trace], "round_bytes", 2)
        self.expect_error([REPLAY, "--conf", "page_mb:4096", trace], "page_mb", 2)
        self.expect_error([REPLAY, "--conf", "span_gb:1000000", trace], "span_gb", 2)
        self.expect_error([REPLAY, "--conf", "large_segment_mb:99999999", trace],
                          "large_segment_mb", 2)

    def test_numeric_flags(self):
        trace = self.trace(BIG_ID)
        for value in ("nan", "inf", "-1", "0", "1e400", "5000", "abc"):
            with self.subTest(value=value):
                self.expect_error([REPLAY, "--capacity-gib", value, trace], "--capacity-gib")
        for value in ("-1", "18446744073709551616", "1e3", "nan", "1000000001"):
            with self.subTest(value=value):
                self.expect_error([REPLAY, "--gpu-lag-ops", value, trace], "--gpu-lag-ops")
        self.expect_ok([REPLAY, "--capacity-gib", "0.5", "--gpu-lag-ops", "10", trace])


class ReportTest(ToolTest):
    TOOL = "REPORT"

    def test_id_near_2_pow_64_reports(self):
        result = self.expect_ok([REPORT, self.trace(BIG_ID), "--json", self.dir / "r.json"])
        self.assertIn("peak requested 100", result.stdout)

    def test_output_that_is_the_input_is_refused(self):
        trace = self.trace(BIG_ID)
        before = trace.read_text()
        self.expect_error([REPORT, trace, "--json", trace], "is the input trace", 2)
        # Through another name for the same file, too.
        link = self.dir / "link.vlt"
        link.symlink_to(trace)
        self.expect_error([REPORT, trace, "--html", link], "is the input trace", 2)
        self.assertEqual(trace.read_text(), before)

    def test_two_outputs_to_one_file_are_refused(self):
        out = self.dir / "r.out"
        self.expect_error([REPORT, self.trace(BIG_ID), "--json", out, "--html", out],
                          "name the same file", 2)

    def test_output_in_a_missing_folder_is_an_error(self):
        self.expect_error([REPORT, self.trace(BIG_ID), "--json", self.dir / "no" / "r.json"],
                          "No such file or directory", 2)

    def test_summary_counts_refused_requests(self):
        trace = self.trace("s 0 0\na 1 2147483648 0\na 2 1024 0\n")
        json_path = self.dir / "refused.json"
        result = run([REPORT, trace, "--capacity-gib", "1", "--json", json_path])
        self.assertEqual(result.returncode, 3, "a report that is not the trace's must not exit 0")
        self.assertIn("refused requests (out of memory) 1 of 2", result.stdout)
        self.assertIn("did not fit", result.stderr)
        self.assertTrue(json_path.stat().st_size > 0, "the report is still written")

    def test_numeric_flags(self):
        trace = self.trace(BIG_ID)
        for value in ("nan", "inf", "-2", "0"):
            with self.subTest(value=value):
                self.expect_error([REPORT, trace, "--capacity-gib", value], "--capacity-gib")
        for value in ("-1", "nan", "1", "100001", "18446744073709551617"):
            with self.subTest(value=value):
                self.expect_error([REPORT, trace, "--samples", value], "--samples")


class DemoTest(ToolTest):
    TOOL = "DEMO"

    def test_trace_with_id_near_2_pow_64(self):
        result = self.expect_ok([DEMO, "--conf", "", "--trace", self.trace(BIG_ID)])
        self.assertIn("2 operations", result.stdout)

    def test_steps_out_of_range(self):
        for value in ("4294967296", "0", "-1", " 1", "1e3", "1000001"):
            with self.subTest(value=value):
                self.expect_error([DEMO, "--steps", value], "--steps", 2)
        self.expect_error([DEMO, "--steps", "4294967296"], "must be between 1 and 1000000", 2)

    def test_seed_and_capacity(self):
        self.expect_error([DEMO, "--seed", "18446744073709551616"], "--seed", 2)
        self.expect_error([DEMO, "--seed", " -1"], "--seed", 2)
        for value in ("nan", "inf", "-1", "1e400"):
            with self.subTest(value=value):
                self.expect_error([DEMO, "--capacity-gib", value], "--capacity-gib", 2)

    def test_unknown_backend(self):
        self.expect_error([DEMO, "--backend", "tpu"],
                          "--backend: expected simulated, cuda_malloc, vmm or malloc_async, "
                          "got 'tpu'", 2)

    def test_write_trace_to_a_missing_folder(self):
        self.expect_error([DEMO, "--steps", "1", "--conf", "", "--write-trace",
                           self.dir / "no" / "t.vlt"], "cannot write: No such file or directory", 2)

    def test_write_trace_writes(self):
        path = self.dir / "t.vlt"
        self.expect_ok([DEMO, "--steps", "1", "--conf", "", "--write-trace", path])
        self.assertTrue(path.read_text().startswith(HEADER))


class RunConfTest(unittest.TestCase):
    """`vramledger run` checks the configuration before it starts the program: a program that
    never imports torch would never report a bad one."""

    def run_cli(self, args, env=None):
        """(exit code, stderr, whether the program started) of `vramledger run ARGS -- PROGRAM`,
        where PROGRAM creates a marker file."""
        with tempfile.TemporaryDirectory() as tmp:
            marker = Path(tmp) / "started"
            argv = ["run", *args, "--", sys.executable, "-c",
                    f"open({str(marker)!r}, 'w').close()"]
            launcher = (f"import sys; sys.path.insert(0, {str(ROOT / 'python')!r}); "
                        f"from vramledger.cli import main; sys.exit(main({argv!r}))")
            child_env = {k: v for k, v in os.environ.items() if k != "VRAMLEDGER_CONF"}
            child_env.update(env or {})
            result = run([sys.executable, "-c", launcher], env=child_env)
            return result.returncode, result.stderr, marker.exists()

    def test_bad_conf_is_refused_before_the_program_starts(self):
        code, err, started = self.run_cli(["--conf", "bogus:1", "--no-track-non-torch"])
        self.assertEqual(code, 2, err)
        self.assertIn("vramledger run: --conf: allocator config: unknown key 'bogus'", err)
        self.assertFalse(started)

    def test_bad_conf_from_the_environment(self):
        code, err, started = self.run_cli(["--no-track-non-torch"],
                                          {"VRAMLEDGER_CONF": "round_bytes:3"})
        self.assertEqual(code, 2, err)
        self.assertIn("$VRAMLEDGER_CONF: allocator config: key 'round_bytes'", err)
        self.assertFalse(started)

    def test_good_conf_starts_the_program(self):
        code, err, started = self.run_cli(["--conf", "backend:vmm, cap_gb:40",
                                           "--no-track-non-torch"])
        self.assertEqual(code, 0, err)
        self.assertTrue(started)


# Configuration strings on which the Python check and the C++ parser must agree.
CONF_CASES = [
    "", "  ", "backend:vmm", "backend:VMM", "backend:tpu", "bogus:1", "round_bytes", "round_bytes:",
    ":512", "round_bytes:abc", "round_bytes:-512", "round_bytes:3", "round_bytes:0",
    "round_bytes:1024", "round_bytes:0512", "round_bytes:1073741824", "round_bytes:2147483648",
    "round_bytes:4611686018427387904", "round_bytes:99999999999999999999999",
    "round_bytes:512,round_bytes:1024", "cap_mb:10,cap_gb:1", "cap_gb:4096", "cap_gb:4097",
    "cap_mb:18446744073709551615", "span_gb:8192", "span_gb:8193", "page_mb:1024", "page_mb:1025",
    "paged_heap:maybe", "paged_heap:FALSE", "alias_pending_pages:true", "small_segment_mb:0",
    "small_size_limit_kb:4096", "small_size_limit_kb:4096,small_segment_mb:4",
    "max_free_mapped_mb:unlimited", "cap_mb:unlimited", "max_free_physical_mb:4194305",
    "map_chunk_mb:0", "map_chunk_mb:2", "cross_stream_slack_pct:10000",
    "cross_stream_slack_pct:10001", "cross_stream_slack_permille:5",
    "cross_stream_slack_permille:100000", "cross_stream_slack_permille:100001",
    "cross_stream_slack_pct:1,cross_stream_slack_permille:5", "cross_stream_cold_allocs:1024",
    "cross_stream_cold_allocs:1099511627777",
    "cross_stream_cold_streams:3", "cross_stream_cold_streams:1048577", "round_bytes:5 12",
    "stream_lanes:1", "stream_lanes:32", "stream_lanes:33", "stream_lanes:0",
    "round_bytes=512", "round_bytes:512,",
    ",round_bytes:512", "round_bytes:1.5", "round_bytes:0x200", "round_bytes:+512",
    " round_bytes : 1024 , cap_mb:64 ", "round_bytes:512:1", "large_segment_mb:\u0661",
]


def parser_keys():
    """Every key of the C++ parser's table (allocator/config.cpp), so that a key added there and
    forgotten in the Python check (vramledger run's) makes the test below fail."""
    source = (ROOT / "allocator" / "config.cpp").read_text(encoding="utf-8")
    keys = re.findall(r'\{"(\w+)",\s*"\w+",\s*ValueKind::k(Size|Bool)', source)
    if len(keys) < 15:
        raise AssertionError(f"allocator/config.cpp: found only {keys}: has the table changed?")
    return keys


def cases_for_every_key():
    cases = []
    for key, kind in parser_keys():
        values = ["true", "false", "1"] if kind == "Bool" else ["0", "2", "unlimited", "x"]
        cases += [f"{key}:{value}" for value in values]
    return cases


class ConfCheckAgreesWithTheParser(ToolTest):
    TOOL = "REPLAY"

    def test_the_check_knows_every_key_of_the_parser(self):
        from vramledger.cli import _CONF_BOOLS, _CONF_SIZES
        for key, kind in parser_keys():
            with self.subTest(key=key):
                self.assertIn(key, _CONF_BOOLS if kind == "Bool" else _CONF_SIZES)

    def test_same_verdicts(self):
        trace = self.trace("s 0 0\na 1 8 0\n")
        for text in CONF_CASES + cases_for_every_key():
            with self.subTest(conf=text):
                result = run([REPLAY, "--conf", text, trace])
                # A parsed config may still fail later (backend:vmm needs a CUDA build).
                cxx_refuses = "allocator config:" in result.stderr
                self.assertIn(result.returncode, (0, 2), result.stderr)
                python_refuses = conf_problem(text) is not None
                self.assertEqual(python_refuses, cxx_refuses,
                                 f"C++: {result.stderr.strip()!r}, Python: {conf_problem(text)!r}")


if __name__ == "__main__":
    paths = sys.argv[1:4]
    del sys.argv[1:4]
    REPLAY, REPORT, DEMO = (paths + ["", "", ""])[:3]
    unittest.main()

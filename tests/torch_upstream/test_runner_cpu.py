"""scripts/torch_upstream_tests.sh on a machine without a GPU (CPU only).

    python3 -m pytest tests/torch_upstream/test_runner_cpu.py

1. No upstream file, or no GPU: it says it skips, exits 0, and the last line says so.
2. The whole path, GPU checks bypassed (VRAMLEDGER_UPSTREAM_ASSUME_GPU=1): a stand-in upstream
   file whose tests look at whether `vramledger run` started them, a stand-in staged package
   (the real Python package, an empty library file), both runs, the table in $OUT.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(REPO, "scripts", "torch_upstream_tests.sh")

FAKE_UPSTREAM = '''
import os
import unittest

UNDER_VRAMLEDGER = "_bootstrap" in os.environ.get("PYTHONPATH", "")


class TestCuda(unittest.TestCase):
    def test_passes(self):
        pass

    def test_fails_only_under_vramledger(self):
        self.assertFalse(UNDER_VRAMLEDGER, "allocation failed: invalid argument\\nmore")

    def test_passes_only_under_vramledger(self):
        self.assertTrue(UNDER_VRAMLEDGER, "native says no")

    def test_fails_in_both(self):
        self.assertEqual(1, 2)

    @unittest.skip("needs two GPUs")
    def test_skipped(self):
        pass
'''


def run_script(args, env_extra, tmp_path):
    env = dict(os.environ)
    env.pop("OUT", None)
    env.update(env_extra)
    env["PYTHON"] = sys.executable
    return subprocess.run(["bash", SCRIPT] + args, capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=300)


def test_missing_file_skips(tmp_path):
    result = run_script([str(tmp_path / "nope.py")], {}, tmp_path)
    assert result.returncode == 0
    assert "skipped: no upstream test file" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("upstream allocator tests: skipped")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine may have a GPU")
def test_no_gpu_skips(tmp_path):
    upstream = tmp_path / "test_x.py"
    upstream.write_text(FAKE_UPSTREAM)
    result = run_script([str(upstream)], {}, tmp_path)
    assert result.returncode == 0
    assert "skipped: no GPU" in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("upstream allocator tests: skipped")


def test_both_runs_and_the_table(tmp_path):
    upstream = tmp_path / "up" / "test_fake_upstream.py"
    upstream.parent.mkdir()
    upstream.write_text(FAKE_UPSTREAM)
    (upstream.parent / "SOURCE.txt").write_text("commit: 0123abc\n")
    stage = tmp_path / "stage"
    shutil.copytree(os.path.join(REPO, "python", "vramledger"), str(stage / "vramledger"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    (stage / "vramledger" / "libvramledger_torch.so").write_bytes(b"")
    out = tmp_path / "out"
    result = run_script([str(upstream), "--budget", "280", "--run-max", "100"],
                        {"VRAMLEDGER_UPSTREAM_ASSUME_GPU": "1",
                         "VRAMLEDGER_UPSTREAM_STAGE": str(stage), "OUT": str(out)}, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last == ("upstream allocator tests: 4 run, native 2 failed, vramledger 2 failed, "
                    "vramledger-only failures 1"), result.stdout
    data = json.load(open(out / "torch_upstream.json"))
    assert [r["test"] for r in data["vramledger_only_failures"]] == [
        "TestCuda::test_fails_only_under_vramledger"]
    assert data["vramledger_only_failures"][0]["vramledger_message"].startswith("AssertionError")
    assert [r["test"] for r in data["vramledger_only_passes"]] == [
        "TestCuda::test_passes_only_under_vramledger"]
    md = (out / "torch_upstream.md").read_text()
    assert "| `TestCuda::test_skipped` | skipped | skipped |" in md
    assert "commit: 0123abc" in md
    for name in ("native.xml", "vramledger.xml", "native.log", "vramledger.log", "where.txt"):
        assert (out / "torch_upstream" / name).exists(), name


def test_per_test_limit_without_pytest_timeout(tmp_path):
    upstream = tmp_path / "test_slow_upstream.py"
    upstream.write_text(
        "import time, unittest\n"
        "class TestCuda(unittest.TestCase):\n"
        "    def test_a_hangs(self):\n"
        "        time.sleep(120)\n"
        "    def test_b_after(self):\n"
        "        pass\n")
    stage = tmp_path / "stage"
    shutil.copytree(os.path.join(REPO, "python", "vramledger"), str(stage / "vramledger"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    (stage / "vramledger" / "libvramledger_torch.so").write_bytes(b"")
    out = tmp_path / "out"
    result = run_script([str(upstream), "--test-timeout", "3", "--budget", "280"],
                        {"VRAMLEDGER_UPSTREAM_ASSUME_GPU": "1",
                         "VRAMLEDGER_UPSTREAM_STAGE": str(stage), "OUT": str(out)}, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.load(open(out / "torch_upstream.json"))
    by = {r["test"]: r for r in data["tests"]}
    assert by["TestCuda::test_b_after"]["native"] == "passed"
    assert by["TestCuda::test_b_after"]["vramledger"] == "passed"
    assert by["TestCuda::test_a_hangs"]["native"] == "failed"
    if "pytest-timeout" not in result.stdout:
        assert "3s per-test limit" in by["TestCuda::test_a_hangs"]["native_message"]

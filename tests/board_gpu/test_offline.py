"""tests/board_gpu/run_board_gpu.py without a GPU: the driver and its instances run whole over
the stand-ins in fake/ (a fake GPU shared through a folder, torch, vramledger's native functions
and NVML), so the protocol, the budgets and the verdicts are checked on every CI run; the H200
run is the same script over the real ones. Also checks that the driver fails when NVML
disagrees with an instance's books. The cluster scenarios need torch.distributed and are left
to the GPU run (tests/board/test_cluster.py covers the gathering over gloo on the CPU).
`python3 test_offline.py` (unittest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def run(folder: str, **extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FAKE_GPU_DIR=os.path.join(folder, "gpu"),
               PYTHONPATH=os.pathsep.join([os.path.join(HERE, "fake"),
                                           os.path.join(REPO, "python")]), **extra)
    env.pop("VRAMLEDGER_BOARD_DIR", None)
    return subprocess.run([sys.executable, os.path.join(HERE, "run_board_gpu.py"), "--out",
                           os.path.join(folder, "out"), "--budget", "100",
                           # cluster2/4 need torch.distributed, which the stand-in lacks
                           "--only", "together2,together4,kill3"], env=env,
                          capture_output=True, text=True, timeout=200)


class OfflineBoardCheck(unittest.TestCase):
    def test_scenarios_pass_over_the_fake_gpu(self):
        with tempfile.TemporaryDirectory() as folder:
            completed = run(folder)
            self.assertEqual(completed.returncode, 0, completed.stdout + completed.stderr)
            self.assertIn("3 of 3 scenarios passed", completed.stdout)
            with open(os.path.join(folder, "out", "results.json"), encoding="utf-8") as handle:
                outs = {out["scenario"]: out for out in json.load(handle)}
        self.assertEqual(len(outs["together2"]["instances"]), 2)
        self.assertEqual(len(outs["together4"]["instances"]), 4)
        enforced = [r for r in outs["together2"]["instances"] if "enforcement" in r]
        self.assertEqual(len(enforced), 1)
        self.assertTrue(enforced[0]["enforcement"]["refused"])
        kill = outs["kill3"]
        self.assertEqual(len(kill["instances"]), 2)
        self.assertTrue(all(cut > 0 for cut in kill["cut_while_alive"]))
        for out in outs.values():
            claims = sum(r["result"]["claimed_bytes"] for r in out["instances"])
            self.assertLessEqual(claims, out["capacity"])
            for r in out["instances"]:
                self.assertIn("kv", r["vllm"])  # printed for the record next to ours

    def test_books_that_disagree_with_nvml_fail_the_run(self):
        with tempfile.TemporaryDirectory() as folder:
            completed = run(folder, FAKE_GPU_NVML_SKEW=str(2 << 20))
        self.assertEqual(completed.returncode, 1, completed.stdout)
        self.assertIn("!= NVML per-process", completed.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""vramledger.cluster_report over torch.distributed with gloo on the CPU: 2 and 4 ranks, each a
process (cluster_worker.py). Checks the document every rank receives (all equal, every rank's
figures where they belong, the highest peak found), the HTML (per-rank table, timeline) and the
Prometheus exposition (labels rank and device; lines summing to process usage). Skipped (exit
77 under meson) when torch.distributed cannot be imported (scripts/setup.sh installs it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20


def torch_skip_reason():
    probe = subprocess.run([sys.executable, "-W", "ignore", "-c",
                            "import torch.distributed as d; assert d.is_gloo_available()"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        lines = (probe.stderr.strip().splitlines() or ["no output"])
        return f"torch.distributed with gloo not importable by {sys.executable}: {lines[-1]}"
    return None


SKIP = torch_skip_reason()


@unittest.skipIf(SKIP is not None, SKIP or "")
class ClusterReportTest(unittest.TestCase):
    def gather(self, world: int) -> list:
        with tempfile.TemporaryDirectory() as folder:
            store = os.path.join(folder, "store")
            workers = [subprocess.Popen([sys.executable, os.path.join(HERE, "cluster_worker.py"),
                                         str(rank), str(world), store, folder],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                       for rank in range(world)]
            for worker in workers:
                out, err = worker.communicate(timeout=240)
                self.assertEqual(worker.returncode, 0, err[-3000:])
            results = []
            for rank in range(world):
                with open(os.path.join(folder, f"rank{rank}.json"), encoding="utf-8") as handle:
                    results.append(json.load(handle))
        return results

    def check(self, world: int) -> None:
        results = self.gather(world)
        document = results[0]["dict"]
        for result in results:  # every rank got the same document (time stamps apart)
            for key in ("ranks", "totals", "highest_peak", "world_size", "backend"):
                self.assertEqual(result["dict"][key], document[key])
            self.assertEqual(json.loads(result["json"])["ranks"], document["ranks"])
        self.assertEqual(document["schema"], "vramledger.cluster_report")
        self.assertEqual(document["schema_version"], 1)
        self.assertEqual(document["world_size"], world)
        self.assertEqual(document["backend"], "gloo")
        self.assertEqual([entry["rank"] for entry in document["ranks"]], list(range(world)))
        pids = {entry["pid"] for entry in document["ranks"]}
        self.assertEqual(len(pids), world)  # really one process per rank
        for entry in document["ranks"]:
            (device,) = entry["devices"]
            self.assertEqual(device["torch_allocated_bytes"], (entry["rank"] + 1) << 30)
            self.assertEqual(device["num_ooms"], entry["rank"])
            self.assertEqual(sum(device["lines"].values()), device["process_usage_bytes"])
            self.assertEqual(device["non_torch_by_library"], {"nccl": 300 * MIB + entry["rank"]})
        expected_peak = 2 if world > 2 else 1
        self.assertEqual(document["highest_peak"]["rank"], expected_peak)
        self.assertEqual(document["totals"]["num_ooms"], sum(range(world)))
        self.assertEqual(document["totals"]["process_usage_bytes"],
                         sum(entry["devices"][0]["process_usage_bytes"]
                             for entry in document["ranks"]))
        # HTML: one row per rank and device, the timeline of the highest-peak rank.
        page = results[0]["html"]
        self.assertEqual(len(re.findall(r"<tr data-rank=\d+ data-device=0>", page)), world)
        self.assertIn(f"Timeline of rank {expected_peak}, device 0", page)
        self.assertEqual(page.count("<polyline"), 3)
        # Prometheus: labels rank and device; the lines add up to process usage per rank.
        text = results[0]["prometheus"]
        usage = dict(re.findall(r'^vramledger_rank_process_usage_bytes\{rank="(\d+)",device="0",'
                                r'host="[^"]*"\} (\d+)$', text, re.M))
        self.assertEqual(sorted(usage), [str(rank) for rank in range(world)])
        sums = {}
        for rank, value in re.findall(r'^vramledger_rank_line_bytes\{rank="(\d+)",device="0",'
                                      r'host="[^"]*",line="[a-z_]+"\} (-?\d+)$', text, re.M):
            sums[rank] = sums.get(rank, 0) + int(value)
        self.assertEqual({rank: str(total) for rank, total in sums.items()}, usage)
        self.assertEqual(text.count("# TYPE vramledger_rank_process_usage_bytes gauge"), 1)

    def test_two_ranks(self):
        self.check(2)

    def test_four_ranks(self):
        self.check(4)


class MetricsServerTest(unittest.TestCase):
    """serve_metrics: one rank's /metrics over HTTP (no torch needed when rank and world are
    given)."""

    def test_serves_the_rank_exposition(self):
        import urllib.error
        import urllib.request

        sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
        from vramledger.cluster import device_entry, rank_document, serve_metrics
        from cluster_worker import books

        server = serve_metrics(0, "127.0.0.1", rank=3, world_size=4,
                               local=lambda r, w: rank_document(r, w, [device_entry(*books(r))]))
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}"
            with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
                text = response.read().decode()
                self.assertIn("version=0.0.4", response.headers["Content-Type"])
            self.assertRegex(text, r'vramledger_rank_process_usage_bytes\{rank="3",device="0",'
                                   r'host="[^"]*"\} \d+')
            self.assertIn('vramledger_rank_up{rank="3"', text)
            with self.assertRaises(urllib.error.HTTPError):
                urllib.request.urlopen(url + "/other", timeout=10)
        finally:
            server.shutdown()
            server.server_close()


if __name__ == "__main__":
    if "--meson" in sys.argv:  # tests/board/meson.build: a skip is exit status 77 there
        sys.argv.remove("--meson")
        if SKIP is not None:
            print(f"skipped: {SKIP}")
            sys.exit(77)
    unittest.main(verbosity=2)

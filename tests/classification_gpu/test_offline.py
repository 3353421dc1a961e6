"""The CPU-testable parts of the H200 classification checks: each check's verdict (analyse) on
made-up worker results that must pass and ones that must fail, run_checks.py's handling of
results, time limits and missing lines, and vramledger.profiling's process-report samplers.
No torch, no GPU:

    python3 tests/classification_gpu/test_offline.py     (or pytest)
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import fallback  # noqa: E402
import ground_truth  # noqa: E402
import instants  # noqa: E402
import neighbour  # noqa: E402
import run_checks  # noqa: E402
from _common import GIB, MIB, Outcome, round_up  # noqa: E402

import vramledger  # noqa: E402  (the package's Python side only: torch is imported lazily)
from vramledger import profiling  # noqa: E402


def verdict(analyse, *args):
    outcome = Outcome("test")
    analyse(*args, outcome)
    return outcome


# ---------------------------------------------------------------- neighbour (check 2)


def neighbour_results():
    base = {"non_torch_basis": "process_usage", "accounted_equals_budget": True, "warnings": [],
            "non_torch_increase_bytes": 50 * MIB, "weights_bytes": 497_759_232,
            "peak_activation_bytes": 600 * MIB, "model": "m", "neighbour_exit": 0,
            "neighbour_device_free_change_bytes": 0}
    alone = dict(base, vllm_non_torch_increase_bytes=50 * MIB)
    alloc = dict(base, vllm_non_torch_increase_bytes=50 * MIB + 8 * GIB,
                 neighbour_device_free_change_bytes=-8 * GIB)
    free = dict(base, vllm_non_torch_increase_bytes=50 * MIB - 8 * GIB,
                neighbour_device_free_change_bytes=8 * GIB)
    return {"alone": alone, "alloc": alloc, "free": free}


class NeighbourVerdict(unittest.TestCase):
    def test_immune_profile_passes(self):
        outcome = verdict(neighbour.analyse, neighbour_results())
        self.assertEqual(outcome.failures, [])
        self.assertEqual(outcome.figures["alloc vs alone: ours moves"], "0 B")

    def test_our_figure_moving_by_one_page_fails(self):
        results = neighbour_results()
        results["alloc"]["non_torch_increase_bytes"] += 2 * MIB
        outcome = verdict(neighbour.analyse, results)
        self.assertTrue(any("moved by 2097152 B" in f for f in outcome.failures), outcome.failures)

    def test_absent_neighbour_fails(self):
        results = neighbour_results()
        results["free"]["vllm_non_torch_increase_bytes"] = 50 * MIB  # vLLM did not move
        outcome = verdict(neighbour.analyse, results)
        self.assertTrue(any("really inside the scope" in f for f in outcome.failures))

    def test_vllm_moving_the_wrong_way_fails(self):
        results = neighbour_results()
        results["alloc"]["vllm_non_torch_increase_bytes"] = 50 * MIB - 8 * GIB
        self.assertTrue(verdict(neighbour.analyse, results).failures)

    def test_profile_without_per_process_figure_fails(self):
        results = neighbour_results()
        results["alone"]["non_torch_basis"] = "device_used_fallback"
        self.assertTrue(verdict(neighbour.analyse, results).failures)

    def test_non_torch_below_the_raw_allocation_fails(self):
        results = neighbour_results()
        for r in results.values():
            r["non_torch_increase_bytes"] = 10 * MIB
        self.assertTrue(verdict(neighbour.analyse, results).failures)


# ---------------------------------------------------------------- instants (checks 1 and 3)


class FakeProcess:
    """A process whose report is consistent by construction: context + torch + libraries."""

    def __init__(self, shim):
        self.shim = shim
        self.context = 520 * MIB
        self.reserved = 0
        self.raw = {}  # address -> requested bytes
        self.instants = []

    def instant(self, label):
        tracked = sum(self.raw.values()) if self.shim else 0
        driver_raw = sum(round_up(s, 2 * MIB) for s in self.raw.values())
        usage = self.context + self.reserved + driver_raw
        remainder = usage - self.reserved - tracked
        lines = [{"kind": "torch", "name": "torch cached, usable", "bytes": self.reserved}]
        if tracked:
            lines.append({"kind": "non_torch", "name": "non-torch: user", "bytes": tracked})
        lines.append({"kind": "remainder", "name": "context", "bytes": remainder})
        self.instants.append({
            "label": label, "nvml_before": usage, "nvml_after": usage,
            "nvml_device_used": usage + GIB, "nvml_device_total": 140 * GIB,
            "basis": "nvml_per_process", "source": "nvml", "lines": lines, "sum_bytes": usage,
            "process_usage_bytes": usage, "non_torch_bytes": usage - self.reserved,
            "reserved": self.reserved, "remainder": remainder, "hooked": self.shim,
            "tracked_total": tracked, "by_library": {"user": tracked} if tracked else {},
            "all_lines_non_negative": remainder >= 0, "missing_hook": None, "problems": [],
            "notes": []})
        return len(self.instants) - 1


def instants_result(shim):
    process = FakeProcess(shim)
    process.instant("context created")
    process.reserved = 64 * MIB
    for n in range(8):
        process.instant(f"torch {n}")
    events = []
    for size in instants.RAW_SIZES:
        before = process.instant("before")
        process.raw[size] = size
        after = process.instant("after alloc")
        del process.raw[size]
        freed = process.instant("after free")
        events.append({"size": size, "before": before, "after_alloc": after, "after_free": freed})
    return {"variant": "shim" if shim else "no_shim", "instants": process.instants,
            "raw_events": events, "raw_via": "cudaMalloc"}


class InstantsVerdict(unittest.TestCase):
    def test_consistent_runs_pass_with_and_without_the_shim(self):
        for shim in (True, False):
            outcome = verdict(instants.analyse, instants_result(shim))
            self.assertEqual(outcome.failures, [], f"shim={shim}")
            self.assertIn("check 1", " ".join(outcome.figures))

    def test_shim_variant_without_the_shim_loaded_fails(self):
        result = instants_result(False)
        result["variant"] = "shim"
        outcome = verdict(instants.analyse, result)
        self.assertTrue(any("hooked" in f for f in outcome.failures))

    def test_report_disagreeing_with_nvml_fails(self):
        result = instants_result(True)
        result["instants"][3]["nvml_before"] = result["instants"][3]["nvml_after"] = 1
        self.assertTrue(any("NVML (read here)" in f
                            for f in verdict(instants.analyse, result).failures))

    def test_negative_remainder_and_missing_hook_fail(self):
        result = instants_result(False)
        at = result["instants"][2]
        at["lines"][-1]["bytes"] = -4096
        at["lines"][0]["bytes"] += at["process_usage_bytes"] + 4096 - sum(
            line["bytes"] for line in at["lines"])
        at["missing_hook"] = {"deficit_bytes": 4096, "message": "MISSING HOOK"}
        failures = verdict(instants.analyse, result).failures
        self.assertTrue(any("negative lines" in f for f in failures))
        self.assertTrue(any("MISSING HOOK" in f for f in failures))

    def test_lines_not_adding_up_fail(self):
        result = instants_result(False)
        result["instants"][5]["lines"][0]["bytes"] += 512
        self.assertTrue(any("Σ lines" in f for f in verdict(instants.analyse, result).failures))

    def test_raw_allocation_growing_the_remainder_by_the_request_only_fails(self):
        result = instants_result(False)  # without the shim the remainder must grow by pages
        event = result["raw_events"][0]
        after = result["instants"][event["after_alloc"]]
        shrink = round_up(event["size"], 2 * MIB) - event["size"]
        for key in ("remainder", "process_usage_bytes", "non_torch_bytes", "sum_bytes",
                    "nvml_before", "nvml_after"):
            after[key] -= shrink
        after["lines"][-1]["bytes"] -= shrink
        failures = verdict(instants.analyse, result).failures
        self.assertTrue(any("remainder grew" in f for f in failures), failures)

    def test_too_few_instants_fail(self):
        result = instants_result(True)
        result["instants"] = result["instants"][:19]
        result["raw_events"] = []
        self.assertTrue(any("fewer than 20" in f for f in verdict(instants.analyse, result).failures))

    def test_context_outside_the_expected_range_fails(self):
        result = instants_result(True)
        first = result["instants"][0]
        for key in ("process_usage_bytes", "sum_bytes", "nvml_before", "nvml_after"):
            first[key] = 2 * GIB
        first["lines"][-1]["bytes"] = 2 * GIB
        self.assertTrue(any("check 1" in f for f in verdict(instants.analyse, result).failures))


# ---------------------------------------------------------------- ground truth (check 4)

# By hand: each weight's bytes and the same rounded up to 512 B.
WEIGHT_BYTES = [67_108_864, 1_554_000, 12, 77_194_752, 98_760, 2_162_721]
WEIGHT_ROUNDED = [67_108_864, 1_554_432, 512, 77_194_752, 98_816, 2_163_200]
# h3 + h4 + h5 + h6 live together, each rounded up to 512 B.
FORWARD_PEAK = 41_943_552 + 512 + 20_480 + 52_429_312


def ground_truth_result():
    return {"shim": True, "weights_bytes": sum(WEIGHT_ROUNDED),
            "weights_tag_bytes": sum(WEIGHT_ROUNDED),
            "requested_growth_during_load": sum(WEIGHT_BYTES),
            "allocated_growth_during_load": sum(WEIGHT_ROUNDED), "other_torch_bytes": 0,
            "peak_activation_bytes": FORWARD_PEAK,
            "non_torch_increase_bytes": round_up(ground_truth.RAW_BYTES, 2 * MIB),
            "non_torch_tracked_increase_bytes": ground_truth.RAW_BYTES,
            "non_torch_basis": "process_usage", "accounted_equals_budget": True,
            "warnings": []}


class GroundTruthVerdict(unittest.TestCase):
    def test_the_script_counts_match_hand_counts(self):
        self.assertEqual(ground_truth.expected_weights(), (sum(WEIGHT_BYTES), sum(WEIGHT_ROUNDED)))
        self.assertEqual(ground_truth.expected_peak(), FORWARD_PEAK)

    def test_exact_figures_pass(self):
        self.assertEqual(verdict(ground_truth.analyse, ground_truth_result()).failures, [])

    def test_each_figure_off_by_one_rounding_unit_fails(self):
        for key in ("weights_bytes", "weights_tag_bytes", "requested_growth_during_load",
                    "peak_activation_bytes", "other_torch_bytes",
                    "non_torch_tracked_increase_bytes"):
            result = ground_truth_result()
            result[key] += 512
            self.assertTrue(verdict(ground_truth.analyse, result).failures, key)

    def test_non_torch_beyond_one_granule_fails(self):
        result = ground_truth_result()
        result["non_torch_increase_bytes"] += 2 * MIB
        self.assertTrue(verdict(ground_truth.analyse, result).failures)
        result["non_torch_increase_bytes"] = ground_truth.RAW_BYTES - 1
        self.assertTrue(verdict(ground_truth.analyse, result).failures)

    def test_without_the_shim_the_tracked_figure_is_not_required(self):
        result = ground_truth_result()
        result["shim"] = False
        result["non_torch_tracked_increase_bytes"] = 0
        outcome = verdict(ground_truth.analyse, result)
        self.assertEqual(outcome.failures, [])
        self.assertTrue(outcome.notes)


# ---------------------------------------------------------------- fallback (check 5)


def fallback_result():
    at = {"label": "x", "basis": "device_used_fallback", "source": "nvml",
          "caveat": "per-process usage unavailable (...)", "other_processes": None,
          "lines_sum": 9 * GIB, "process_usage_bytes": 9 * GIB, "device_used_bytes": 9 * GIB,
          "nvml_device_used_before": 9 * GIB, "nvml_device_used_after": 9 * GIB,
          "remainder_label": "context, modules, driver + untracked non-torch + other processes",
          "missing_hook": None}
    return {"getpid": 1, "nvml_lists_getpid": False, "instants": [at, dict(at, label="y")],
            "profile_basis": "device_used_fallback",
            "profile_warnings": ["non-torch figures use device used memory (...)"],
            "accounted_equals_budget": True}


class FallbackVerdict(unittest.TestCase):
    def test_fallback_passes(self):
        outcome = verdict(fallback.analyse, fallback_result())
        self.assertEqual((outcome.failures, outcome.status()), ([], "pass"))

    def test_pid_visible_to_nvml_is_not_run_not_failed(self):
        result = fallback_result()
        result["nvml_lists_getpid"] = True
        outcome = verdict(fallback.analyse, result)
        self.assertEqual(outcome.status(), "not_run")

    def test_missing_caveat_or_wrong_sum_fails(self):
        result = fallback_result()
        result["instants"][0]["caveat"] = None
        result["instants"][1]["lines_sum"] += 1
        self.assertEqual(len(verdict(fallback.analyse, result).failures), 2)

    def test_profile_without_warning_fails(self):
        result = fallback_result()
        result["profile_warnings"] = []
        self.assertTrue(verdict(fallback.analyse, result).failures)


# ---------------------------------------------------------------- run_checks.py


class RunChecks(unittest.TestCase):
    def script(self, folder, body):
        path = os.path.join(folder, "fake_check.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("import json, sys, time\n" + body)
        return path

    def run_fake(self, body, limit=20):
        with tempfile.TemporaryDirectory() as folder:
            path = self.script(folder, body)
            document = run_checks.run_check(path, folder, limit, 1)
            self.assertTrue(os.path.exists(os.path.join(folder, "check.log")))
            return document

    def test_pass_document_is_taken(self):
        document = self.run_fake('print("CHECK_RESULT " + json.dumps({"status": "pass", '
                                 '"figures": {"a": 1}, "failures": [], "notes": []}))')
        self.assertEqual((document["status"], document["figures"]), ("pass", {"a": 1}))

    def test_crash_without_line_fails(self):
        document = self.run_fake('raise SystemExit("boom")')
        self.assertEqual(document["status"], "fail")
        self.assertIn("boom", document["failures"][0])

    def test_non_zero_exit_contradicting_a_pass_fails(self):
        document = self.run_fake('print("CHECK_RESULT " + json.dumps({"status": "pass", '
                                 '"figures": {}, "failures": [], "notes": []})); sys.exit(3)')
        self.assertEqual(document["status"], "fail")

    def test_time_limit(self):
        document = self.run_fake("time.sleep(30)", limit=1)
        self.assertEqual(document["status"], "timeout")

    def test_whole_run_without_gpu_skips_and_writes_results(self):
        with tempfile.TemporaryDirectory() as folder:
            completed = subprocess.run(
                [sys.executable, os.path.join(HERE, "run_checks.py"), "--out", folder],
                capture_output=True, text=True, timeout=60)
            if run_checks._common.gpu_skip_reason() is None:
                self.skipTest("a GPU is present: the real run is not a unit test")
            self.assertEqual(completed.returncode, 0, completed.stderr)
            self.assertIn("skipped: no GPU", completed.stdout)
            with open(os.path.join(folder, "results.json"), encoding="utf-8") as handle:
                results = json.load(handle)
            self.assertEqual({d["status"] for d in results.values()}, {"skip"})
            self.assertEqual(set(results), {c[0] for c in run_checks.CHECKS})
            self.assertTrue(os.path.exists(os.path.join(folder, "summary.md")))

    def test_summary_line_counts(self):
        results = {"neighbour": {"status": "pass", "figures": {
            "alloc vs alone: ours moves": "0 B",
            "alloc vs alone: vLLM moves": "8589934592 B (8.000 GiB)",
            "free vs alone: vLLM moves": "-8589934592 B (-8.000 GiB)"}},
            "instants": {"status": "fail", "figures": {}}, "fallback": {"status": "not_run"}}
        line = run_checks.summary_line(results)
        self.assertTrue(line.startswith("1 passed, 1 failed, 1 skipped"), line)
        self.assertIn("ours 0 B", line)
        self.assertIn("alloc vs alone vLLM 8.000 GiB", line)


# ---------------------------------------------------------------- profiling's report samplers


def report_document(basis, usage, device_used, reserved=0, hooked=False, libraries=None):
    return {"basis": basis, "process_usage_bytes": usage, "device_used_bytes": device_used,
            "device_total_bytes": 140 * GIB, "torch": {"reserved": reserved},
            "caveat": None if basis == "nvml_per_process" else "per-process usage unavailable (x)",
            "non_torch": {"hooked": hooked, "by_library": libraries or {}}}


class ReportSamplers(unittest.TestCase):
    def setUp(self):
        self.documents = []
        self.saved = vramledger.process_report

        def fake_report(device=None, format="text"):
            self.assertEqual(format, "json")
            return json.dumps(self.documents.pop(0) if len(self.documents) > 1
                              else self.documents[0])

        vramledger.process_report = fake_report

    def tearDown(self):
        vramledger.process_report = self.saved

    def test_per_process_basis_gives_the_per_process_figure(self):
        memory = profiling.process_memory_from_report(
            report_document("nvml_per_process", 700 * MIB, 9 * GIB))
        self.assertEqual((memory.process_used_bytes, memory.device_used_bytes),
                         (700 * MIB, 9 * GIB))

    def test_fallback_basis_is_not_passed_on_as_per_process(self):
        memory = profiling.process_memory_from_report(
            report_document("device_used_fallback", 9 * GIB, 9 * GIB))
        self.assertIsNone(memory.process_used_bytes)
        self.assertIn("per-process usage unavailable", memory.process_used_unavailable)

    def test_preload_tracker_only_when_hooked(self):
        self.documents = [report_document("nvml_per_process", 1, 1)]
        self.assertIsNone(profiling.preload_non_torch())
        self.documents = [report_document("nvml_per_process", 1, 1, hooked=True,
                                          libraries={"nccl": 5, "user": 7})]
        tracker = profiling.preload_non_torch()
        self.assertEqual(tracker(), {"nccl": 5, "user": 7})

    def _profile_through_the_samplers(self, basis, process_before, process_during):
        """A profile with no torch memory, whose process figure (of the report's `basis`) goes
        from `process_before` to `process_during` while the device's used memory goes from 9 to
        17 GiB."""
        stats = {"allocated_bytes": {"all": {"current": 0, "peak": 0}},
                 "reserved_bytes": {"all": {"current": 0, "peak": 0}}, "total_bytes": 140 * GIB}
        self.documents = [report_document(basis, process_before, 9 * GIB)]
        profile = profiling.MemoryProfile(stats_fn=lambda: stats, reset_peaks_fn=lambda: None,
                                          process_memory=profiling.nvml_process_memory())
        profile.begin()
        with profile.loading():
            pass
        with profile.profiling():
            self.documents = [report_document(basis, process_during, 17 * GIB)]
        return profile.result(utilization=0.9)

    def test_profile_through_the_samplers_in_the_fallback_warns(self):
        result = self._profile_through_the_samplers("device_used_fallback", 9 * GIB, 17 * GIB)
        self.assertEqual(result.non_torch_basis, "device_used_fallback")
        self.assertEqual(result.non_torch_increase_bytes, 8 * GIB)  # a neighbour moves it
        self.assertTrue(any("device used memory" in w for w in result.warnings))
        self.assertEqual(result.accounted_bytes(), result.budget_bytes)

    def test_profile_through_the_samplers_ignores_the_neighbour(self):
        result = self._profile_through_the_samplers("nvml_per_process", 600 * MIB, 600 * MIB)
        self.assertEqual((result.non_torch_basis, result.non_torch_increase_bytes),
                         ("process_usage", 0))
        self.assertEqual(result.warnings, [])


if __name__ == "__main__":
    unittest.main(verbosity=1)

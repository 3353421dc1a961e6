"""vramledger.profiling without torch or a GPU: a fake device feeds stats dicts shaped like
vramledger.stats() and NVML-like samples. Runs under pytest or as `python3 test_profiling.py`."""

import math
import os
import sys
import unittest
from fractions import Fraction

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from vramledger.profiling import GIB, MemoryProfile, ProcessMemory, memory_profile  # noqa: E402

MIB = 1 << 20
H200_TOTAL = 143_771 * MIB


class FakeDevice:
    """One process's allocator counters and the device's NVML figures, scripted by hand."""

    def __init__(self, context: int, neighbours: int, per_process: bool = True) -> None:
        self.allocated = 0
        self.peak = 0
        self.reserved = 0
        self.weights = 0
        self.context = context
        self.neighbours = neighbours
        self.per_process = per_process
        self.libraries = {}

    # allocator
    def segment(self, size: int) -> None:
        self.reserved += size

    def alloc(self, size: int, weights: bool = False) -> None:
        self.allocated += size
        self.peak = max(self.peak, self.allocated)
        if weights:
            self.weights += size

    def free(self, size: int) -> None:
        self.allocated -= size

    def library_alloc(self, name: str, size: int) -> None:
        self.libraries[name] = self.libraries.get(name, 0) + size

    # what the profiler reads
    def own_bytes(self) -> int:
        return self.context + self.reserved + sum(self.libraries.values())

    def stats(self) -> dict:
        def pooled(current: int, peak: int) -> dict:
            stat = {"current": current, "peak": peak, "allocated": 0, "freed": 0}
            return {"all": stat, "small_pool": dict(stat), "large_pool": dict(stat)}

        return {
            "device": 0, "backend": "fake", "total_bytes": H200_TOTAL,
            "allocated_bytes": pooled(self.allocated, self.peak),
            "reserved_bytes": pooled(self.reserved, self.reserved),
            "tags": {"weights": {"allocated_bytes": {"current": self.weights, "peak": self.weights,
                                                     "allocated": 0, "freed": 0}}},
        }

    def reset_peaks(self) -> None:
        self.peak = self.allocated

    def process_memory(self) -> ProcessMemory:
        return ProcessMemory(
            device_used_bytes=self.own_bytes() + self.neighbours,
            device_total_bytes=H200_TOTAL,
            process_used_bytes=self.own_bytes() if self.per_process else None,
            process_used_unavailable="" if self.per_process else "container without PID view")

    def vllm_non_torch(self) -> int:
        """vLLM's estimate: (total - free) - memory_reserved()."""
        return self.process_memory().device_used_bytes - self.reserved

    def profile(self, **kwargs) -> MemoryProfile:
        return MemoryProfile(stats_fn=self.stats, reset_peaks_fn=self.reset_peaks,
                             process_memory=self.process_memory, **kwargs)


WEIGHTS = 3 * GIB + GIB // 2
ACTIVATION_PEAK = 3 * GIB // 2 + GIB // 4


def load(device: FakeDevice) -> None:
    device.segment(4 * GIB)
    device.alloc(WEIGHTS, weights=True)


def forward(device: FakeDevice) -> None:
    device.segment(2 * GIB)
    device.alloc(3 * GIB // 2)
    device.alloc(GIB // 4)
    device.free(GIB // 4)
    device.free(3 * GIB // 2)


class MemoryProfileTest(unittest.TestCase):
    def run_profile(self, device: FakeDevice, during=None, **kwargs) -> tuple:
        profile = device.profile(**kwargs)
        profile.begin()
        with profile.loading():
            load(device)
        vllm_before = device.vllm_non_torch()
        with profile.profiling():
            forward(device)
            if during:
                during(device)
        return profile, device.vllm_non_torch() - vllm_before

    def test_neighbour_allocating_8_gib_moves_vllm_not_us(self) -> None:
        device = FakeDevice(context=612 * MIB, neighbours=2 * GIB)
        profile, vllm_delta = self.run_profile(
            device, during=lambda d: setattr(d, "neighbours", d.neighbours + 8 * GIB))
        result = profile.result(utilization=0.9)
        self.assertEqual(vllm_delta, 8 * GIB)
        self.assertEqual(result.non_torch_increase_bytes, 0)
        self.assertEqual(result.non_torch_basis, "process_usage")
        self.assertEqual(result.weights_bytes, WEIGHTS)
        self.assertEqual(result.weights_tag_bytes, WEIGHTS)
        self.assertEqual(result.peak_activation_bytes, ACTIVATION_PEAK)
        self.assertEqual(result.baseline_bytes, 612 * MIB)
        self.assertEqual(result.budget_bytes, 135_679_338_086)  # the C++ test's byte
        self.assertEqual(result.budget_bytes, math.floor(Fraction(0.9) * H200_TOTAL))
        self.assertEqual(result.kv_cache_budget_bytes,
                         result.budget_bytes - 612 * MIB - WEIGHTS - ACTIVATION_PEAK)
        self.assertEqual(result.accounted_bytes(), result.budget_bytes)
        self.assertEqual(result.warnings, [])

    def test_neighbour_freeing_8_gib(self) -> None:
        device = FakeDevice(context=612 * MIB, neighbours=10 * GIB)
        profile, vllm_delta = self.run_profile(
            device, during=lambda d: setattr(d, "neighbours", d.neighbours - 8 * GIB))
        self.assertEqual(vllm_delta, -8 * GIB)
        self.assertEqual(profile.result(utilization=0.5).non_torch_increase_bytes, 0)

    def test_own_non_torch_allocation_is_counted(self) -> None:
        device = FakeDevice(context=612 * MIB, neighbours=0)
        profile, _ = self.run_profile(
            device, during=lambda d: d.library_alloc("libcublasLt.so.12", 64 * MIB),
            non_torch=lambda: dict(device.libraries))
        result = profile.result(budget_bytes=40 * GIB)
        self.assertEqual(result.non_torch_increase_bytes, 64 * MIB)
        self.assertEqual(result.non_torch_tracked_increase_bytes, 64 * MIB)
        self.assertEqual(result.accounted_bytes(), 40 * GIB)
        self.assertIsNone(result.utilization)

    def test_fallback_is_moved_by_neighbours_and_warns(self) -> None:
        device = FakeDevice(context=612 * MIB, neighbours=2 * GIB, per_process=False)
        profile, _ = self.run_profile(
            device, during=lambda d: setattr(d, "neighbours", d.neighbours + 8 * GIB))
        result = profile.result(utilization=0.9)
        self.assertEqual(result.non_torch_basis, "device_used_fallback")
        self.assertEqual(result.non_torch_increase_bytes, 8 * GIB)
        self.assertIn("container without PID view", result.warnings[0])

    def test_does_not_fit_is_negative_not_clamped(self) -> None:
        device = FakeDevice(context=612 * MIB, neighbours=0)
        profile, _ = self.run_profile(device)
        result = profile.result(budget_bytes=4 * GIB)
        self.assertEqual(result.kv_cache_budget_bytes,
                         4 * GIB - 612 * MIB - WEIGHTS - ACTIVATION_PEAK)
        self.assertLess(result.kv_cache_budget_bytes, 0)
        self.assertIn("no room", result.warnings[-1])

    def test_missing_hook_is_reported(self) -> None:
        device = FakeDevice(context=0, neighbours=0)
        profile, _ = self.run_profile(
            device, during=lambda d: d.library_alloc("libfoo.so", 0),
            non_torch=lambda: {"libfoo.so": 256 * MIB})  # tracker counts what NVML never saw
        result = profile.result(utilization=0.9)
        self.assertTrue(any("MISSING HOOK" in w for w in result.warnings))

    def test_log_lines_match_the_cpp_wording(self) -> None:
        device = FakeDevice(context=612 * MIB, neighbours=0)
        profile, _ = self.run_profile(device)
        lines = profile.result(utilization=0.9).log_lines()
        self.assertEqual(lines[0], "the current instance can use total_gpu_memory (140.40GiB) x "
                                   "gpu_memory_utilization (0.90) = 126.36GiB")
        self.assertEqual(lines[1], "model weights take 3.50GiB; non_torch_memory takes 0.00GiB; "
                                   "PyTorch activation peak memory takes 1.75GiB; the rest of "
                                   "the memory reserved for KV Cache is 120.51GiB.")

    def test_graph_memory_is_its_own_line_and_out_of_the_kv_cache(self) -> None:
        device = FakeDevice(context=612 * MIB, neighbours=0)
        profile, _ = self.run_profile(device)
        plain = profile.result(budget_bytes=40 * GIB)
        graphs = profile.result(budget_bytes=40 * GIB, graph_bytes=3 * GIB + 5)
        self.assertEqual(graphs.graph_bytes, 3 * GIB + 5)
        self.assertEqual(graphs.kv_cache_budget_bytes, plain.kv_cache_budget_bytes - 3 * GIB - 5)
        self.assertEqual(graphs.accounted_bytes(), 40 * GIB)
        self.assertIn("CUDA graphs (measured before capture, vramledger.graph_memory_table) "
                      "take 3.00GiB", "\n".join(graphs.log_lines()))
        self.assertNotIn("CUDA graphs", "\n".join(plain.log_lines()))
        with self.assertRaises(ValueError):
            profile.result(budget_bytes=40 * GIB, graph_bytes=-1)

    def test_graph_pool_figures_read_sleep_fields_and_skip_unknown_keys(self) -> None:
        from vramledger.graph_memory import GraphPool

        figures = {"id": [23, 0], "use_count": 1, "segments": 2, "blocks": 1,
                   "reserved_bytes": 0, "live_bytes": 0, "requested_bytes": 0,
                   "cached_bytes": 0, "largest_free_bytes": 0, "fragmentation_bytes": 0}
        old = GraphPool.from_json(figures)  # a plugin from before graph pools slept
        self.assertEqual((old.id, old.sleepable, old.asleep, old.sleeping_bytes),
                         ((23, 0), False, False, 0))
        asleep = GraphPool.from_json(dict(figures, sleepable=True, asleep=True,
                                          sleeping_bytes=6 * MIB, added_later=1))
        self.assertTrue(asleep.sleepable and asleep.asleep)
        self.assertEqual(asleep.sleeping_bytes, 6 * MIB)

    def test_context_manager_and_phase_errors(self) -> None:
        device = FakeDevice(context=612 * MIB, neighbours=0)
        with memory_profile(stats_fn=device.stats, reset_peaks_fn=device.reset_peaks,
                            process_memory=device.process_memory) as profile:
            with self.assertRaises(RuntimeError):
                profile.begin_profile()  # loading first
            with profile.loading():
                load(device)
            with profile.profiling():
                forward(device)
        self.assertEqual(profile.result(utilization=0.9).weights_bytes, WEIGHTS)
        with self.assertRaises(ValueError):
            profile.result(utilization=0.9, budget_bytes=1)


if __name__ == "__main__":
    unittest.main()

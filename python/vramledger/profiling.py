"""vLLM-style memory profiling from vramledger's own counters.

    import vramledger
    from vramledger.profiling import memory_profile, nvml_process_memory

    with memory_profile(process_memory=nvml_process_memory()) as prof:   # baseline
        with prof.loading():
            model = load_model()
        with prof.profiling():                                      # resets peak stats
            model(dummy_batch)
    result = prof.result(utilization=0.9)
    for line in result.log_lines():
        print(line)

The same quantities as the C++ MemoryProfiler (accounting/classification/memory_profiler.hpp);
docs/classification.md defines each one. Torch figures come from vramledger.stats(), so they are
exact. Non-torch memory is `process usage - torch reserved` when a per-process sampler is given
(NVML's per-process figure: a neighbour process cannot move it), `device used - reserved` (vLLM's
figure, with a warning) when only device figures are available, and not measured otherwise.
nvml_process_memory() samples NVML through vramledger.process_report(); preload_non_torch() reads
the LD_PRELOAD shim's per-library bytes the same way (None when the shim is not loaded).
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Dict, Iterator, List, Optional

GIB = 1 << 30


@dataclass
class ProcessMemory:
    """One sample of the process's device memory (what the C++ ProcessMemory holds)."""

    device_used_bytes: int
    device_total_bytes: int
    process_used_bytes: Optional[int] = None  # NVML per-process figure; None where unavailable
    process_used_unavailable: str = ""


@dataclass
class _Snapshot:
    allocated: int
    peak_allocated: int
    reserved: int
    weights_tag: int
    total_bytes: int
    non_torch: int
    tracked_non_torch: int
    basis: str
    caveat: str = ""
    device_total: int = 0
    problems: List[str] = field(default_factory=list)


@dataclass
class ProfileResult:
    budget_bytes: int
    device_total_bytes: int
    utilization: Optional[float]
    baseline_bytes: int
    weights_bytes: int
    other_torch_bytes: int
    non_torch_increase_bytes: int
    peak_activation_bytes: int
    kv_cache_budget_bytes: int
    weights_tag_bytes: int
    non_torch_tracked_increase_bytes: int
    non_torch_basis: str
    warnings: List[str] = field(default_factory=list)
    # With a budget board (result(board=...)): what the other live instances hold or claimed,
    # the room they leave, how much of the budget's KV cache that room cut (0: it did not) and
    # what this instance claimed on the board. None without a board.
    board_others_bytes: Optional[int] = None
    board_room_bytes: Optional[int] = None
    board_cut_bytes: int = 0
    claimed_bytes: Optional[int] = None
    board: Optional[Dict[str, Any]] = None
    # CUDA graphs to be captured after the KV cache is allocated (result(graph_bytes=...), e.g.
    # vramledger.graph_memory_table(...).total_bytes): their own line, kept out of the KV cache.
    graph_bytes: int = 0

    def accounted_bytes(self) -> int:
        """Equals budget_bytes by construction (the board's cut included)."""
        return (self.baseline_bytes + self.weights_bytes + self.other_torch_bytes
                + self.non_torch_increase_bytes + self.peak_activation_bytes
                + self.kv_cache_budget_bytes + self.board_cut_bytes + self.graph_bytes)

    def log_lines(self) -> List[str]:
        """vLLM's wording, as the C++ ProfileResult::log_lines prints it."""
        if self.utilization is not None:
            first = (f"the current instance can use total_gpu_memory "
                     f"({_gib(self.device_total_bytes)}GiB) x gpu_memory_utilization "
                     f"({self.utilization:.2f}) = {_gib(self.budget_bytes)}GiB")
        else:
            first = (f"the current instance can use a per-instance budget of "
                     f"{_gib(self.budget_bytes)}GiB")
        lines = [
            first,
            f"model weights take {_gib(self.weights_bytes)}GiB; non_torch_memory takes "
            f"{_gib(self.non_torch_increase_bytes)}GiB; PyTorch activation peak memory takes "
            f"{_gib(self.peak_activation_bytes)}GiB; the rest of the memory reserved for KV "
            f"Cache is {_gib(self.kv_cache_budget_bytes)}GiB.",
            f"memory in use before loading (CUDA context, modules, driver, earlier allocations) "
            f"takes {_gib(self.baseline_bytes)}GiB; other PyTorch allocations kept from loading "
            f"to profiling take {_gib(self.other_torch_bytes)}GiB; non-torch figures from "
            f"{self.non_torch_basis}.",
        ]
        if self.graph_bytes:
            lines.append(f"CUDA graphs (measured before capture, vramledger.graph_memory_table) "
                         f"take {_gib(self.graph_bytes)}GiB, kept out of the KV cache.")
        if self.board_room_bytes is not None:
            lines.append(
                f"budget board: other live instances hold or claim "
                f"{_gib(self.board_others_bytes or 0)}GiB, leaving {_gib(self.board_room_bytes)}"
                f"GiB; the board cut the KV cache by {_gib(self.board_cut_bytes)}GiB; this "
                f"instance claims {_gib(self.claimed_bytes or 0)}GiB.")
        lines += [f"WARNING: {warning}" for warning in self.warnings]
        return lines


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.2f}"


def _current(stats: Dict[str, Any], key: str, which: str = "current") -> int:
    return int(stats[key]["all"][which])


class MemoryProfile:
    """The phases of one profile: begin -> loading -> profiling -> result.

    stats_fn / reset_peaks_fn default to vramledger.stats / vramledger.reset_peak_stats for
    `device`; tests pass fakes. process_memory: a callable returning ProcessMemory (e.g. from
    pynvml). non_torch: a callable returning {library: live bytes} from a tracker, or None.
    """

    def __init__(self, device: Any = None, *,
                 stats_fn: Optional[Callable[[], Dict[str, Any]]] = None,
                 reset_peaks_fn: Optional[Callable[[], None]] = None,
                 process_memory: Optional[Callable[[], ProcessMemory]] = None,
                 non_torch: Optional[Callable[[], Dict[str, int]]] = None) -> None:
        if stats_fn is None or reset_peaks_fn is None:
            from . import reset_peak_stats, stats  # the public API; imported late (needs torch)

            stats_fn = stats_fn or (lambda: stats(device))
            reset_peaks_fn = reset_peaks_fn or (lambda: reset_peak_stats(device))
        self._stats = stats_fn
        self._reset_peaks = reset_peaks_fn
        self._process_memory = process_memory
        self._non_torch = non_torch
        self._phase = "idle"
        self._at: Dict[str, _Snapshot] = {}

    def snapshot(self) -> _Snapshot:
        stats = self._stats()
        reserved = _current(stats, "reserved_bytes")
        weights = stats.get("tags", {}).get("weights", {})
        tracked = sum(self._non_torch().values()) if self._non_torch else 0
        snap = _Snapshot(
            allocated=_current(stats, "allocated_bytes"),
            peak_allocated=_current(stats, "allocated_bytes", "peak"),
            reserved=reserved,
            weights_tag=int(weights.get("allocated_bytes", {}).get("current", 0)),
            total_bytes=int(stats.get("total_bytes", 0)),
            non_torch=tracked, tracked_non_torch=tracked,
            basis="tracker_only" if self._non_torch else "none")
        if self._process_memory is not None:
            memory = self._process_memory()
            snap.device_total = memory.device_total_bytes
            if memory.process_used_bytes is not None:
                snap.basis = "process_usage"
                snap.non_torch = memory.process_used_bytes - reserved
                if snap.non_torch < tracked:
                    snap.problems.append(
                        f"MISSING HOOK: the classified lines exceed process usage by "
                        f"{tracked - snap.non_torch} bytes")
            else:
                snap.basis = "device_used_fallback"
                snap.non_torch = memory.device_used_bytes - reserved
                snap.caveat = memory.process_used_unavailable or "no reason given"
        return snap

    def _advance(self, expected: str, new: str, call: str) -> None:
        if self._phase != expected:
            raise RuntimeError(
                f"MemoryProfile.{call} called in phase '{self._phase}', needs '{expected}'")
        self._phase = new

    def begin(self) -> None:
        self._advance("idle", "begun", "begin")
        self._at["begin"] = self.snapshot()

    def end_load(self) -> None:
        self._advance("begun", "loaded", "end_load")
        self._at["load_end"] = self.snapshot()

    def begin_profile(self) -> None:
        self._advance("loaded", "profiling", "begin_profile")
        self._reset_peaks()
        self._at["profile_begin"] = self.snapshot()

    def end_profile(self) -> None:
        self._advance("profiling", "done", "end_profile")
        self._at["profile_end"] = self.snapshot()

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        """The weights are what allocated bytes grow by inside this block."""
        yield
        self.end_load()

    @contextlib.contextmanager
    def profiling(self) -> Iterator[None]:
        self.begin_profile()
        try:
            yield
        finally:
            self.end_profile()

    def result(self, utilization: Optional[float] = None,
               budget_bytes: Optional[int] = None, board: Any = None,
               claim: bool = True, graph_bytes: int = 0) -> ProfileResult:
        """The profile's figures for a budget of utilization x device total (or budget_bytes).

        board: a vramledger.board.Board of this GPU. Then the KV cache is also limited to the
        room the other live instances leave (what processes can allocate - each one's
        max(holdings, claim) - memory outside the board; docs/board.md, "The budget"), decided
        under the board's decision lock, and with `claim` this
        instance claims what it will hold (its profile's peak plus the KV cache) before the
        lock is released, so instances deciding at once cannot both take the same bytes.
        graph_bytes: memory the CUDA graphs captured after the KV cache will hold
        (vramledger.graph_memory_table(...).total_bytes): its own line, out of the KV cache."""
        if (utilization is None) == (budget_bytes is None):
            raise ValueError("give exactly one of utilization or budget_bytes")
        if self._phase != "done":
            raise RuntimeError(f"MemoryProfile.result called in phase '{self._phase}'")
        begin, load_end = self._at["begin"], self._at["load_end"]
        profile_begin, end = self._at["profile_begin"], self._at["profile_end"]
        warnings: List[str] = []
        basis = end.basis
        if "device_used_fallback" in (begin.basis, end.basis):
            basis = "device_used_fallback"
            warnings.append(f"non-torch figures use device used memory (per-process usage "
                            f"unavailable: {end.caveat or begin.caveat}): another process "
                            f"allocating during the profile moves them")
        elif basis == "tracker_only":
            warnings.append("no process memory source: non-torch memory is only what the "
                            "tracker saw; the CUDA context and untracked allocations are not "
                            "counted")
        elif basis == "none":
            warnings.append("no process memory source and no non-torch tracker: non-torch "
                            "memory and the CUDA context are not counted")
        device_total = end.device_total or end.total_bytes
        if budget_bytes is None:
            if not 0 <= utilization <= 1:
                raise ValueError("utilization must lie in [0, 1]")
            # The exact product of the float's binary value, floored: the C++ side's byte.
            budget = math.floor(Fraction(utilization) * device_total)
        else:
            budget = int(budget_bytes)
        baseline = begin.non_torch + begin.allocated
        weights = load_end.allocated - begin.allocated
        other_torch = profile_begin.allocated - load_end.allocated
        non_torch_increase = end.non_torch - begin.non_torch
        peak_activation = end.peak_allocated - profile_begin.allocated
        if graph_bytes < 0:
            raise ValueError("graph_bytes must be >= 0")
        kv = (budget - baseline - weights - other_torch - non_torch_increase - peak_activation
              - graph_bytes)
        for when, snap in (("at begin", begin), ("at end of load", load_end),
                           ("at start of profile", profile_begin), ("at end of profile", end)):
            warnings += [f"{when}: {problem}" for problem in snap.problems]
        board_fields: Dict[str, Any] = {}
        if board is not None:
            from .board.budget import _fresh_usage, room_on_board  # no torch needed

            own_without_kv = budget - kv
            # What processes can allocate: the allocator's device total (cudaMemGetInfo)
            # leaves out the driver's share that NVML's total includes.
            capacity = min(size for size in (device_total, end.total_bytes) if size) \
                if device_total or end.total_bytes else 0
            with board.decision() as view:
                used, own = _fresh_usage(self._process_memory)
                room = room_on_board(view, device_total, capacity, used, own)
                cut = max(0, kv - (room.room_bytes - own_without_kv))
                kv -= cut
                claimed = own_without_kv + max(kv, 0)
                if claim:
                    board.set_claim(claimed)
            if cut:
                warnings.append(f"the budget board cut the KV cache by {cut} bytes: the room is "
                                f"{room.room_bytes} bytes (capacity {room.capacity_bytes} - "
                                f"other instances' holdings or claims {room.others_bytes} - "
                                f"in use outside the board {room.outside_bytes})")
            warnings += [f"board: {note}" for note in room.notes]
            board_fields = dict(board_others_bytes=room.others_bytes,
                                board_room_bytes=room.room_bytes, board_cut_bytes=cut,
                                claimed_bytes=claimed if claim else None, board=room.as_dict())
        if kv < 0:
            warnings.append(f"the budget is exceeded by {-kv} bytes before any KV cache: "
                            f"no room for it")
        return ProfileResult(
            budget_bytes=budget, device_total_bytes=device_total, utilization=utilization,
            baseline_bytes=baseline, weights_bytes=weights, other_torch_bytes=other_torch,
            non_torch_increase_bytes=non_torch_increase, peak_activation_bytes=peak_activation,
            kv_cache_budget_bytes=kv, weights_tag_bytes=end.weights_tag,
            non_torch_tracked_increase_bytes=end.tracked_non_torch - begin.tracked_non_torch,
            non_torch_basis=basis, warnings=warnings, graph_bytes=graph_bytes, **board_fields)


def nvml_process_memory(device: Any = None) -> Callable[[], ProcessMemory]:
    """A `process_memory` sampler reading vramledger.process_report(): NVML's per-process used
    memory for this process (the torch plugin's NvmlProcessMemory through
    ProbeProcessMemorySource) and the device's used/total. Where NVML does not list this process
    (PID namespaces, vGPU) the sample has no per-process figure and carries the report's caveat,
    so the profile takes the device-used fallback and says so.

        with memory_profile(process_memory=nvml_process_memory()) as prof: ...
    """
    from . import process_report  # the public API; imported late (needs torch)

    def sample() -> ProcessMemory:
        return process_memory_from_report(json.loads(process_report(device, format="json")))

    return sample


def process_memory_from_report(report: Dict[str, Any]) -> ProcessMemory:
    """The ProcessMemory a process report (docs/report_schema.md, "Process report") was built
    from: process usage is the per-process figure only under basis nvml_per_process; in the
    fallback it is the device's used memory, so it must not be passed on as per-process."""
    per_process = report["basis"] == "nvml_per_process"
    return ProcessMemory(
        device_used_bytes=int(report["device_used_bytes"]),
        device_total_bytes=int(report["device_total_bytes"]),
        process_used_bytes=int(report["process_usage_bytes"]) if per_process else None,
        process_used_unavailable="" if per_process else (report.get("caveat")
                                                          or "no per-process figure"))


def preload_non_torch(device: Any = None) -> Optional[Callable[[], Dict[str, int]]]:
    """A `non_torch` tracker reading the LD_PRELOAD shim's per-library bytes from
    vramledger.process_report(), or None when the shim is not loaded in this process (then pass
    nothing: the non-torch memory is still inside process usage - reserved)."""
    from . import process_report

    def by_library() -> Dict[str, int]:
        report = json.loads(process_report(device, format="json"))
        return {name: int(num) for name, num in report["non_torch"]["by_library"].items()}

    hooked = json.loads(process_report(device, format="json"))["non_torch"]["hooked"]
    return by_library if hooked else None


@contextlib.contextmanager
def memory_profile(device: Any = None, **kwargs: Any) -> Iterator[MemoryProfile]:
    """Opens a MemoryProfile (its baseline taken now); see the module docstring."""
    profile = MemoryProfile(device, **kwargs)
    profile.begin()
    yield profile

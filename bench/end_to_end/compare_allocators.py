#!/usr/bin/env python3
"""Real models, end to end, under each CUDA allocator: peak memory, step time, and whether the
losses (or generated tokens) are bitwise identical to PyTorch's native allocator.

    python3 bench/end_to_end/compare_allocators.py --out DIR [--quick] [--only NAMES]
        [--gpus N] [--time-limit-s S] [--run-timeout-s S] [--steps N --warmup N] [--commit SHA]
        [--together]   (a workload's allocators at once, in lock step: step_barrier.py; on one
                        GPU, or with --gpus N >= the allocators, each on its own)
    python3 bench/end_to_end/compare_allocators.py --dry-run [...]     # the plan, nothing run
    python3 bench/end_to_end/compare_allocators.py --render DIR/compare_allocators.json

Every (workload, allocator) pair runs in a FRESH Python process (allocator settings only take
effect before the first CUDA allocation), one after the other on a GPU; with --gpus N the
workloads are spread over N GPUs, each workload's runs staying on one GPU so that its figures
compare like with like. Models are built from configurations with random weights; nothing is
downloaded. The variable shapes come from random.Random(seed) and are identical in every run.

Allocators:
  native                  PyTorch's caching allocator, default settings
  native-again            the same, run again after the others (first with --native-last): an
                          A/A control. Its paired step ratio is the measurement's own noise,
                          and the others' step times are also given against the mean of the
                          two natives (ABA), which cancels a drift over the series
  expandable              PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  malloc_async            PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
  vramledger              vramledger.install("backend:vmm") before any CUDA allocation
  vramledger-pages        the same, page by page (map_chunk_mb:2): the packing chunks trade away
  vramledger-chunk16      the same with map_chunk_mb:16, the default's physical chunks until
                          2026-12-02 (4 MiB since): fewer driver calls, idle pages pinned at the peak
  vramledger-slack05      the same with cross_stream_slack_permille:5 (half the default slack)
  vramledger-noslack      the same with cross_stream_slack_pct:0: a stream takes another stream's
                          idle pages rather than grow (the default grows within 1% above the peak
                          of active bytes first)
  vramledger-nostreamorder  the same with alias_pending_pages:false,adopt_pending_frees:false:
                          the defaults before 2026-12-01 evening, where reuse waits for the CPU to
                          see the GPU finish (docs/configuration.md, issue 14)
  vramledger-placed       the same with place_by_mapped_pages:true: an allocation of 16 MiB or
                          more that needs new pages goes where a free block's mapped pages are
  vramledger-unmapinplace  the same with unmap_in_background:false: a moved chunk is unmapped at
                          its old address by the allocating thread, before the map (the default
                          before 2026-12-03)
  vramledger-front        the same with front_cache_mb:256: per-thread front caches (under torch
                          since 2026-12-04), the option the latency goal needs, not yet default
  vramledger-cuda_malloc  vramledger.install("backend:cuda_malloc")

Workloads:
  gpt2_train      GPT-2 small (124M), bf16 autocast, AdamW, batch 8, sequence 128..1024
  llama_train     Llama-style (8 layers, hidden 1024, bf16 weights), AdamW, batch 4, seq 128..2048
  gpt2_generate   GPT-2 small fp16, greedy model.generate (growing KV cache), batch 1..16,
                  prompt 16..256, 8..64 new tokens
  resnet50_train  torchvision ResNet-50, channels-last, fp32, SGD, batch 32..128, 224x224
  vit_train       torchvision ViT-Base/16, bf16 autocast, AdamW, batch 16..96, 224x224
  t5_train        T5 (6+6 layers, d_model 512), bf16 autocast, AdamW, batch 16, source 64..512
                  and target 16..128 tokens
  two_stream_train  ResNet-50 as above, inputs made on a side stream and handed to the main one
                  with an event and record_stream (their frees wait on the other stream)

Per run: peak reserved (torch.cuda.max_memory_reserved), peak requested
(memory_stats()["requested_bytes.all.peak"]) and peak allocated, their ratio, per-step wall times
(torch.cuda.synchronize() around each step, the garbage collector run before it and off inside;
median and p90 after the warm-up steps), the process's wall time, and each step's loss as a float
hex string (generation: a SHA-256 of each step's token ids). Deterministic settings throughout
(torch.use_deterministic_algorithms(True, warn_only=True), cudnn.deterministic, no
cudnn.benchmark, CUBLAS_WORKSPACE_CONFIG=:4096:8, the math attention kernel, losses through gather
rather than nll_loss), so any difference between allocators is a finding. When a vramledger run
differs from native, native is run once more (time permitting) to tell an allocator-caused
difference from a workload that is not reproducible at all.

Output in --out: compare_allocators.json (every raw figure), compare_allocators.md (tables),
compare_allocators.svg (plots), logs/ (one log per process), runs/ (each child's result).
The last line printed starts with "SUMMARY ". Exit status: 0 when every run succeeded and
vramledger's losses/tokens equal native's; 1 otherwise; 77 when there is no GPU (skipped); 124
when stopped by the time limit or a signal; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import random
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import e2e_common as common  # noqa: E402
from step_barrier import StepBarrier  # noqa: E402

SCHEMA = "vramledger-end-to-end/1"
GiB = float(1 << 30)
# A workload's run is not started when less time is left than its earlier run took, plus this.
RUN_LENGTH_MARGIN = 1.1
# The allocator entry that is vramledger's default configuration (what --max-ratio holds).
DEFAULT_VRAMLEDGER = "vramledger"


# The pieces: allocators, workloads, outputs (one module each).
from e2e_allocators import (ALLOCATORS, NATIVE_AGAIN, QUICK_ALLOCATORS, REFERENCE,  # noqa: E402
                            is_vramledger)
from e2e_workloads import QUICK_WORKLOADS, WORKLOADS  # noqa: E402
from e2e_render import render_markdown, summary_line, write_outputs  # noqa: E402,F401
from e2e_results import compare_records, ok_runs  # noqa: E402



def record_to_string(torch, kind: str, value: Any) -> str:
    """One step's comparable record: a loss as a float hex string (exact), or a digest of the
    generated token ids with their shape."""
    if kind == "loss_hex":
        return float(value.item()).hex()
    ids = value.to(torch.int64).flatten().tolist()
    text = "x".join(str(d) for d in value.shape) + ":" + ",".join(map(str, ids))
    return hashlib.sha256(text.encode()).hexdigest()


def apply_deterministic_settings(torch) -> Dict[str, Any]:
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # The math attention kernel: flash / memory-efficient / cuDNN attention backward passes
    # may accumulate with atomics.
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    return {"use_deterministic_algorithms": "True, warn_only=True",
            "cudnn.deterministic": True, "cudnn.benchmark": False, "sdpa": "math only",
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            "fill_uninitialized_memory": bool(
                getattr(getattr(torch.utils, "deterministic", None),
                        "fill_uninitialized_memory", False))}


def vramledger_key_figures(vramledger) -> Dict[str, Any]:
    stats = vramledger.stats()

    def peak(name: str) -> Optional[int]:
        return stats.get(name, {}).get("all", {}).get("peak")

    figures = {key: stats.get(key) for key in (
        "backend", "paged_heap", "num_device_alloc", "num_device_free", "num_maps",
        "num_unmaps", "num_alloc_retries", "num_ooms", "active_bytes_at_peak_reserved")}
    figures.update({"peak_reserved_bytes": peak("reserved_bytes"),
                    "peak_requested_bytes": peak("requested_bytes"),
                    "peak_physical_bytes": peak("physical_bytes"),
                    "peak_mapped_bytes": peak("mapped_bytes"),
                    "peak_virtual_bytes": peak("virtual_bytes"),
                    "fragmentation": stats.get("fragmentation")})
    return figures


def driver_calls(vramledger) -> Tuple[int, int, int, int]:
    """Maps, unmaps and physical allocations so far: their change over the timed steps is the
    driver calls per step that the figures are paid with (~30 us per map on the H200); then the
    allocator's waits for the GPU (BlockCensus::host_waits: each lets the GPU's queue run dry,
    ~10-15 ms of a ViT step on the H200)."""
    stats = vramledger.stats()
    return (int(stats.get("num_maps") or 0), int(stats.get("num_unmaps") or 0),
            int(stats.get("num_device_alloc") or 0),
            int((stats.get("policy") or {}).get("host_waits") or 0))


def timed_step(synchronize, step, before_start: Optional[Callable[[], None]] = None):
    """Runs step() between two synchronize() calls and returns (its result, seconds taken).
    Python's cyclic garbage collector runs before it, not inside: a collection that lands in a
    step would time the collector and free cyclic garbage (tensors included) at a point that
    differs from run to run, which moves the allocator's frees with it. The same for every
    allocator, so it takes noise out of the paired step ratios and nothing else. before_start
    (the --together lock step) runs after the synchronize, outside the timed region."""
    gc.collect()
    synchronize()
    gc.disable()
    try:
        if before_start is not None:
            before_start()
        t0 = time.perf_counter()
        result = step()
        synchronize()
        return result, time.perf_counter() - t0
    finally:
        gc.enable()


def profile_gpu_time(torch, workload, state, shapes) -> Dict[str, Any]:
    """GPU time per step (kernels, copies, memsets: torch.profiler's device time) over extra,
    untimed steps of the given shapes. Against native's same figure it tells where a slower step
    is lost: the same GPU time means the CPU side (the allocator's calls, launch gaps); more GPU
    time means the work itself ran slower (where its memory lies)."""
    from torch.profiler import ProfilerActivity, profile

    # CPU activity too: the CUDA one alone is refused where torch has no CUDA (the tests); the
    # CPU events' own device time is 0, so the sum below is the GPU's alone.
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if torch.cuda.is_available() else [])
    gpu_ms: List[float] = []
    for shape in shapes:
        torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            workload.step(torch, state, shape)
            torch.cuda.synchronize()
        total_us = 0.0
        for event in prof.key_averages():
            own = getattr(event, "self_device_time_total", None)
            if own is None:   # torch before the device_time names
                own = getattr(event, "self_cuda_time_total", 0.0)
            total_us += own
        gpu_ms.append(total_us / 1e3)
    return {"shapes": shapes, "gpu_ms": gpu_ms}


def child_main(workload_name: str, allocator_name: str, steps: int, warmup: int, seed: int,
               result_file: Path, profile_steps: int = 0,
               barrier: Optional[StepBarrier] = None) -> int:
    """One (workload, allocator) run in this fresh process; writes result_file. With a barrier
    (--together), every step starts when the sibling processes have reached it too."""
    common.die_with_parent()
    started = time.perf_counter()
    result: Dict[str, Any] = {"workload": workload_name, "allocator": allocator_name,
                              "status": "error", "steps": steps, "warmup": warmup, "seed": seed}
    try:
        workload = WORKLOADS[workload_name]
        allocator = ALLOCATORS[allocator_name]
        import torch

        if not torch.cuda.is_available():  # allocates nothing: install() may still follow
            result.update(status="no_gpu", error="torch.cuda.is_available() is False")
            common.write_json_atomic(result_file, result)
            return common.EXIT_NO_GPU
        vramledger = None
        if allocator.vramledger_conf is not None:
            import vramledger  # noqa: F811

            vramledger.install(allocator.vramledger_conf)  # before anything touches CUDA memory
        result["determinism"] = apply_deterministic_settings(torch)
        result["backend"] = torch.cuda.memory.get_allocator_backend()
        if result["backend"] != allocator.expected_backend:
            raise RuntimeError(f"allocator backend is {result['backend']!r}, expected "
                               f"{allocator.expected_backend!r} for {allocator_name}")
        result.update(torch_version=torch.__version__, gpu=torch.cuda.get_device_name(),
                      alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
        schedule = workload.schedule(random.Random(seed), steps)
        result["schedule"] = schedule
        torch.manual_seed(seed)
        imported = time.perf_counter()
        state = workload.build(torch)
        result["built_on"] = state.get("built_on")
        torch.cuda.synchronize()
        built = time.perf_counter()
        step_seconds: List[float] = []
        result["step_timing"] = "synchronized; gc.collect() before each step, gc disabled inside"
        raw_records = []
        calls_after_warmup = None  # (maps, unmaps, device allocs) when the timed steps begin
        per_step: List[List[int]] = []
        for index, shape in enumerate(schedule):
            if vramledger is not None and index == warmup:
                calls_after_warmup = driver_calls(vramledger)
            record, seconds = timed_step(
                torch.cuda.synchronize, lambda: workload.step(torch, state, shape),
                (lambda: barrier.wait(index)) if barrier is not None else None)
            raw_records.append(record)
            step_seconds.append(seconds)
            # Outside the timed region: where reserved memory and driver calls moved, step by
            # step (tells growth inside the timed steps from memory released and made again);
            # under vramledger the running totals of maps, unmaps, physical allocations and
            # host waits.
            per_step.append([torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved()]
                            + (list(driver_calls(vramledger)) if vramledger is not None else []))
        finished = time.perf_counter()
        if barrier is not None:
            result["lock_step"] = barrier.record()
        if profile_steps > 0:   # after the timed steps: the profiler's cost stays out of them
            try:
                result["profile"] = profile_gpu_time(torch, workload, state,
                                                     schedule[-profile_steps:])
            except Exception as error:  # noqa: BLE001 - a figure lost, not the run
                result["profile"] = {"error": repr(error)}
        measured = step_seconds[warmup:]
        stats = torch.cuda.memory_stats()
        result.update({
            "status": "ok",
            "record_kind": workload.record_kind,
            "records": [record_to_string(torch, workload.record_kind, r) for r in raw_records],
            "step_seconds": step_seconds,
            # After each step: reserved, peak reserved, and under vramledger the running totals
            # of maps, unmaps and physical allocations.
            "per_step": per_step,
            "median_step_ms": 1e3 * common.median(measured) if measured else None,
            "p90_step_ms": (1e3 * common.percentile_nearest_rank(measured, 90)
                            if measured else None),
            "import_torch_s": imported - started,
            "build_s": built - imported,          # includes importing transformers/torchvision
            "steps_s": finished - built,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
            "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
            # cudaMallocAsync does not count requested bytes: 0 there, recorded as None.
            "peak_requested_bytes": stats.get("requested_bytes.all.peak") or None,
            "torch_stats": {k: v for k, v in stats.items()
                            if k.startswith("num_") or k in ("reserved_bytes.all.peak",
                                                             "active_bytes.all.peak")},
        })
        if vramledger is not None:
            try:
                result["vramledger_stats"] = vramledger_key_figures(vramledger)
                timed = len(schedule) - warmup
                if calls_after_warmup is not None and timed > 0:
                    now = driver_calls(vramledger)
                    result["vramledger_stats"]["per_timed_step"] = {
                        name: (now[i] - calls_after_warmup[i]) / timed
                        for i, name in enumerate(("maps", "unmaps", "device_allocs",
                                                  "host_waits"))}
            except Exception as error:  # noqa: BLE001 -- figures for the record only
                result["vramledger_stats"] = {"error": repr(error)}
        result["child_total_s"] = time.perf_counter() - started
        common.write_json_atomic(result_file, result)
        return 0
    except BaseException as error:  # noqa: BLE001 -- every failure is recorded, then re-raised
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = traceback.format_exc()[-4000:]
        common.write_json_atomic(result_file, result)
        print(result["traceback"], file=sys.stderr, flush=True)
        return 1
    finally:
        if barrier is not None:  # however the run ended, the siblings stop waiting for it
            barrier.leave()


# --------------------------------------------------------------------------------------------
# Parent: plan, run, compare


def parse_names(only: Optional[str]) -> Tuple[List[str], List[str]]:
    """--only NAME[,NAME...]: workload and allocator names mixed; returns (workloads,
    allocators) named, each empty when none of that kind was named."""
    if not only:
        return [], []
    workloads, allocators = [], []
    for name in (part.strip() for part in only.split(",")):
        if not name:
            continue
        if name in WORKLOADS:
            workloads.append(name)
        elif name in ALLOCATORS:
            allocators.append(name)
        else:
            raise ValueError(f"--only: unknown name {name!r}; workloads: "
                             f"{', '.join(WORKLOADS)}; allocators: {', '.join(ALLOCATORS)}")
    return workloads, allocators


def select(args) -> Tuple[List[str], List[str]]:
    workloads = list(QUICK_WORKLOADS if args.quick else WORKLOADS)
    allocators = list(QUICK_ALLOCATORS if args.quick else ALLOCATORS)
    only_w, only_a = parse_names(args.only)
    if only_w:
        workloads = [w for w in WORKLOADS if w in only_w]   # --only overrides --quick's choice
    if only_a:
        allocators = [a for a in ALLOCATORS if a in only_a]
    if REFERENCE not in allocators:  # every comparison is against native
        allocators.insert(0, REFERENCE)
    # Native first (the reference), then vramledger's, then torch's alternatives, and the A/A
    # control last, so that every other allocator runs between the two natives.
    order = [REFERENCE] + [a for a in ALLOCATORS if is_vramledger(a)] + \
        [a for a in ALLOCATORS if a not in (REFERENCE, NATIVE_AGAIN) and not is_vramledger(a)] + \
        [NATIVE_AGAIN]
    return workloads, [a for a in order if a in allocators]


def steps_of(workload: str, args) -> Tuple[int, int]:
    w = WORKLOADS[workload]
    steps = args.steps if args.steps is not None else w.steps
    warmup = args.warmup if args.warmup is not None else min(w.warmup, max(steps - 1, 0))
    return steps, warmup


def run_key(workload: str, allocator: str, control: bool = False) -> str:
    return f"{workload}.{allocator}" + (".control" if control else "")


def child_command(args, workload: str, allocator: str, result_file: Path,
                  barrier: Optional[Tuple[Path, List[str]]] = None) -> List[str]:
    steps, warmup = steps_of(workload, args)
    command = [args.python, str(Path(__file__).resolve()), "--child", workload,
               "--allocator", allocator, "--steps", str(steps), "--warmup", str(warmup),
               "--seed", str(args.seed), "--result-file", str(result_file),
               "--profile-steps", str(args.profile_steps)]
    if barrier is not None:
        command += ["--barrier", str(barrier[0]), "--barrier-parties", ",".join(barrier[1])]
    return command


class Runner:
    """Runs the plan (one lane per GPU), keeps every run's record, and rewrites the outputs
    after each run so that a run cut short still leaves its figures."""

    def __init__(self, args, doc: Dict[str, Any], registry: common.ProcessRegistry,
                 deadline: float,
                 command_for: Callable[..., List[str]] = child_command) -> None:
        self.args = args
        self.doc = doc
        self.registry = registry
        self.deadline = deadline
        self.command_for = command_for
        self.lock = threading.Lock()
        self.out = Path(args.out)
        self.threads: List[threading.Thread] = []
        # Set once the document is final: a lane still winding down after a stop (its
        # wait_for_lanes timed out) must not add records behind the listing of what never ran.
        self.closed = False

    def expected_wall_s(self, workload: str) -> Optional[float]:
        """The longest finished run of this workload so far, with a margin; None before any."""
        with self.lock:
            walls = [r["wall_s"] for r in self.doc["runs"]
                     if r["workload"] == workload and r["status"] == "ok" and r.get("wall_s")]
        return max(walls) * RUN_LENGTH_MARGIN if walls else None

    def run_one(self, workload: str, allocator: str, gpu: Optional[str],
                control: bool = False,
                barrier: Optional[Tuple[Path, List[str]]] = None) -> Dict[str, Any]:
        key = run_key(workload, allocator, control)
        record: Dict[str, Any] = {"key": key, "workload": workload, "allocator": allocator,
                                  "control": control, "gpu": gpu, "status": "not_run"}
        left = self.deadline - time.monotonic()
        # A run that the time left cannot hold would only be killed: judge its length by the
        # workload's run under another allocator (the same program and schedule).
        needs = self.expected_wall_s(workload)
        if self.registry.stopped:
            record["error"] = "stopped before this run started"
        elif left < self.args.min_run_s:
            record["error"] = (f"not started: only {left:.0f}s of the "
                               f"{self.args.time_limit_s:.0f}s time limit left")
        elif needs is not None and left < needs:
            record["error"] = (f"not started: only {left:.0f}s of the "
                               f"{self.args.time_limit_s:.0f}s time limit left, and this "
                               f"workload's earlier run took {needs / RUN_LENGTH_MARGIN:.0f}s")
        else:
            result_file = self.out / "runs" / f"{key}.json"
            log_file = self.out / "logs" / f"{key}.log"
            result_file.unlink(missing_ok=True)
            timeout = min(self.args.run_timeout_s, left)
            env = common.child_environment(ALLOCATORS[allocator].env, gpu)
            print(f"[{time.strftime('%H:%M:%S')}] {key} on GPU {gpu} (limit {timeout:.0f}s)",
                  flush=True)
            outcome = common.run_process(
                self.command_for(self.args, workload, allocator, result_file, barrier),
                env, timeout, log_file, self.registry)
            record.update(exit_code=outcome.exit_code, wall_s=round(outcome.wall_s, 3),
                          timeout_s=round(timeout, 1), log=str(log_file.relative_to(self.out)))
            result = common.read_json(result_file) or {}
            record["result"] = result
            if outcome.start_error:
                record.update(status="failed", error=outcome.start_error)
            elif outcome.timed_out:
                record.update(status="timeout",
                              error=f"timed out after {timeout:.0f}s (killed)")
            elif result.get("status") == "no_gpu" or outcome.exit_code == common.EXIT_NO_GPU:
                record.update(status="no_gpu", error=result.get("error", "no GPU"))
            elif outcome.exit_code == 0 and result.get("status") == "ok":
                record["status"] = "ok"
            elif result.get("status") == "ok":
                record.update(status="failed", error=(
                    f"exit {outcome.exit_code} after writing its result (a crash at interpreter "
                    "exit?); log tail:\n" + common.log_tail(log_file)))
            else:
                record["status"] = "failed"
                record["error"] = result.get("error") or (
                    f"exit {outcome.exit_code}, no result written; log tail:\n"
                    + common.log_tail(log_file))
            if record["status"] != "ok" and self.registry.stopped:
                record.update(status="interrupted", error="killed: the comparison was stopped")
            if record["status"] != "ok":
                record["log_tail"] = common.log_tail(log_file, 25)
            summary = (f"median {result['median_step_ms']:.1f} ms, peak reserved "
                       f"{result['peak_reserved_bytes'] / GiB:.2f} GiB"
                       if record["status"] == "ok" and result.get("median_step_ms") is not None
                       else record.get("error", ""))
            print(f"    {key}: {record['status']} in {outcome.wall_s:.1f}s; {summary}",
                  flush=True)
        with self.lock:
            if self.closed:
                return record
            self.doc["runs"].append(record)
            finish_document(self.doc)
            write_outputs(self.doc, self.out)
        return record

    def run_lane(self, plan: List[Tuple[str, str]], gpu: Optional[str]) -> None:
        for workload, allocator in plan:
            record = self.run_one(workload, allocator, gpu)
            if record["status"] == "no_gpu":
                self.registry.stopped = True   # nothing else can run either

    def run_lane_together(self, workloads: List[str], allocators: List[str],
                          gpus: List[str]) -> None:
        """--together: each workload's allocators at once, in lock step; allocator i on
        gpus[i % len(gpus)] (one GPU for all, or one GPU each)."""
        for workload in workloads:
            folder = self.out / "barriers" / workload
            shutil.rmtree(folder, ignore_errors=True)
            group = [threading.Thread(target=self.run_one,
                                      args=(workload, a, gpus[i % len(gpus)]),
                                      kwargs={"barrier": (folder, allocators)}, daemon=True)
                     for i, a in enumerate(allocators)]
            for thread in group:
                thread.start()
            for thread in group:
                thread.join()
            if any(r["status"] == "no_gpu" for r in self.doc["runs"]):
                self.registry.stopped = True

    def run(self, workloads: List[str], allocators: List[str], gpus: List[str]) -> None:
        if self.args.together:
            # With a GPU per allocator, each runs on its own (the host's drift still hits all
            # alike, and none shares a GPU); with fewer, each workload's group shares one GPU.
            if len(gpus) >= len(allocators):
                self.doc["meta"]["together_layout"] = "one GPU per allocator"
                groups = [(workloads, gpus[:len(allocators)])]
            else:
                self.doc["meta"]["together_layout"] = "one GPU per workload's group"
                groups = [(workloads[i::len(gpus)], [gpu]) for i, gpu in enumerate(gpus)]
            self.threads = [threading.Thread(target=self.run_lane_together,
                                             args=(mine, allocators, lane_gpus), daemon=True)
                            for mine, lane_gpus in groups if mine]
        else:
            lanes: List[List[Tuple[str, str]]] = [[] for _ in gpus]
            # --native-last runs each workload's allocators in the reverse order, so that a
            # series of invocations alternating it cancels any advantage of running first (GPU
            # clocks, caches, the host's load) out of the paired step times.
            order = list(reversed(allocators)) if self.args.native_last else allocators
            for index, workload in enumerate(workloads):  # a workload's runs share one GPU
                lanes[index % len(gpus)].extend((workload, a) for a in order)
            self.threads = [threading.Thread(target=self.run_lane, args=(plan, gpu), daemon=True)
                            for plan, gpu in zip(lanes, gpus) if plan]
        for thread in self.threads:
            thread.start()
        for thread in self.threads:
            while thread.is_alive():   # short joins keep the main thread responsive to signals
                thread.join(0.5)
        self.run_controls()

    def wait_for_lanes(self, seconds: float) -> None:
        """After a stop: let the lanes record their killed runs before the final write."""
        end = time.monotonic() + seconds
        for thread in self.threads:
            thread.join(max(end - time.monotonic(), 0))

    def run_controls(self) -> None:
        """A second native run, on the same GPU, for each workload where a vramledger run
        differed from native: does native reproduce itself?"""
        for comparison in list(self.doc["comparisons"]):
            if self.registry.stopped:
                return
            if comparison["identical"] is False and is_vramledger(comparison["allocator"]):
                workload = comparison["workload"]
                keys = {r["key"]: r for r in self.doc["runs"]}
                if run_key(workload, REFERENCE, True) not in keys:
                    gpu = keys[run_key(workload, REFERENCE)].get("gpu")
                    self.run_one(workload, REFERENCE, gpu, control=True)



def paired_median(ours: Sequence[float], theirs: Sequence[float], warmup: int) -> Optional[float]:
    """Median over the timed steps of our step time over theirs (the same step's shapes)."""
    ratios = [a / b for a, b in zip(ours[warmup:], theirs[warmup:]) if a and b]
    return common.median(ratios) if ratios else None


def derive_figures(run: Dict[str, Any], native: Optional[Dict[str, Any]],
                   again: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The table's figures for one run: peak reserved GiB, overhead ratio (and its basis), step
    times against native's (and, with the A/A control `again`, against the mean of the two
    natives, which ran before and after this one)."""
    result = run.get("result", {})
    reserved = result.get("peak_reserved_bytes")
    requested = result.get("peak_requested_bytes")
    basis = "own requested peak"
    if not requested and native is not None:
        # cudaMallocAsync counts no requested bytes; the program requests the same bytes under
        # every allocator, so native's figure is the denominator.
        requested = native["result"].get("peak_requested_bytes")
        basis = "native's requested peak"
    ratio = reserved / requested if reserved and requested else None
    native_ms = native["result"].get("median_step_ms") if native else None
    median_ms = result.get("median_step_ms")
    # Step by step against native's same step (same shapes in every run): the schedule's own
    # spread of step times cancels out, which the ratio of two medians does not.
    paired = paired_aba = gpu_ratio = None
    ours_gpu = (result.get("profile") or {}).get("gpu_ms")
    theirs_gpu = ((native or {}).get("result", {}).get("profile") or {}).get("gpu_ms")
    if ours_gpu and theirs_gpu and len(ours_gpu) == len(theirs_gpu):
        gpu_ratio = common.median([a / b for a, b in zip(ours_gpu, theirs_gpu) if a and b] or [0])
    if native is not None and result.get("schedule") == native["result"].get("schedule"):
        warmup = result.get("warmup", 0)
        ours, theirs = result.get("step_seconds") or [], native["result"].get("step_seconds") or []
        paired = paired_median(ours, theirs, warmup)
        if (again is not None and again is not run and run.get("allocator") != REFERENCE
                and again["result"].get("schedule") == result.get("schedule")):
            twice = again["result"].get("step_seconds") or []
            both = [(a + b) / 2 if a and b else None for a, b in zip(theirs, twice)]
            paired_aba = paired_median(ours, both, warmup)
    return {"peak_reserved_gib": reserved / GiB if reserved else None,
            "overhead_ratio": ratio, "ratio_basis": basis if ratio else None,
            "median_step_ms": median_ms, "p90_step_ms": result.get("p90_step_ms"),
            "step_time_vs_native": (median_ms / native_ms if median_ms and native_ms else None),
            "paired_step_ratio": paired,
            "paired_step_ratio_aba": paired_aba,
            "paired_gpu_time_ratio": gpu_ratio or None,
            "peak_reserved_vs_native": (reserved / native["result"]["peak_reserved_bytes"]
                                        if reserved and native else None)}


def finish_document(doc: Dict[str, Any]) -> None:
    """Recomputes comparisons, derived figures, failures and the verdict from doc["runs"]."""
    runs = ok_runs(doc)
    comparisons, failures = [], []
    for workload in doc["plan"]["workloads"]:
        native = runs.get((workload, REFERENCE, False))
        control = runs.get((workload, REFERENCE, True))
        for allocator in doc["plan"]["allocators"]:
            if allocator == REFERENCE:
                continue
            other = runs.get((workload, allocator, False))
            entry: Dict[str, Any] = {"workload": workload, "allocator": allocator}
            if native is None or other is None:
                entry.update(identical=None, reason="native or this run did not succeed")
            else:
                entry.update(compare_records(native, other))
                if entry["identical"] is False and control is not None:
                    verdict = compare_records(native, control)
                    entry["native_reproducible"] = verdict["identical"]
                    entry["native_control"] = verdict
            comparisons.append(entry)
            if entry["identical"] is False and is_vramledger(allocator):
                why = entry["reason"]
                if entry.get("native_reproducible") is False:
                    why += ("; INCONCLUSIVE: native itself differed between two runs "
                            f"({entry['native_control']['reason']})")
                elif entry.get("native_reproducible") is True:
                    why += "; native reproduced itself bitwise, so the allocator changed results"
                failures.append(f"{workload}: {allocator} differs from native: {why}")
    max_ratio = doc["meta"].get("max_ratio")
    for run in doc["runs"]:
        native = runs.get((run["workload"], REFERENCE, False))
        again = runs.get((run["workload"], NATIVE_AGAIN, False))
        if run["status"] == "ok":
            run["derived"] = derive_figures(run, native, again)
            ratio = run["derived"]["overhead_ratio"]
            # The guard holds the default configuration (the figure users get) to its goal.
            if (max_ratio and run["allocator"] == DEFAULT_VRAMLEDGER and not run["control"]
                    and ratio is not None and ratio > max_ratio):
                failures.append(f"{run['workload']}: {run['allocator']} peak reserved / peak "
                                f"requested {ratio:.4f} > {max_ratio} (--max-ratio)")
        else:
            why = str(run.get("error") or "").strip().splitlines()
            failures.append(f"{run['key']}: {run['status']}: {why[0] if why else ''}")
    doc["comparisons"] = comparisons
    doc["failures"] = failures


def exit_status(doc: Dict[str, Any]) -> int:
    statuses = {r["status"] for r in doc["runs"]}
    if doc.get("skipped") or ("no_gpu" in statuses and "ok" not in statuses):
        return common.EXIT_NO_GPU
    if doc.get("interrupted"):
        return common.EXIT_INTERRUPTED
    return 1 if doc["failures"] else 0



# --------------------------------------------------------------------------------------------
# main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="output folder (default: end-to-end-results; with "
                                      "--render: the JSON's folder)")
    parser.add_argument("--quick", action="store_true",
                        help=f"workloads {', '.join(QUICK_WORKLOADS)} and allocators "
                             f"{', '.join(QUICK_ALLOCATORS)} only")
    parser.add_argument("--only", metavar="NAMES",
                        help="comma-separated workload and/or allocator names (native is always "
                             "run as the reference)")
    parser.add_argument("--gpus", type=int, default=1,
                        help="spread workloads over this many GPUs (default 1)")
    parser.add_argument("--time-limit-s", type=float, default=230,
                        help="whole comparison; runs that cannot start in time are reported "
                             "as not run (default 230)")
    parser.add_argument("--run-timeout-s", type=float, default=90,
                        help="one process's limit (default 90)")
    parser.add_argument("--min-run-s", type=float, default=12, help=argparse.SUPPRESS)
    parser.add_argument("--profile-steps", type=int, default=0, metavar="N",
                        help="after the timed steps, run the last N shapes again under "
                             "torch.profiler and record their GPU time (default 0: none)")
    parser.add_argument("--max-ratio", type=float, metavar="R",
                        help=f"fail when {DEFAULT_VRAMLEDGER}'s (the default configuration's) "
                             "peak reserved / peak requested exceeds R (the GPU suite's guard)")
    parser.add_argument("--native-last", action="store_true",
                        help="run each workload's allocators in the reverse order, native last "
                             "(alternate it between invocations so running first favours none)")
    parser.add_argument("--together", action="store_true",
                        help="run each workload's allocators at the same time, every step in "
                             "lock step (step_barrier.py): the host's drift then hits all alike; "
                             "on one GPU they share it, with --gpus N >= the allocators each "
                             "has its own")
    parser.add_argument("--steps", type=int, help="steps per run (default: per workload)")
    parser.add_argument("--warmup", type=int, help="untimed first steps (default: per workload)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--commit", help="git commit to record (the device copy may lack .git)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter for the child processes (default: this one)")
    parser.add_argument("--no-matplotlib", action="store_true",
                        help="write the SVG by hand even when matplotlib is installed")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    parser.add_argument("--render", metavar="JSON",
                        help="only rewrite the markdown and SVG from a result JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--allocator", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    parser.add_argument("--barrier", help=argparse.SUPPRESS)
    parser.add_argument("--barrier-parties", help=argparse.SUPPRESS)
    return parser


def new_document(args, workloads: List[str], allocators: List[str]) -> Dict[str, Any]:
    return {
        "schema": SCHEMA,
        "meta": {"date": common.utc_now(), "commit": args.commit or common.git_commit(REPO),
                 "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
                 "seed": args.seed, "quick": args.quick, "gpus": args.gpus,
                 "time_limit_s": args.time_limit_s, "run_timeout_s": args.run_timeout_s,
                 "native_last": args.native_last, "max_ratio": args.max_ratio,
                 "together": args.together,
                 "plot": "svg-writer" if args.no_matplotlib else "auto"},
        "plan": {"workloads": workloads, "allocators": allocators,
                 "allocator_specs": {a: {"description": ALLOCATORS[a].description,
                                         "env": ALLOCATORS[a].env,
                                         "vramledger_conf": ALLOCATORS[a].vramledger_conf}
                                     for a in allocators},
                 "workload_specs": {w: {"description": WORKLOADS[w].description,
                                        "steps": steps_of(w, args)[0],
                                        "warmup": steps_of(w, args)[1],
                                        "record_kind": WORKLOADS[w].record_kind}
                                    for w in workloads}},
        "runs": [], "comparisons": [], "failures": [],
    }


def main(argv: Optional[Sequence[str]] = None,
         command_for: Callable[..., List[str]] = child_command) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child:
        if (args.child not in WORKLOADS or args.allocator not in ALLOCATORS
                or not args.result_file or args.steps is None or args.warmup is None):
            parser.error("--child needs a known workload, --allocator, --steps, --warmup and "
                         "--result-file")
        barrier = None
        if args.barrier:
            barrier = StepBarrier(Path(args.barrier), args.allocator,
                                  (args.barrier_parties or args.allocator).split(","))
        return child_main(args.child, args.allocator, args.steps, args.warmup, args.seed,
                          Path(args.result_file), args.profile_steps, barrier)
    if args.render:
        doc = common.read_json(Path(args.render))
        if doc is None or doc.get("schema") != SCHEMA:
            print(f"compare_allocators: {args.render} is not a {SCHEMA} result", file=sys.stderr)
            return 2
        out = Path(args.out) if args.out else Path(args.render).parent
        finish_document(doc)
        write_outputs(doc, out, use_matplotlib=not args.no_matplotlib)
        print(render_markdown(doc))
        print("SUMMARY " + summary_line(doc))
        return exit_status(doc)
    args.out = args.out or "end-to-end-results"
    try:
        workloads, allocators = select(args)
    except ValueError as error:
        parser.error(str(error))
    if args.gpus < 1:
        parser.error("--gpus must be at least 1")
    if args.max_ratio is not None and not args.max_ratio >= 1:
        parser.error("--max-ratio must be a number >= 1")
    if args.profile_steps < 0:
        parser.error("--profile-steps must be 0 or more")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.warmup is not None and (args.warmup < 0 or args.warmup >= (args.steps or min(
            WORKLOADS[w].steps for w in workloads))):
        parser.error("--warmup must leave at least one timed step")
    if args.dry_run:
        gpus = common.visible_gpu_ids(args.gpus)
        print(f"plan: {len(workloads)} workloads x {len(allocators)} allocators = "
              f"{len(workloads) * len(allocators)} processes on GPU(s) {', '.join(gpus)}; "
              f"{args.run_timeout_s:.0f}s each at most, {args.time_limit_s:.0f}s in all")
        for index, workload in enumerate(workloads):
            for allocator in (list(reversed(allocators)) if args.native_last else allocators):
                env = ALLOCATORS[allocator].env
                result_file = Path(args.out) / "runs" / f"{run_key(workload, allocator)}.json"
                command = command_for(args, workload, allocator, result_file)
                print(f"  GPU {gpus[index % len(gpus)]}: "
                      + " ".join(f"{k}={v}" for k, v in env.items())
                      + (" " if env else "") + " ".join(command))
        return 0

    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    registry = common.ProcessRegistry()
    common.install_signal_handlers(registry)
    started = time.monotonic()
    deadline = started + args.time_limit_s
    doc = new_document(args, workloads, allocators)
    runner = Runner(args, doc, registry, deadline, command_for)
    try:
        probe = common.probe_environment(args.python, registry, out / "logs" / "probe.log",
                                         timeout_s=min(90, args.time_limit_s / 3))
        doc["meta"]["environment"] = probe
        reason = common.no_gpu_reason(probe)
        if reason:
            doc["skipped"] = reason
            write_outputs(doc, out, use_matplotlib=False)
            print(f"compare_allocators: SKIPPED: {reason}")
            print(f"SUMMARY skipped: {reason}")
            return common.EXIT_NO_GPU
        if any(is_vramledger(a) for a in allocators) and "vramledger_error" in probe:
            print("compare_allocators: vramledger is not importable "
                  f"({probe['vramledger_error']}); its runs will fail (put the staged package "
                  "on PYTHONPATH)", flush=True)
        gpus = common.visible_gpu_ids(min(args.gpus, probe.get("device_count") or 1,
                                          max(len(workloads), len(allocators))
                                          if args.together else len(workloads)))
        doc["meta"]["gpu_ids"] = gpus
        runner.run(workloads, allocators, gpus)
    except common.Interrupted as stop:
        doc["interrupted"] = str(stop)
        print(f"compare_allocators: {stop}; writing what was measured", flush=True)
        registry.stop()
        runner.wait_for_lanes(10)
    doc["meta"]["total_wall_s"] = round(time.monotonic() - started, 1)
    with runner.lock:
        runner.closed = True
        recorded = {r["key"] for r in doc["runs"]}
        for workload in workloads:  # what never ran is listed, not silently missing
            for allocator in allocators:
                if run_key(workload, allocator) not in recorded:
                    doc["runs"].append({"key": run_key(workload, allocator), "workload": workload,
                                        "allocator": allocator, "control": False,
                                        "status": "not_run",
                                        "error": doc.get("interrupted") or "not started"})
        finish_document(doc)
        write_outputs(doc, out, use_matplotlib=not args.no_matplotlib)
    print()
    print(render_markdown(doc))
    for failure in doc["failures"]:
        print(f"FAILURE: {failure}")
    print(f"outputs: {out}/compare_allocators.{{json,md,svg}}, logs in {out}/logs")
    print("SUMMARY " + summary_line(doc))
    return exit_status(doc)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Real models, end to end, under each CUDA allocator: peak memory, step time, and whether the
losses (or generated tokens) are bitwise identical to PyTorch's native allocator.

    python3 bench/end_to_end/compare_allocators.py --out DIR [--quick] [--only NAMES]
        [--gpus N] [--time-limit-s S] [--run-timeout-s S] [--steps N --warmup N] [--commit SHA]
    python3 bench/end_to_end/compare_allocators.py --dry-run [...]     # the plan, nothing run
    python3 bench/end_to_end/compare_allocators.py --render DIR/compare_allocators.json

Every (workload, allocator) pair runs in a FRESH Python process (allocator settings only take
effect before the first CUDA allocation), one after the other on a GPU; with --gpus N the
workloads are spread over N GPUs, each workload's runs staying on one GPU so that its figures
compare like with like. Models are built from configurations with random weights; nothing is
downloaded. The variable shapes come from random.Random(seed) and are identical in every run.

Allocators:
  native                  PyTorch's caching allocator, default settings
  expandable              PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  malloc_async            PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
  vramledger              vramledger.install("backend:vmm") before any CUDA allocation
  vramledger-pages        the same, page by page (map_chunk_mb:2): the packing chunks trade away
  vramledger-cuda_malloc  vramledger.install("backend:cuda_malloc")

Workloads:
  gpt2_train      GPT-2 small (124M), bf16 autocast, AdamW, batch 8, sequence 128..1024
  llama_train     Llama-style (8 layers, hidden 1024, bf16 weights), AdamW, batch 4, seq 128..2048
  gpt2_generate   GPT-2 small fp16, greedy model.generate (growing KV cache), batch 1..16,
                  prompt 16..256, 8..64 new tokens
  resnet50_train  torchvision ResNet-50, channels-last, fp32, SGD, batch 32..128, 224x224

Per run: peak reserved (torch.cuda.max_memory_reserved), peak requested
(memory_stats()["requested_bytes.all.peak"]) and peak allocated, their ratio, per-step wall times
(torch.cuda.synchronize() around each step; median and p90 after the warm-up steps), the
process's wall time, and each step's loss as a float hex string (generation: a SHA-256 of each
step's token ids). Deterministic settings throughout (torch.use_deterministic_algorithms(True,
warn_only=True), cudnn.deterministic, no cudnn.benchmark, CUBLAS_WORKSPACE_CONFIG=:4096:8, the
math attention kernel, losses through gather rather than nll_loss), so any difference between
allocators is a finding. When a vramledger run differs from native, native is run once more
(time permitting) to tell an allocator-caused difference from a workload that is not
reproducible at all.

Output in --out: compare_allocators.json (every raw figure), compare_allocators.md (tables),
compare_allocators.svg (plots), logs/ (one log per process), runs/ (each child's result).
The last line printed starts with "SUMMARY ". Exit status: 0 when every run succeeded and
vramledger's losses/tokens equal native's; 1 otherwise; 77 when there is no GPU (skipped); 124
when stopped by the time limit or a signal; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import e2e_common as common  # noqa: E402

SCHEMA = "vramledger-end-to-end/1"
GiB = float(1 << 30)


# --------------------------------------------------------------------------------------------
# Allocator configurations


@dataclass(frozen=True)
class Allocator:
    name: str
    description: str
    env: Dict[str, str] = field(default_factory=dict)
    vramledger_conf: Optional[str] = None      # install() argument; None: not vramledger
    expected_backend: str = "native"          # torch.cuda.memory.get_allocator_backend()


ALLOCATORS: Dict[str, Allocator] = {a.name: a for a in [
    Allocator("native", "PyTorch caching allocator, default settings"),
    Allocator("expandable", "PyTorch, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
              env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    Allocator("malloc_async", "PyTorch, PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync",
              env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
              expected_backend="cudaMallocAsync"),
    Allocator("vramledger", 'vramledger.install("backend:vmm")', vramledger_conf="backend:vmm",
              expected_backend="vramledger"),
    Allocator("vramledger-pages", 'vramledger.install("backend:vmm,map_chunk_mb:2")',
              vramledger_conf="backend:vmm,map_chunk_mb:2", expected_backend="vramledger"),
    Allocator("vramledger-cuda_malloc", 'vramledger.install("backend:cuda_malloc")',
              vramledger_conf="backend:cuda_malloc", expected_backend="vramledger"),
]}
REFERENCE = "native"
QUICK_ALLOCATORS = ["native", "expandable", "vramledger"]


def is_vramledger(allocator: str) -> bool:
    return ALLOCATORS[allocator].vramledger_conf is not None


# --------------------------------------------------------------------------------------------
# Workloads (child side: torch is imported only inside these functions)


def global_mean_pool(torch):
    """A module that stands in for AdaptiveAvgPool2d(1), whose CUDA backward has no
    deterministic kernel (the same figures, computed as a mean)."""

    class GlobalMeanPool(torch.nn.Module):
        def forward(self, x):
            return x.mean(dim=(2, 3), keepdim=True)

    return GlobalMeanPool()


def class_loss(torch, logits, labels):
    """Cross-entropy through log_softmax + gather: gather's backward is deterministic under
    use_deterministic_algorithms, torch's CUDA nll_loss has no deterministic implementation."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, labels.unsqueeze(-1)).mean()


def build_on_gpu(torch, make: Callable[[], Any]) -> Tuple[Any, str]:
    """Builds a model with its parameters created (and randomly initialised) on the GPU, which
    is several times quicker than on the CPU; falls back to the CPU if a library refuses."""
    try:
        with torch.device("cuda"):
            return make(), "cuda"
    except Exception as error:  # noqa: BLE001 -- any refusal: the slow path still works
        print(f"building on the GPU failed ({error!r}); building on the CPU", flush=True)
        return make().cuda(), "cpu"


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    steps: int
    warmup: int
    record_kind: str                                   # "loss_hex" or "tokens_sha256"
    schedule: Callable[[random.Random, int], List[Dict[str, int]]]
    build: Callable[[Any], Dict[str, Any]]             # torch -> state
    step: Callable[[Any, Dict[str, Any], Dict[str, int]], Any]


def _gpt2_train_schedule(rng: random.Random, steps: int) -> List[Dict[str, int]]:
    return [{"batch": 8, "seq": rng.choice(range(128, 1025, 64))} for _ in range(steps)]


def _gpt2_train_build(torch) -> Dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config()
    model, built_on = build_on_gpu(torch, lambda: GPT2LMHeadModel(config))
    model.train()
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-4),
            "vocab": config.vocab_size, "built_on": built_on}


def _lm_train_step(torch, state, shape, autocast: bool):
    ids = torch.randint(0, state["vocab"], (shape["batch"], shape["seq"]), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = state["model"](input_ids=ids).logits
    loss = class_loss(torch, logits[:, :-1], ids[:, 1:])
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return loss.detach()


def _llama_train_schedule(rng: random.Random, steps: int) -> List[Dict[str, int]]:
    return [{"batch": 4, "seq": rng.choice(range(128, 2049, 128))} for _ in range(steps)]


def _llama_train_build(torch) -> Dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                         max_position_embeddings=2048)
    model, built_on = build_on_gpu(torch, lambda: LlamaForCausalLM(config))
    model = model.to(dtype=torch.bfloat16).train()
    return {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-4),
            "vocab": config.vocab_size, "built_on": built_on}


def _gpt2_generate_schedule(rng: random.Random, steps: int) -> List[Dict[str, int]]:
    return [{"batch": rng.choice([1, 2, 4, 8, 16]), "prompt": rng.choice(range(16, 257, 16)),
             "new_tokens": rng.choice(range(8, 65, 8))} for _ in range(steps)]


def _gpt2_generate_build(torch) -> Dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config()
    model, built_on = build_on_gpu(torch, lambda: GPT2LMHeadModel(config))
    model = model.to(dtype=torch.float16).eval()
    return {"model": model, "vocab": config.vocab_size, "built_on": built_on}


def _gpt2_generate_step(torch, state, shape):
    ids = torch.randint(0, state["vocab"], (shape["batch"], shape["prompt"]), device="cuda")
    with torch.no_grad():
        out = state["model"].generate(ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=shape["new_tokens"],
                                      min_new_tokens=shape["new_tokens"], do_sample=False,
                                      pad_token_id=0)
    return out.cpu()  # tokens go back to the host, as a server's would


def _resnet50_schedule(rng: random.Random, steps: int) -> List[Dict[str, int]]:
    return [{"batch": rng.choice([32, 48, 64, 96, 128]), "size": 224} for _ in range(steps)]


def _resnet50_build(torch) -> Dict[str, Any]:
    import torchvision

    def make():
        model = torchvision.models.resnet50(weights=None)
        model.avgpool = global_mean_pool(torch)
        return model

    model, built_on = build_on_gpu(torch, make)
    model = model.to(memory_format=torch.channels_last).train()
    return {"model": model, "built_on": built_on,
            "opt": torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)}


def _resnet50_step(torch, state, shape):
    x = torch.randn(shape["batch"], 3, shape["size"], shape["size"], device="cuda")
    x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (shape["batch"],), device="cuda")
    loss = class_loss(torch, state["model"](x), y)
    loss.backward()
    state["opt"].step()
    state["opt"].zero_grad(set_to_none=True)
    return loss.detach()


WORKLOADS: Dict[str, Workload] = {w.name: w for w in [
    Workload("gpt2_train", "GPT-2 small training, bf16 autocast, AdamW, batch 8, seq 128-1024",
             12, 3, "loss_hex", _gpt2_train_schedule, _gpt2_train_build,
             lambda torch, s, shape: _lm_train_step(torch, s, shape, autocast=True)),
    Workload("llama_train", "Llama-style 8 layers x 1024, bf16, AdamW, batch 4, seq 128-2048",
             12, 3, "loss_hex", _llama_train_schedule, _llama_train_build,
             lambda torch, s, shape: _lm_train_step(torch, s, shape, autocast=False)),
    Workload("gpt2_generate", "GPT-2 small fp16 greedy generate, batch 1-16, prompt 16-256, "
             "8-64 new tokens", 8, 2, "tokens_sha256", _gpt2_generate_schedule,
             _gpt2_generate_build, _gpt2_generate_step),
    Workload("resnet50_train", "ResNet-50 training, channels-last, fp32, SGD, batch 32-128",
             12, 3, "loss_hex", _resnet50_schedule, _resnet50_build, _resnet50_step),
]}
QUICK_WORKLOADS = ["gpt2_train", "resnet50_train"]


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


def child_main(workload_name: str, allocator_name: str, steps: int, warmup: int, seed: int,
               result_file: Path) -> int:
    """One (workload, allocator) run in this fresh process; writes result_file."""
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
        raw_records = []
        for shape in schedule:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            raw_records.append(workload.step(torch, state, shape))
            torch.cuda.synchronize()
            step_seconds.append(time.perf_counter() - t0)
        finished = time.perf_counter()
        measured = step_seconds[warmup:]
        stats = torch.cuda.memory_stats()
        result.update({
            "status": "ok",
            "record_kind": workload.record_kind,
            "records": [record_to_string(torch, workload.record_kind, r) for r in raw_records],
            "step_seconds": step_seconds,
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
    # Native first (the reference), then vramledger's, then torch's alternatives.
    order = [REFERENCE] + [a for a in ALLOCATORS if is_vramledger(a)] + \
            [a for a in ALLOCATORS if a != REFERENCE and not is_vramledger(a)]
    return workloads, [a for a in order if a in allocators]


def steps_of(workload: str, args) -> Tuple[int, int]:
    w = WORKLOADS[workload]
    steps = args.steps if args.steps is not None else w.steps
    warmup = args.warmup if args.warmup is not None else min(w.warmup, max(steps - 1, 0))
    return steps, warmup


def run_key(workload: str, allocator: str, control: bool = False) -> str:
    return f"{workload}.{allocator}" + (".control" if control else "")


def child_command(args, workload: str, allocator: str, result_file: Path) -> List[str]:
    steps, warmup = steps_of(workload, args)
    return [args.python, str(Path(__file__).resolve()), "--child", workload,
            "--allocator", allocator, "--steps", str(steps), "--warmup", str(warmup),
            "--seed", str(args.seed), "--result-file", str(result_file)]


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

    def run_one(self, workload: str, allocator: str, gpu: Optional[str],
                control: bool = False) -> Dict[str, Any]:
        key = run_key(workload, allocator, control)
        record: Dict[str, Any] = {"key": key, "workload": workload, "allocator": allocator,
                                  "control": control, "gpu": gpu, "status": "not_run"}
        left = self.deadline - time.monotonic()
        if self.registry.stopped:
            record["error"] = "stopped before this run started"
        elif left < self.args.min_run_s:
            record["error"] = (f"not started: only {left:.0f}s of the "
                               f"{self.args.time_limit_s:.0f}s time limit left")
        else:
            result_file = self.out / "runs" / f"{key}.json"
            log_file = self.out / "logs" / f"{key}.log"
            result_file.unlink(missing_ok=True)
            timeout = min(self.args.run_timeout_s, left)
            env = common.child_environment(ALLOCATORS[allocator].env, gpu)
            print(f"[{time.strftime('%H:%M:%S')}] {key} on GPU {gpu} (limit {timeout:.0f}s)",
                  flush=True)
            outcome = common.run_process(self.command_for(self.args, workload, allocator,
                                                          result_file),
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
            self.doc["runs"].append(record)
            finish_document(self.doc)
            write_outputs(self.doc, self.out)
        return record

    def run_lane(self, plan: List[Tuple[str, str]], gpu: Optional[str]) -> None:
        for workload, allocator in plan:
            record = self.run_one(workload, allocator, gpu)
            if record["status"] == "no_gpu":
                self.registry.stopped = True   # nothing else can run either

    def run(self, workloads: List[str], allocators: List[str], gpus: List[str]) -> None:
        lanes: List[List[Tuple[str, str]]] = [[] for _ in gpus]
        for index, workload in enumerate(workloads):  # a workload's runs share one GPU
            lanes[index % len(gpus)].extend((workload, a) for a in allocators)
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


def ok_runs(doc: Dict[str, Any]) -> Dict[Tuple[str, str, bool], Dict[str, Any]]:
    return {(r["workload"], r["allocator"], r.get("control", False)): r
            for r in doc["runs"] if r["status"] == "ok"}


def compare_records(reference: Dict[str, Any], other: Dict[str, Any]) -> Dict[str, Any]:
    """Bitwise comparison of two runs' per-step records (and their shape schedules)."""
    ref, oth = reference["result"], other["result"]
    if ref.get("schedule") != oth.get("schedule"):
        return {"identical": False, "reason": "different shape schedules (seed or code differs)",
                "step": None}
    step = common.first_difference(ref.get("records", []), oth.get("records", []))
    if step is None:
        return {"identical": True, "step": None}
    records_ref, records_oth = ref.get("records", []), oth.get("records", [])
    return {"identical": False, "step": step,
            "reference_value": records_ref[step] if step < len(records_ref) else None,
            "value": records_oth[step] if step < len(records_oth) else None,
            "reason": f"step {step} differs ({ref.get('record_kind')})"}


def derive_figures(run: Dict[str, Any], native: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The table's figures for one run: peak reserved GiB, overhead ratio (and its basis)."""
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
    return {"peak_reserved_gib": reserved / GiB if reserved else None,
            "overhead_ratio": ratio, "ratio_basis": basis if ratio else None,
            "median_step_ms": median_ms, "p90_step_ms": result.get("p90_step_ms"),
            "step_time_vs_native": (median_ms / native_ms if median_ms and native_ms else None),
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
    for run in doc["runs"]:
        native = runs.get((run["workload"], REFERENCE, False))
        if run["status"] == "ok":
            run["derived"] = derive_figures(run, native)
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
# Outputs: markdown, SVG


def _cell(run: Optional[Dict[str, Any]]) -> str:
    if run is None:
        return "—"
    if run["status"] != "ok":
        return f"**{run['status'].upper()}**"
    d = run["derived"]
    ratio = common.fmt_optional(d["overhead_ratio"], ".3f")
    if d["ratio_basis"] == "native's requested peak":
        ratio += "*"
    return (f"{common.fmt_optional(d['peak_reserved_gib'], '.2f')} GiB · {ratio} · "
            f"{common.fmt_optional(d['median_step_ms'], '.1f')} ms")


def _identical_cell(doc: Dict[str, Any], workload: str) -> str:
    entries = [c for c in doc["comparisons"] if c["workload"] == workload]
    if not entries:
        return "n/a"
    differ = [c for c in entries if c["identical"] is False]
    unknown = [c for c in entries if c["identical"] is None]
    if differ:
        text = "no: " + ", ".join(f"{c['allocator']} (step {c['step']})"
                                  if c.get("step") is not None else c["allocator"]
                                  for c in differ)
    else:
        text = "yes"
    if unknown:
        text += " (not compared: " + ", ".join(c["allocator"] for c in unknown) + ")"
    return text


def _identical_to_native(doc: Dict[str, Any], run: Dict[str, Any]) -> str:
    """The "identical to native" entry of one run's row."""
    if run["allocator"] == REFERENCE and not run.get("control"):
        return "reference"
    native = ok_runs(doc).get((run["workload"], REFERENCE, False))
    if run["status"] != "ok" or native is None:
        return "n/a"
    verdict = compare_records(native, run)
    return "yes" if verdict["identical"] else f"no ({verdict['reason']})"


def render_markdown(doc: Dict[str, Any]) -> str:
    meta, env = doc["meta"], doc["meta"].get("environment", {})
    allocators, workloads = doc["plan"]["allocators"], doc["plan"]["workloads"]
    runs = {(r["workload"], r["allocator"]): r for r in doc["runs"] if not r.get("control")}
    lines = [
        "# End-to-end comparison of allocators",
        "",
        f"Date {meta.get('date')}, commit {meta.get('commit') or 'unknown'}; GPU "
        f"{', '.join(env.get('gpus') or []) or 'unknown'}; torch {env.get('torch')} "
        f"(CUDA {env.get('torch_cuda')}), transformers {env.get('transformers')}, torchvision "
        f"{env.get('torchvision')}, Python {env.get('python')}. Command: "
        f"`{meta.get('command')}` ({meta.get('total_wall_s', 0):.0f} s wall"
        f"{', INTERRUPTED' if doc.get('interrupted') else ''}).",
        "",
        *([f"**SKIPPED**: {doc['skipped']}", ""] if doc.get("skipped") else []),
        "Each cell: peak reserved (torch.cuda.max_memory_reserved) · peak reserved / peak "
        "requested · median step time after the warm-up steps. Every run is a fresh process; "
        "the same seeds and shape schedule in every column.",
        "",
        "| workload | " + " | ".join(allocators) + " | losses identical to native |",
        "|---|" + "---|" * len(allocators) + "---|",
    ]
    for workload in workloads:
        cells = [_cell(runs.get((workload, a))) for a in allocators]
        lines.append(f"| {workload} | " + " | ".join(cells) + f" | "
                     f"{_identical_cell(doc, workload)} |")
    if any(r.get("derived", {}).get("ratio_basis") == "native's requested peak"
           for r in doc["runs"]):
        lines += ["", "\\* cudaMallocAsync counts no requested bytes: ratio against native's "
                  "peak requested for the same workload (the program requests the same bytes)."]
    lines += ["", "## Workloads", ""]
    for workload in workloads:
        spec = doc["plan"]["workload_specs"].get(workload, {})
        lines.append(f"- `{workload}`: {spec.get('description')}; {spec.get('steps')} steps, "
                     f"the first {spec.get('warmup')} not timed.")
    lines += ["", "## Every run", "",
              "| workload | allocator | status | peak reserved B | peak requested B | "
              "peak allocated B | ratio | vs native reserved | median ms | p90 ms | vs native "
              "step | process s | identical to native |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for run in doc["runs"]:
        result, d = run.get("result", {}), run.get("derived", {})
        identical = _identical_to_native(doc, run)
        name = run["allocator"] + (" (control)" if run.get("control") else "")

        def num(key: str) -> str:
            value = result.get(key)
            return f"{value:,}" if isinstance(value, int) else "n/a"

        lines.append(
            f"| {run['workload']} | {name} | {run['status']} | {num('peak_reserved_bytes')} | "
            f"{num('peak_requested_bytes')} | {num('peak_allocated_bytes')} | "
            f"{common.fmt_optional(d.get('overhead_ratio'), '.4f')} | "
            f"{common.fmt_optional(d.get('peak_reserved_vs_native'), '.3f')} | "
            f"{common.fmt_optional(d.get('median_step_ms'), '.1f')} | "
            f"{common.fmt_optional(d.get('p90_step_ms'), '.1f')} | "
            f"{common.fmt_optional(d.get('step_time_vs_native'), '.3f')} | "
            f"{common.fmt_optional(run.get('wall_s'), '.1f')} | {identical} |")
    vram = [r for r in doc["runs"] if r["status"] == "ok" and r["result"].get("vramledger_stats")]
    if vram:
        lines += ["", "## vramledger's own figures", "",
                  "| workload | allocator | backend | paged heap | device allocs | maps | unmaps |"
                  " GMLake ratio | overhead ratio |", "|---|---|---|---|---:|---:|---:|---:|---:|"]
        for run in vram:
            s = run["result"]["vramledger_stats"]
            frag = s.get("fragmentation") or {}
            lines.append(f"| {run['workload']} | {run['allocator']} | {s.get('backend')} | "
                         f"{s.get('paged_heap')} | {s.get('num_device_alloc')} | "
                         f"{s.get('num_maps')} | {s.get('num_unmaps')} | "
                         f"{common.fmt_optional(frag.get('gmlake_ratio'), '.4f')} | "
                         f"{common.fmt_optional(frag.get('overhead_ratio'), '.4f')} |")
    lines += ["", "## Failures and differences", ""]
    lines += [f"- {f}" for f in doc["failures"]] or ["none"]
    return "\n".join(lines) + "\n"


PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3"]


def plot_panels(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The plotted quantities: {title, values[(workload, allocator)]}. The ratios are drawn as
    percentages above 1 so that bars start at zero and small differences stay visible."""
    runs = {(r["workload"], r["allocator"]): r for r in doc["runs"]
            if r["status"] == "ok" and not r.get("control")}

    def values(key: str, transform: Callable[[float], float] = lambda v: v):
        return {k: (None if r["derived"].get(key) is None else transform(r["derived"][key]))
                for k, r in runs.items()}

    as_percent_above_one = lambda v: (v - 1.0) * 100.0  # noqa: E731
    return [
        {"title": "peak reserved (GiB)", "values": values("peak_reserved_gib")},
        {"title": "peak reserved above peak requested (%)",
         "values": values("overhead_ratio", as_percent_above_one)},
        {"title": "median step time vs native (%)",
         "values": values("step_time_vs_native", as_percent_above_one)},
    ]


def _nice_ceiling(value: float, mantissas: Sequence[float] = (1, 2, 2.5, 5, 10)) -> float:
    """The smallest m x 10^k >= value, m one of `mantissas` (round tick steps)."""
    if value <= 0:
        return 1.0
    exponent = 10.0 ** int(f"{value:e}".split("e")[1])
    for step in mantissas:
        if step * exponent >= value * (1 - 1e-12):
            return step * exponent
    return 10 * exponent


def _axis(values: Sequence[float]) -> Tuple[float, float, List[float]]:
    """(low, high, ticks) for bars drawn from zero: zero inside, about four round steps."""
    high = max([0.0] + list(values))
    low = min([0.0] + list(values))
    if high == low:
        high = 1.0
    step = _nice_ceiling((high - low) * 1.05 / 4)
    low = math.floor(low / step - 1e-9) * step if low < 0 else 0.0
    high = math.ceil(high / step - 1e-9) * step if high > 0 else 0.0
    count = int(round((high - low) / step))
    return low, high, [low + i * step for i in range(count + 1)]


def render_svg(doc: Dict[str, Any]) -> str:
    """Grouped bars (one group per workload, one bar per allocator), one panel per quantity;
    hand-written SVG so that no plotting library is needed. A run without a figure shows ×."""
    from xml.sax.saxutils import escape

    workloads, allocators = doc["plan"]["workloads"], doc["plan"]["allocators"]
    panels = plot_panels(doc)
    bar_w, gap, left, right, panel_h, plot_h, top = 16, 28, 70, 20, 250, 170, 60
    group_w = bar_w * len(allocators)
    gpu = (doc["meta"].get("environment", {}).get("gpus") or ["GPU unknown"])[0]
    legend, x = [], left
    for i, allocator in enumerate(allocators):
        color = PALETTE[i % len(PALETTE)]
        legend.append(f'<rect x="{x}" y="30" width="10" height="10" fill="{color}"/>')
        legend.append(f'<text x="{x + 14}" y="39">{escape(allocator)}</text>')
        x += 24 + 7 * len(allocator)   # ~7 px per character at 11 px sans-serif
    width = max(left + right + max(len(workloads), 1) * (group_w + gap), x + right)
    height = top + panel_h * len(panels)
    title = f"Allocators end to end on {gpu} ({doc['meta'].get('date')})"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="14">{escape(title)}</text>']
    out += legend
    for p, panel in enumerate(panels):
        y0 = top + p * panel_h + 20          # top of the plot area
        present = [v for v in panel["values"].values() if v is not None]
        low, high, ticks = _axis(present)

        def y_of(value: float) -> float:
            return y0 + plot_h * (high - value) / (high - low)

        out.append(f'<text x="{left}" y="{y0 - 6}" font-size="12" font-weight="bold">'
                   f'{escape(panel["title"])}</text>')
        for value in ticks:                  # grid and y labels
            y = y_of(value)
            out.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
                       f'stroke="#e0e0e0"/>')
            out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                       f'{value:.3g}</text>')
        zero = y_of(0.0)
        out.append(f'<line x1="{left}" y1="{y0}" x2="{left}" y2="{y0 + plot_h}" stroke="black"/>')
        out.append(f'<line x1="{left}" y1="{zero:.1f}" x2="{width - right}" y2="{zero:.1f}" '
                   'stroke="black"/>')
        for g, workload in enumerate(workloads):
            gx = left + gap / 2 + g * (group_w + gap)
            for i, allocator in enumerate(allocators):
                value = panel["values"].get((workload, allocator))
                bx = gx + i * bar_w
                if value is None:
                    out.append(f'<text x="{bx + bar_w / 2:.1f}" y="{zero - 3:.1f}" '
                               f'text-anchor="middle" fill="#888">×</text>')
                    continue
                top_y, bottom_y = sorted((y_of(value), zero))
                out.append(f'<rect x="{bx:.1f}" y="{top_y:.1f}" width="{bar_w - 2}" '
                           f'height="{bottom_y - top_y:.1f}" fill="{PALETTE[i % len(PALETTE)]}">'
                           f'<title>{escape(f"{workload}, {allocator}: {value:.4g}")}</title>'
                           '</rect>')
            out.append(f'<text x="{gx + group_w / 2:.1f}" y="{y0 + plot_h + 14}" '
                       f'text-anchor="middle">{escape(workload)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render_svg_matplotlib(doc: Dict[str, Any]) -> Optional[str]:
    """The same panels through matplotlib when it is installed; None otherwise."""
    try:
        import io

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 -- not installed or unusable: the hand-written SVG
        return None
    workloads, allocators = doc["plan"]["workloads"], doc["plan"]["allocators"]
    panels = plot_panels(doc)
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(6, 1.6 * len(workloads) + 2),
                                                      3.0 * len(panels)), squeeze=False)
    width = 0.8 / max(len(allocators), 1)
    for ax, panel in zip(axes[:, 0], panels):
        for i, allocator in enumerate(allocators):
            xs = [g + (i - (len(allocators) - 1) / 2) * width for g in range(len(workloads))]
            ys = [panel["values"].get((w, allocator)) for w in workloads]
            ax.bar([x for x, y in zip(xs, ys) if y is not None],
                   [y for y in ys if y is not None], width, label=allocator,
                   color=PALETTE[i % len(PALETTE)])
            for x, y in zip(xs, ys):
                if y is None:
                    ax.text(x, 0, "×", ha="center", va="bottom", color="#888")
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xticks(range(len(workloads)))
        ax.set_xticklabels(workloads, fontsize=8)
    axes[0, 0].legend(fontsize=7, ncol=min(len(allocators), 5))
    gpu = (doc["meta"].get("environment", {}).get("gpus") or ["GPU unknown"])[0]
    fig.suptitle(f"Allocators end to end on {gpu} ({doc['meta'].get('date')})", fontsize=11)
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    plt.close(fig)
    return buffer.getvalue()


def write_outputs(doc: Dict[str, Any], out: Path, use_matplotlib: bool = True) -> None:
    svg = None
    if use_matplotlib and doc["meta"].get("plot") != "svg-writer":
        try:
            svg = render_svg_matplotlib(doc)
        except Exception as error:  # noqa: BLE001 -- a plotting failure must not lose results
            print(f"matplotlib plot failed ({error!r}); writing the SVG by hand", flush=True)
    doc["meta"]["plot_writer"] = "matplotlib" if svg else "svg-writer"
    common.write_text_atomic(out / "compare_allocators.svg", svg or render_svg(doc))
    common.write_json_atomic(out / "compare_allocators.json", doc)
    common.write_text_atomic(out / "compare_allocators.md", render_markdown(doc))


def _percent_range(values: List[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:+.1f}%" if abs(high - low) < 0.05 else f"{low:+.1f}..{high:+.1f}%"


def summary_line(doc: Dict[str, Any]) -> str:
    """One short line for the GPU suite's summary: counts, then for each vramledger
    configuration how many workloads match native bitwise and the range over workloads of its
    peak reserved and median step time relative to native."""
    runs = [r for r in doc["runs"] if not r.get("control")]
    ok = sum(r["status"] == "ok" for r in runs)
    planned = len(doc["plan"]["workloads"]) * len(doc["plan"]["allocators"])
    parts = [f"{ok}/{planned} runs ok"]
    for allocator in (a for a in doc["plan"]["allocators"] if is_vramledger(a)):
        comps = [c for c in doc["comparisons"] if c["allocator"] == allocator]
        same = sum(c["identical"] is True for c in comps)
        text = f"{allocator}: identical to native {same}/{len(comps)}"
        derived = [r["derived"] for r in runs
                   if r["allocator"] == allocator and r["status"] == "ok"]
        reserved = [(d["peak_reserved_vs_native"] - 1) * 100 for d in derived
                    if d.get("peak_reserved_vs_native") is not None]
        step = [(d["step_time_vs_native"] - 1) * 100 for d in derived
                if d.get("step_time_vs_native") is not None]
        if reserved:
            text += f", peak reserved vs native {_percent_range(reserved)}"
        if step:
            text += f", median step {_percent_range(step)}"
        parts.append(text)
    if doc.get("interrupted"):
        parts.append("INTERRUPTED")
    return "; ".join(parts)


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
    return parser


def new_document(args, workloads: List[str], allocators: List[str]) -> Dict[str, Any]:
    return {
        "schema": SCHEMA,
        "meta": {"date": common.utc_now(), "commit": args.commit or common.git_commit(REPO),
                 "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
                 "seed": args.seed, "quick": args.quick, "gpus": args.gpus,
                 "time_limit_s": args.time_limit_s, "run_timeout_s": args.run_timeout_s,
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
        return child_main(args.child, args.allocator, args.steps, args.warmup, args.seed,
                          Path(args.result_file))
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
            for allocator in allocators:
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
                                          len(workloads)))
        doc["meta"]["gpu_ids"] = gpus
        runner.run(workloads, allocators, gpus)
    except common.Interrupted as stop:
        doc["interrupted"] = str(stop)
        print(f"compare_allocators: {stop}; writing what was measured", flush=True)
        registry.stop()
        runner.wait_for_lanes(10)
    doc["meta"]["total_wall_s"] = round(time.monotonic() - started, 1)
    with runner.lock:
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

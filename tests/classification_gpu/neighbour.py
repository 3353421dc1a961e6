#!/usr/bin/env python3
"""Check 2 (docs/classification.md, "Checks still to run on the H200"): a neighbour process
cannot move our profile, while it moves vLLM's.

    python tests/classification_gpu/neighbour.py [--out DIR]

Three fresh worker processes, one after the other, each under `vramledger run`, each profiling
a model load + forward with vramledger.profiling.memory_profile fed by NVML
(nvml_process_memory(): the plugin's NvmlProcessMemory through process_report):

  alone   no other process on the GPU
  alloc   a neighbour process (raw driver calls, no torch) allocates 8 GiB INSIDE the profiling
          scope: the worker tells it through a pipe and waits for its answer before closing the
          scope
  free    the neighbour holds 8 GiB from before the profile and frees it inside the scope

Each worker also holds a raw cudaMalloc of known size (outside torch) across the scope, so the
non-torch increase is not trivially 0, and computes vLLM's `(total - free) -
torch.cuda.memory_reserved()` at the profile's start and end in the same run.

Asserted: our non_torch_increase_bytes is identical (0 B difference) in all three runs and at
least the raw allocation; vLLM's figure moves by more than 7.5 GiB (+ for alloc, - for free)
against the run alone, which proves the neighbour really was there. Weights and activation peak
must not change either. Without a GPU: "skipped: no GPU", exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import GIB, MIB, Outcome, gib, round_up  # noqa: E402

CHECK = "neighbour"
NEIGHBOUR_BYTES = 8 * GIB
RAW_BYTES = 48 * MIB + 12345  # held outside torch across the profiling scope
VARIANTS = ("alone", "alloc", "free")
VLLM_MOVE_MIN = 7.5 * GIB
HELPER_WAIT_S = 20.0


# ---------------------------------------------------------------- the neighbour process


def helper(hold_at_start: bool) -> int:
    """A second process on device 0 using only the driver API (starts in well under a second):
    prints 'ready' once its context exists (and, if asked, 8 GiB are held), then obeys 'alloc',
    'free' and 'exit' lines on stdin, answering each; exits on EOF or after 10 idle minutes."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    cuda.cuMemGetInfo_v2.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 2

    def check(status: int, call: str) -> None:
        if status != 0:
            print(f"error {call} CUresult {status}", flush=True)
            sys.exit(1)

    check(cuda.cuInit(0), "cuInit")
    device = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    context = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")

    def free_bytes() -> int:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
        return free.value

    held: List[int] = []

    def alloc() -> None:
        pointer = ctypes.c_uint64()
        check(cuda.cuMemAlloc_v2(ctypes.byref(pointer), NEIGHBOUR_BYTES), "cuMemAlloc_v2")
        check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
        held.append(pointer.value)

    def free() -> None:
        check(cuda.cuMemFree_v2(held.pop()), "cuMemFree_v2")
        check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")

    if hold_at_start:
        alloc()
    print(f"ready free={free_bytes()}", flush=True)
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], 600)
        line = sys.stdin.readline().strip() if readable else "exit"
        if line in ("", "exit"):
            return 0
        before = free_bytes()
        if line == "alloc":
            alloc()
        elif line == "free":
            free()
        else:
            print(f"error unknown command {line!r}", flush=True)
            continue
        print(f"{line} device_free_before={before} device_free_after={free_bytes()}", flush=True)


class Neighbour:
    """The worker's handle on the helper process: commands and their answers, with time limits."""

    def __init__(self, hold_at_start: bool) -> None:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("VRAMLEDGER_") and k != "LD_PRELOAD"}
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--role", "helper"]
            + (["--hold"] if hold_at_start else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ready = self._answer("ready")

    def _answer(self, expected: str) -> Dict[str, int]:
        deadline = time.monotonic() + HELPER_WAIT_S
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.process.stdout], [], [],
                                           max(0.0, deadline - time.monotonic()))
            if not readable:
                break
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"neighbour exited (status {self.process.poll()}) before "
                                   f"answering {expected!r}")
            words = line.split()
            if words and words[0] == expected:
                return {k: int(v) for k, v in (w.split("=") for w in words[1:])}
            if words and words[0] == "error":
                raise RuntimeError(f"neighbour: {line.strip()}")
        raise RuntimeError(f"neighbour did not answer {expected!r} within {HELPER_WAIT_S:.0f} s")

    def command(self, word: str) -> Dict[str, int]:
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()
        return self._answer(word)

    def close(self) -> int:
        try:
            self.process.stdin.write("exit\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10)


# ---------------------------------------------------------------- the profiled worker


def build_model(torch: Any) -> tuple:
    """GPT-2 small from its config (random weights) when transformers is there, else a stack
    of Linear layers of similar size. Built on the CPU: only the move to the GPU is the load."""
    torch.manual_seed(0)
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config()).eval()
        inputs = torch.randint(0, model.config.vocab_size, (4, 512))
        return model, inputs, "GPT-2 small (transformers, random weights)"
    except ImportError:
        layers = []
        for _ in range(12):
            layers += [torch.nn.Linear(2048, 2048), torch.nn.GELU()]
        model = torch.nn.Sequential(*layers).eval()
        return model, torch.randn(4 * 512, 2048), "12 x Linear(2048, 2048) (transformers missing)"


def worker(variant: str) -> int:
    import torch

    import vramledger
    from vramledger.profiling import memory_profile, nvml_process_memory

    assert vramledger.is_installed(), "vramledger run did not install vramledger"
    torch.cuda.synchronize()  # the CUDA context exists before the baseline, as in vLLM
    model, inputs, model_name = build_model(torch)

    def vllm_non_torch() -> int:
        free, total = torch.cuda.mem_get_info()
        return (total - free) - torch.cuda.memory_reserved()

    neighbour = Neighbour(hold_at_start=(variant == "free")) if variant != "alone" else None
    raw = _common.RawCuda()
    answer: Dict[str, int] = {}
    try:
        sampler = nvml_process_memory()
        vllm_begin = vllm_non_torch()
        with memory_profile(process_memory=sampler) as prof:
            with prof.loading():
                with vramledger.tag("weights"):
                    model = model.to("cuda")
                    inputs = inputs.to("cuda")
            with prof.profiling():
                raw_address = raw.alloc(RAW_BYTES)
                with torch.inference_mode():
                    output = model(inputs)
                    del output
                torch.cuda.synchronize()
                if neighbour is not None:
                    answer = neighbour.command("alloc" if variant == "alloc" else "free")
        vllm_end = vllm_non_torch()
        report = json.loads(vramledger.process_report(format="json"))
        raw.free(raw_address)
    finally:
        helper_status = neighbour.close() if neighbour is not None else None
    result = prof.result(utilization=0.9)
    _common.emit({
        "variant": variant, "model": model_name, "raw_via": raw.via,
        "non_torch_increase_bytes": result.non_torch_increase_bytes,
        "non_torch_basis": result.non_torch_basis,
        "weights_bytes": result.weights_bytes,
        "peak_activation_bytes": result.peak_activation_bytes,
        "baseline_bytes": result.baseline_bytes,
        "kv_cache_budget_bytes": result.kv_cache_budget_bytes,
        "accounted_equals_budget": result.accounted_bytes() == result.budget_bytes,
        "warnings": result.warnings, "log_lines": result.log_lines(),
        "vllm_non_torch_increase_bytes": vllm_end - vllm_begin,
        "neighbour_device_free_change_bytes": (answer["device_free_after"]
                                               - answer["device_free_before"]) if answer else 0,
        "neighbour_exit": helper_status,
        "report_basis": report["basis"],
        "report_other_processes_bytes": report["other_processes_bytes"],
    })
    return 0


# ---------------------------------------------------------------- verdict


def analyse(results: Dict[str, Dict[str, Any]], outcome: Outcome) -> None:
    """The assertions, on the three workers' RESULT dicts (pure: tests/classification_gpu/
    test_offline.py feeds it made-up results)."""
    alone = results["alone"]
    for variant in VARIANTS:
        r = results[variant]
        outcome.figures[f"{variant}: ours non_torch_increase"] = (
            f"{r['non_torch_increase_bytes']} B; vLLM's {r['vllm_non_torch_increase_bytes']} B "
            f"({gib(r['vllm_non_torch_increase_bytes'])})")
        outcome.expect(r["non_torch_basis"] == "process_usage",
                       f"{variant}: profile basis {r['non_torch_basis']}, not process_usage "
                       f"(NVML per-process figure missing?)")
        outcome.expect(r["accounted_equals_budget"], f"{variant}: lines do not add up to budget")
        outcome.expect(not any("MISSING HOOK" in w for w in r["warnings"]),
                       f"{variant}: {r['warnings']}")
        outcome.expect(r["non_torch_increase_bytes"] >= round_up(RAW_BYTES, _common.DRIVER_GRANULE),
                       f"{variant}: non-torch increase {r['non_torch_increase_bytes']} B is less "
                       f"than the raw cudaMalloc held across the scope "
                       f"({round_up(RAW_BYTES, _common.DRIVER_GRANULE)} B)")
    for variant, sign in (("alloc", +1), ("free", -1)):
        r = results[variant]
        ours = r["non_torch_increase_bytes"] - alone["non_torch_increase_bytes"]
        vllm = r["vllm_non_torch_increase_bytes"] - alone["vllm_non_torch_increase_bytes"]
        outcome.figures[f"{variant} vs alone: ours moves"] = f"{ours} B"
        outcome.figures[f"{variant} vs alone: vLLM moves"] = f"{vllm} B ({gib(vllm)})"
        outcome.figures[f"{variant}: neighbour's own view (device free change)"] = (
            f"{r['neighbour_device_free_change_bytes']} B")
        outcome.expect(ours == 0, f"{variant}: our non-torch increase moved by {ours} B "
                                  f"with the neighbour (must be 0)")
        outcome.expect(sign * vllm > VLLM_MOVE_MIN,
                       f"{variant}: vLLM's figure moved by {gib(vllm)}, expected "
                       f"{'+' if sign > 0 else '-'}8 GiB (> {VLLM_MOVE_MIN / GIB} GiB): was the "
                       f"neighbour's {NEIGHBOUR_BYTES} B really inside the scope?")
        outcome.expect(r["neighbour_exit"] == 0, f"{variant}: neighbour exit {r['neighbour_exit']}")
        for key in ("weights_bytes", "peak_activation_bytes"):
            outcome.expect(r[key] == alone[key],
                           f"{variant}: {key} {r[key]} B differs from alone {alone[key]} B")
    outcome.figures["weights / activation peak"] = (
        f"{alone['weights_bytes']} B / {alone['peak_activation_bytes']} B ({alone['model']})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("main", "worker", "helper"), default="main")
    parser.add_argument("--variant", choices=VARIANTS, default="alone")
    parser.add_argument("--hold", action="store_true", help="helper: hold 8 GiB from the start")
    parser.add_argument("--out", default=None, help="folder for the workers' logs")
    parser.add_argument("--timeout", type=float, default=60.0, help="per worker, seconds")
    args = parser.parse_args()
    if args.role == "helper":
        return helper(args.hold)
    if args.role == "worker":
        return worker(args.variant)

    _common.skip_without_gpu(CHECK)
    folder = _common.out_dir(args.out, CHECK)
    outcome = Outcome(CHECK)
    results: Dict[str, Dict[str, Any]] = {}
    for variant in VARIANTS:
        command = _common.vramledger_run(os.path.abspath(__file__),
                                         ["--role", "worker", "--variant", variant],
                                         track_non_torch=False)
        result, why = _common.run_worker(command, args.timeout,
                                         os.path.join(folder, f"worker-{variant}.log"),
                                         env=_common.worker_env())
        if result is None:
            outcome.failures.append(f"worker {variant}: {why} (see worker-{variant}.log)")
            outcome.finish()
        results[variant] = result
    with open(os.path.join(folder, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    analyse(results, outcome)
    outcome.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sleep and wake on a GPU: vramledger against torch_memory_saver (issue 17, docs/sleep.md).

For each allocator, in a fresh interpreter: a model of --weights-gib of bf16 weights (offloaded
to pinned host memory on sleep) and a --kv-gib KV cache (discarded), a CUDA graph captured over
the model (vramledger sleeps its private pool too: tag "graphs"); then --rounds of sleep + wake, each measured (wall time around the call, device
synchronised on both sides) with the process's memory from NVML before and while asleep; after
every wake: weights bitwise intact, the graph's replay bitwise identical, the cache writable.
Prints a Markdown table (and --json-out PATH: every figure) with the device, torch and commit.

    python bench/sleep/bench_sleep.py                     # 8 GiB weights + 16 GiB KV, 3 rounds
    python bench/sleep/bench_sleep.py --which vramledger  # only vramledger

Variants (--which, comma-separated; all by default). The first sleep of a process pins the host
memory it offloads to (seconds for 8 GiB) unless it was pinned at start-up; the column "host
memory pinned" says where each row's pinning happened, so round 1 is not mistaken for the rest:

    vramledger           pinned in round 1's sleep, cudaHostAlloc (VRAMLEDGER_SLEEP_PIN=host_alloc)
    vramledger-register  pinned in round 1's sleep, huge pages faulted in parallel + cudaHostRegister
    vramledger-prepared  pinned at start-up by vramledger.prepare_offload(["weights"]) (timed apart)
    tms-torch            torch_memory_saver 0.0.10, hook_mode="torch" (a CUDAPluggableAllocator)
    tms-preload          torch_memory_saver 0.0.10, hook_mode="preload": its worker starts with its
                         LD_PRELOAD library, set by its own configure_subprocess()

torch_memory_saver (`pip install torch_memory_saver==0.0.10`) is used when importable; otherwise
its rows say it is missing. vramledger is found as `import vramledger` (PYTHONPATH=the staged
package of tests/torch/run_on_gpu.sh --stage-only). The whole run keeps within --budget-s (180 s
by default: each worker gets an equal share of what is left).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30


def tms_module():
    """(module, why-not): torch_memory_saver's singleton if importable."""
    try:
        import torch_memory_saver as package
    except Exception as error:  # ImportError, or a missing library it links
        return None, f"torch_memory_saver is not importable ({error}); pip install " \
                     "torch_memory_saver==0.0.10 to compare"
    version = getattr(package, "__version__", "unknown version")
    saver = getattr(package, "torch_memory_saver", None)
    if saver is None:
        return None, f"torch_memory_saver {version} has no torch_memory_saver object"
    return saver, f"torch_memory_saver {version} importable"


# Variant -> (allocator, environment for its worker, where its host memory is pinned).
VARIANTS = {
    "vramledger": ("vramledger", {"VRAMLEDGER_SLEEP_PIN": "host_alloc"},
                   "round 1 sleep (cudaHostAlloc)"),
    "vramledger-register": ("vramledger", {"VRAMLEDGER_SLEEP_PIN": "register"},
                            "round 1 sleep (register)"),
    "vramledger-prepared": ("vramledger", {"VRAMLEDGER_SLEEP_PIN": "host_alloc"},
                            "start-up (prepare_offload)"),
    "tms-torch": ("tms", {}, "its own (each pause)"),
    "tms-preload": ("tms", {}, "its own (each pause)"),
}


def worker(args) -> dict:
    sys.path.insert(0, HERE)
    import contextlib

    import torch

    allocator, _, pinned = VARIANTS[args.worker]
    result = {"allocator": args.worker, "pinned": pinned, "rounds": []}
    prepare = None
    if allocator == "vramledger":
        import vramledger

        vramledger.install("sleepable_graph_pools:true")  # so that "graphs" can sleep
        regions = (lambda: vramledger.tag("weights"), lambda: vramledger.tag("kv_cache"))
        # "graphs": the captured graph's private pool sleeps too (torch_memory_saver keeps it).
        sleep = lambda: vramledger.sleep(  # noqa: E731
            tags=["weights", "kv_cache", "graphs"], offload=["weights"])
        wake = vramledger.wake
        if args.worker == "vramledger-prepared":
            prepare = lambda: vramledger.prepare_offload(["weights"])  # noqa: E731
    else:
        saver, why = tms_module()
        result["module"] = why
        if saver is None:
            result["error"] = why
            return result
        # Its hook_mode is a setter only (the getter raises), so hasattr() cannot test for it.
        saver.hook_mode = "preload" if args.worker == "tms-preload" else "torch"

        def region(tag, backup):
            try:
                return saver.region(tag=tag, enable_cpu_backup=backup)
            except TypeError:  # an older signature
                return saver.region(tag=tag)

        regions = (lambda: region("weights", True), lambda: region("kv_cache", False))
        sleep, wake = saver.pause, saver.resume
    import sleep_workload as w

    device = torch.cuda.current_device()
    memory = w.ProcessMemory(device)
    start = time.perf_counter()
    state = w.build(int(args.weights_gib * GIB), int(args.kv_gib * GIB), *regions)
    result.update(build_s=time.perf_counter() - start, layers=state["layers"],
                  basis=memory.basis, device=torch.cuda.get_device_name(device),
                  torch=torch.__version__)
    if prepare is not None:
        kept = {}
        result["prepare_s"] = w.timed(lambda: kept.setdefault("bytes", prepare()))
        result["prepared_bytes"] = kept["bytes"]
    for _ in range(args.rounds):
        if time.perf_counter() - start > args.worker_budget_s:
            result["stopped"] = "out of budget"
            break
        before = memory.used()
        answer = {}
        sleep_s = w.timed(lambda: answer.setdefault("sleep", sleep()))
        asleep = memory.used()
        wake_s = w.timed(lambda: answer.setdefault("wake", wake()))
        awake = memory.used()
        checks = w.check_after_wake(state)
        figures = dict(sleep_s=sleep_s, wake_s=wake_s, before=before, asleep=asleep, awake=awake,
                       released=before - asleep, **checks)
        reported = answer.get("sleep")
        if reported is not None and hasattr(reported, "released_bytes"):
            figures.update(reported_released=reported.released_bytes,
                           resident=reported.resident_bytes, offloaded=reported.offloaded_bytes)
        result["rounds"].append(figures)
        with contextlib.suppress(Exception):
            if allocator == "vramledger":
                result["report_consistent"] = "inconsistent" not in vramledger.report()
    return result


def run_worker(name: str, args, budget_s: float) -> dict:
    if name not in VARIANTS:
        return {"allocator": name, "error": f"unknown variant (one of {', '.join(VARIANTS)})"}
    command = [sys.executable, os.path.abspath(__file__), "--worker", name,
               "--weights-gib", str(args.weights_gib), "--kv-gib", str(args.kv_gib),
               "--rounds", str(args.rounds), "--worker-budget-s", str(max(5.0, budget_s - 10))]
    env = dict(os.environ)
    env.update(VARIANTS[name][1])
    if name == "tms-preload":
        saver, why = tms_module()
        if saver is None:
            return {"allocator": name, "error": why}
        # Its own utility names the library built for this torch's CUDA (…_cu13.abi3.so).
        from torch_memory_saver import configure_subprocess

        with configure_subprocess():
            env["LD_PRELOAD"] = os.environ["LD_PRELOAD"]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=max(10.0, budget_s))
    except subprocess.TimeoutExpired:
        return {"allocator": name, "error": f"timed out after {budget_s:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"allocator": name, "error": f"exit {done.returncode}: {done.stderr.strip()[-800:]}"}


def table(results) -> str:
    lines = ["| allocator | round | released (NVML) | sleep | wake | weights intact | graph identical "
             "| kv usable | host memory pinned |",
             "|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        if "error" in result:
            lines.append(f"| {result['allocator']} | - | {result['error']} | | | | | | |")
            continue
        pinned = result.get("pinned", "")
        if "prepare_s" in result:
            pinned += f": {result['prepare_s']:.3f} s for {result['prepared_bytes'] / GIB:.2f} GiB"
        for i, r in enumerate(result["rounds"]):
            where = pinned if i == 0 else "kept, none pinned" if "vramledger" in result[
                "allocator"] else pinned
            lines.append(f"| {result['allocator']} | {i + 1} | {r['released'] / GIB:.2f} GiB | "
                         f"{r['sleep_s']:.3f} s | {r['wake_s']:.3f} s | {r['weights_intact']} | "
                         f"{r['graph_identical']} | {r['kv_usable']} | {where} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights-gib", type=float, default=8.0)
    parser.add_argument("--kv-gib", type=float, default=16.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--which", default=",".join(VARIANTS))
    parser.add_argument("--budget-s", type=float, default=180.0)
    parser.add_argument("--json-out")
    parser.add_argument("--check-tms-only", action="store_true",
                        help="only say whether torch_memory_saver is importable")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-budget-s", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.check_tms_only:
        print(tms_module()[1])
        return 0
    if args.worker:
        try:
            print(json.dumps(worker(args)))
        except Exception as error:  # reported in the table, not a traceback in a subprocess
            print(json.dumps({"allocator": args.worker, "error": f"{type(error).__name__}: {error}"}))
        return 0
    start = time.perf_counter()
    names = [name.strip() for name in args.which.split(",") if name.strip()]
    results = []
    for i, name in enumerate(names):
        left = args.budget_s - (time.perf_counter() - start) - 2
        results.append(run_worker(name, args, left / (len(names) - i)))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                            text=True).stdout.strip()
    device = next((r.get("device") for r in results if r.get("device")), "unknown device")
    torch_version = next((r.get("torch") for r in results if r.get("torch")), "?")
    basis = next((r.get("basis") for r in results if r.get("basis")), "?")
    print(f"# sleep/wake: {args.weights_gib:g} GiB weights (offloaded) + {args.kv_gib:g} GiB KV "
          f"cache (discarded), {args.rounds} rounds")
    print(f"{time.strftime('%Y-%m-%d', time.gmtime())}, commit {commit}, {device}, torch "
          f"{torch_version}; memory: {basis}; total {time.perf_counter() - start:.0f} s\n")
    print(table(results))
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump({"commit": commit, "args": vars(args), "results": results}, out, indent=1)
    failed = [r for r in results if r["allocator"].startswith("vramledger") and
              ("error" in r or not all(x["weights_intact"] and x["graph_identical"]
                                       for x in r["rounds"]))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

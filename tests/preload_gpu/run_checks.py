#!/usr/bin/env python3
"""The H200 checks of the LD_PRELOAD shim (docs/preload.md, "H200 checks"), in one command.

    python run_checks.py --shim BUILD/preload/libvramledger_preload.so
        --plugin STAGE/vramledger/libvramledger_torch.so --raw-lib libraw_alloc.so
        --static-bin static_cudart [--out DIR] [--budget SECONDS]

(PYTHONPATH must reach the staged vramledger package: tests/torch/stage_package.py.)

Runs, each in a subprocess with a time limit:
  - mixed_workload.py in five set-ups, in parallel:
      preload+install   LD_PRELOAD shim, VRAMLEDGER_PRELOAD_INSTALL_TORCH=1   (checks 1, 2, 5)
      run+shim          vramledger run --track-non-torch                      (checks 1, 2)
      run               vramledger run --no-track-non-torch                   (check 3)
      native+shim       LD_PRELOAD shim, torch's own allocator                 (checks 1, 2, 3)
      native            neither                                                (check 3)
      preload+route     as preload+install, plus VRAMLEDGER_PRELOAD_ROUTE=1    (checks 1, 2, 3, 7)
    with NCCL world size 2 in the two shim+vramledger set-ups when 2 GPUs are present;
  - check 3: identical outputs in all five, identical torch figures with and without the shim
    (run+shim = run = preload+install; native+shim = native);
  - check 4: static_cudart (nvcc -cudart static) with the shim (allocations seen) and without;
  - check 6: ns per cudaMalloc+cudaFree and cuMemAlloc+cuMemFree of 1 MiB with and without the
    shim (medians of batches), and a check that every call of the run with the shim was seen;
  - check 7 (routing mode): the raw allocations are served by the routed cache and reconcile
    (preload+route), static cudart routed, and the same pairs timed with routing on;
  - check 8 (routing mode, alone on the GPU): memory idle in the routed cache serves torch, and
    memory idle in torch's cache serves a routed cudaMalloc (route_pressure.py).

Prints a table of checks, writes DIR/results.json and DIR/summary.md with --out, and ends with
one line "preload_gpu: N passed, N failed, N skipped; ...". Exit status 1 on any failure; 0 with
"skipped: no GPU" when no GPU is present.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "mixed_workload.py")
MiB = 1 << 20


class Report:
    def __init__(self):
        self.checks = []  # {check, name, ok (True/False/None = skipped), detail}

    def add(self, check: str, name: str, ok, detail: str = "") -> None:
        self.checks.append({"check": check, "name": name, "ok": ok, "detail": detail})
        verdict = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        print(f"[{verdict}] {check} {name}: {detail}", flush=True)

    def counts(self) -> "tuple[int, int, int]":
        passed = sum(1 for c in self.checks if c["ok"] is True)
        failed = sum(1 for c in self.checks if c["ok"] is False)
        return passed, failed, len(self.checks) - passed - failed


def run(command, env, timeout: float, log_path: str | None) -> dict:
    """Runs command; returns {status, seconds, stdout, stderr, result (parsed RESULT json)}."""
    started = time.monotonic()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True,
                              timeout=max(timeout, 1), stdin=subprocess.DEVNULL)
        status, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        status = "timeout"
        stdout = expired.stdout.decode(errors="replace") if isinstance(expired.stdout, bytes) \
            else (expired.stdout or "")
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) \
            else (expired.stderr or "")
    except OSError as error:
        status, stdout, stderr = "cannot start", "", str(error)
    seconds = round(time.monotonic() - started, 2)
    results = [line[len("RESULT "):] for line in stdout.splitlines() if line.startswith("RESULT ")]
    result = None
    if results:
        try:
            result = json.loads(results[-1])
        except json.JSONDecodeError as error:
            result = {"ok": False, "error": f"unparsable RESULT line: {error}"}
    if log_path:
        with open(log_path, "w") as log:
            log.write(f"$ {' '.join(command)}\n# status {status} after {seconds}s\n")
            log.write("--- stdout (tail)\n" + "\n".join(stdout.splitlines()[-150:]) + "\n")
            log.write("--- stderr (tail)\n" + "\n".join(stderr.splitlines()[-150:]) + "\n")
    return {"status": status, "seconds": seconds, "stdout": stdout, "stderr": stderr,
            "result": result}


def gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (subprocess.TimeoutExpired, OSError):
        return 0
    count = sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


# --- overhead child: runs in its own process, with or without the shim ----------------------

def overhead_child(raw_lib: str, batches: int, per_batch: int) -> int:
    raw = ctypes.CDLL(raw_lib)
    status = raw.raw_init(0)
    if status != 0:
        print(f"RESULT {json.dumps({'ok': False, 'error': f'raw_init failed: {status}'})}")
        return 1
    try:
        stats_fn = ctypes.CDLL(None).vramledger_preload_get_stats
    except AttributeError:
        stats_fn = None
    sys.path.insert(0, HERE)
    from mixed_workload import ShimStats, USER  # the C struct's mirror
    stats = ShimStats()

    def user_allocations():
        if stats_fn is None:
            return None
        stats_fn(ctypes.byref(stats))
        return stats.categories[USER].allocations

    out = {"ok": True, "shim": stats_fn is not None, "bytes": MiB, "batches": batches,
           "per_batch": per_batch}
    batch_ns = (ctypes.c_double * batches)()
    for kind, name in ((0, "cudaMalloc+cudaFree"), (1, "cuMemAlloc+cuMemFree")):
        raw.raw_bench(kind, ctypes.c_size_t(MiB), 1, per_batch, batch_ns)  # warm-up
        before = user_allocations()
        status = raw.raw_bench(kind, ctypes.c_size_t(MiB), batches, per_batch, batch_ns)
        after = user_allocations()
        if status != 0:
            out["ok"] = False
            out["error"] = f"raw_bench({name}) failed: {status}"
            break
        values = list(batch_ns)
        out[name] = {"median_ns": round(statistics.median(values), 1),
                     "min_ns": round(min(values), 1), "max_ns": round(max(values), 1),
                     "seen_allocations": None if before is None else after - before,
                     "calls": batches * per_batch}
    print("RESULT " + json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


# --- the checks -------------------------------------------------------------------------------

MODES = {
    # name: (expect_allocator, expect_shim, expect_torch_install, how)
    "preload+install": ("vramledger", "yes", "yes", "preload_install"),
    "run+shim": ("vramledger", "yes", "no", "run_track"),
    "run": ("vramledger", "no", "no", "run_no_track"),
    "native+shim": ("native", "yes", "no", "preload"),
    "native": ("native", "no", "no", "plain"),
    "preload+route": ("vramledger", "yes", "yes", "preload_route"),
}


def base_env(args, scratch: str, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "VRAMLEDGER_PRELOAD_INSTALL_TORCH", "VRAMLEDGER_AUTOINSTALL",
                        "VRAMLEDGER_TORCH_PLUGIN", "VRAMLEDGER_PRELOAD_LIBRARY")}
    env["PYTHONUNBUFFERED"] = "1"
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # cuBLAS bitwise reproducible across the runs
    # One conf for every vramledger set-up, so their torch figures are comparable.
    env["VRAMLEDGER_CONF"] = args.conf
    # Triton's compiled launchers must sit under a path the shim classifies as triton.
    env["TRITON_CACHE_DIR"] = os.path.join(scratch, mode.replace("+", "_"), "triton", "cache")
    # Keep multi-GPU machines' NVLink multicast off (as tests/torch/run_on_gpu.sh does).
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    return env


def workload_command(args, mode: str, ranks: int, env: dict) -> list:
    allocator, shim, install, how = MODES[mode]
    workload = [args.python, WORKLOAD, "--raw-lib", args.raw_lib, "--expect-allocator", allocator,
                "--expect-shim", shim, "--expect-torch-install", install,
                "--nccl-ranks", str(ranks if shim == "yes" and allocator == "vramledger" else 1),
                "--child-timeout", str(args.child_timeout)]
    if how == "preload_route":
        env["VRAMLEDGER_PRELOAD_ROUTE"] = "1"
        workload += ["--expect-route", "yes"]
    if how in ("preload_install", "preload", "preload_route"):
        env["LD_PRELOAD"] = args.shim
    if how in ("preload_install", "preload_route"):
        env["VRAMLEDGER_PRELOAD_INSTALL_TORCH"] = "1"
        env["VRAMLEDGER_TORCH_PLUGIN"] = args.plugin
    if how in ("run_track", "run_no_track"):
        env["VRAMLEDGER_PRELOAD_LIBRARY"] = args.shim
        flag = "--track-non-torch" if how == "run_track" else "--no-track-non-torch"
        return [args.python, "-m", "vramledger", "run", flag, "--"] + workload
    return workload


def check_workloads(args, report: Report, scratch: str, ranks: int, deadline: float) -> dict:
    timeout = min(args.workload_timeout, deadline - time.monotonic() - 45)
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(MODES)) as pool:
        for mode in MODES:
            env = base_env(args, scratch, mode)
            command = workload_command(args, mode, ranks, env)
            log = os.path.join(args.out, f"workload-{mode.replace('+', '_')}.log") if args.out else None
            jobs[mode] = pool.submit(run, command, env, timeout, log)
    runs = {mode: job.result() for mode, job in jobs.items()}
    for mode, outcome in runs.items():
        result = outcome["result"] or {}
        failed = [c for c in result.get("checks", []) if not c["ok"]]
        checks_label = {"preload+install": "1,2,5", "run+shim": "1,2", "native+shim": "1,2",
                        "preload+route": "1,2,7"}.get(mode, "3")
        detail = (f"exit {outcome['status']} in {outcome['seconds']}s; "
                  f"{len(result.get('checks', []))} checks, "
                  + (f"failed: {'; '.join(c['name'] + ': ' + c['detail'] for c in failed)}"
                     if failed else "none failed"))
        if not outcome["result"]:
            detail += f"; no RESULT line; stderr tail: {outcome['stderr'][-600:]!r}"
        if result.get("notes"):
            detail += f"; notes: {'; '.join(result['notes'])}"
        report.add(f"check {checks_label}", f"workload {mode}",
                   outcome["status"] == 0 and bool(result.get("ok")), detail)
    # Check 5: the shim says it installed the allocator.
    install_log = runs["preload+install"]["stderr"]
    report.add("check 5", "shim log: torch allocator installed",
               "vramledger-preload: torch allocator installed" in install_log,
               next((line for line in install_log.splitlines()
                     if "vramledger-preload: torch allocator" in line), "no such log line"))
    # Check 3: outputs and torch figures.
    digests = {mode: (r["result"] or {}).get("outputs_sha256") for mode, r in runs.items()}
    report.add("check 3", f"identical outputs in all {len(MODES)} set-ups",
               None not in digests.values() and len(set(digests.values())) == 1,
               ", ".join(f"{m}: {(d or 'none')[:12]}" for m, d in digests.items()))
    figures = {mode: (r["result"] or {}).get("torch_figures") for mode, r in runs.items()}
    for a, b in (("run+shim", "run"), ("preload+install", "run"), ("native+shim", "native"),
                 ("preload+route", "run")):
        report.add("check 3", f"identical torch figures: {a} vs {b}",
                   figures[a] is not None and figures[a] == figures[b],
                   f"{figures[a]} vs {figures[b]}")
    return {mode: {"status": r["status"], "seconds": r["seconds"], "result": r["result"]}
            for mode, r in runs.items()}


def check_static(args, report: Report, deadline: float) -> dict:
    out = {}
    for with_shim, routed in ((True, False), (False, False), (True, True)):
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        command = [args.static_bin]
        if with_shim:
            env["LD_PRELOAD"] = args.shim
            command.append("--expect-shim")
        if routed:
            env["VRAMLEDGER_PRELOAD_ROUTE"] = "1"
        label = "with shim, routed" if routed else ("with shim" if with_shim else "without shim")
        log = (os.path.join(args.out, f"static_cudart-{label.replace(',', '').replace(' ', '_')}.log")
               if args.out else None)
        outcome = run(command, env, min(60, deadline - time.monotonic() - 5), log)
        result = outcome["result"] or {}
        ok = outcome["status"] == 0 and result.get("ok") is True
        if routed:
            ok = ok and result.get("route_state") == 1 and result.get("routed_allocations") == 3
        if with_shim:
            ok = ok and result.get("shim") is True
            detail = (f"seen {result.get('seen_bytes')} of {result.get('expected_bytes')} B in "
                      f"{result.get('seen_allocations')} allocations, {result.get('seen_frees')} "
                      f"frees; {result.get('failures') or ''}")
            if routed:
                detail += (f"; routing state {result.get('route_state')}, "
                           f"{result.get('routed_allocations')} of 3 cudaMalloc calls routed")
        else:
            detail = "runs without the shim"
        if not outcome["result"]:
            detail += f"; exit {outcome['status']}, no RESULT; stderr: {outcome['stderr'][-400:]!r}"
        report.add("check 7" if routed else "check 4", f"static cudart {label}", ok, detail)
        out[label] = {"status": outcome["status"], "result": outcome["result"]}
    return out


def check_pressure(args, report: Report, deadline: float) -> dict:
    env = base_env(args, tempfile.gettempdir(), "pressure")
    env.update(LD_PRELOAD=args.shim, VRAMLEDGER_PRELOAD_ROUTE="1",
               VRAMLEDGER_PRELOAD_INSTALL_TORCH="1", VRAMLEDGER_TORCH_PLUGIN=args.plugin)
    command = [args.python, os.path.join(HERE, "route_pressure.py"), "--raw-lib", args.raw_lib]
    log = os.path.join(args.out, "route_pressure.log") if args.out else None
    outcome = run(command, env, min(90, deadline - time.monotonic() - 5), log)
    result = outcome["result"] or {}
    failed = [c for c in result.get("checks", []) if not c["ok"]]
    detail = (f"exit {outcome['status']}; {len(result.get('checks', []))} checks, "
              + (f"failed: {'; '.join(c['name'] + ': ' + c['detail'] for c in failed)}"
                 if failed else "none failed")
              + f"; X = {result.get('figures', {}).get('x_bytes')} B")
    if not outcome["result"]:
        detail += f"; no RESULT; stderr: {outcome['stderr'][-500:]!r}"
    report.add("check 8", "idle memory moves between the routed and torch caches",
               outcome["status"] == 0 and result.get("ok") is True, detail)
    return {"status": outcome["status"], "result": outcome["result"]}


def check_overhead(args, report: Report, deadline: float) -> dict:
    out = {}
    for with_shim, routed in ((False, False), (True, False), (True, True)):
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "VRAMLEDGER_PRELOAD_INSTALL_TORCH")}
        env["VRAMLEDGER_PRELOAD_LOG"] = "0"
        if with_shim:
            env["LD_PRELOAD"] = args.shim
        if routed:
            env["VRAMLEDGER_PRELOAD_ROUTE"] = "1"
        command = [args.python, os.path.abspath(__file__), "--overhead-child", args.raw_lib,
                   "--overhead-batches", str(args.overhead_batches),
                   "--overhead-per-batch", str(args.overhead_per_batch)]
        label = "routed" if routed else ("with shim" if with_shim else "without shim")
        log = os.path.join(args.out, f"overhead-{label.replace(' ', '_')}.log") if args.out else None
        outcome = run(command, env, min(90, deadline - time.monotonic() - 5), log)
        out[label] = outcome["result"] or {"ok": False, "error": f"exit {outcome['status']}: "
                                           f"{outcome['stderr'][-400:]}"}
    rows = []
    ok = all(out[l].get("ok") for l in out)
    for name in ("cudaMalloc+cudaFree", "cuMemAlloc+cuMemFree"):
        without, with_ = out["without shim"].get(name), out["with shim"].get(name)
        if not without or not with_:
            ok = False
            continue
        seen_all = with_["seen_allocations"] == with_["calls"]
        ok = ok and seen_all
        rows.append(f"{name} 1 MiB: {without['median_ns']:.0f} ns without, "
                    f"{with_['median_ns']:.0f} ns with (+{with_['median_ns'] - without['median_ns']:.0f}"
                    f" ns); calls seen {with_['seen_allocations']}/{with_['calls']}")
    report.add("check 6", "overhead per intercepted pair (medians)", ok,
               "; ".join(rows) or str(out))
    routed_rows = []
    routed_ok = bool(out["routed"].get("ok"))
    for name in ("cudaMalloc+cudaFree", "cuMemAlloc+cuMemFree"):
        without, routed = out["without shim"].get(name), out["routed"].get(name)
        if not without or not routed:
            routed_ok = False
            continue
        routed_ok = routed_ok and routed["seen_allocations"] == routed["calls"]
        routed_rows.append(f"{name} 1 MiB routed: {routed['median_ns']:.0f} ns "
                           f"({without['median_ns'] / max(routed['median_ns'], 1):.1f}x faster than "
                           f"the driver's {without['median_ns']:.0f} ns); calls seen "
                           f"{routed['seen_allocations']}/{routed['calls']}")
    report.add("check 7", "routed pair time (medians)", routed_ok, "; ".join(routed_rows) or str(out))
    rows.extend(routed_rows)
    out["rows"] = rows
    return out


def write_outputs(args, report: Report, results: dict) -> None:
    passed, failed, skipped = report.counts()
    results["checks"] = report.checks
    results["counts"] = {"passed": passed, "failed": failed, "skipped": skipped}
    if not args.out:
        return
    with open(os.path.join(args.out, "results.json"), "w") as handle:
        json.dump(results, handle, indent=1, default=str)
    lines = ["# LD_PRELOAD shim on the GPU (tests/preload_gpu)", "",
             f"GPUs: {results.get('gpus')}; conf: `{args.conf}`; "
             f"{passed} passed, {failed} failed, {skipped} skipped", "",
             "| check | what | result | figures |", "|---|---|---|---|"]
    for c in report.checks:
        verdict = "skipped" if c["ok"] is None else ("pass" if c["ok"] else "**FAIL**")
        detail = c["detail"].replace("|", "/").replace("\n", " ")
        lines.append(f"| {c['check']} | {c['name']} | {verdict} | {detail[:700]} |")
    with open(os.path.join(args.out, "summary.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shim", help="libvramledger_preload.so")
    parser.add_argument("--plugin", help="libvramledger_torch.so of the staged package")
    parser.add_argument("--raw-lib", help="libraw_alloc.so built from raw_alloc.c")
    parser.add_argument("--static-bin", help="static_cudart built with nvcc -cudart static")
    parser.add_argument("--out", help="folder for results.json, summary.md and logs")
    parser.add_argument("--budget", type=float, default=170, help="seconds for everything")
    parser.add_argument("--workload-timeout", type=float, default=140)
    parser.add_argument("--child-timeout", type=int, default=75)
    parser.add_argument("--conf", default="backend:vmm", help="VRAMLEDGER_CONF of every set-up")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--overhead-batches", type=int, default=21)
    parser.add_argument("--overhead-per-batch", type=int, default=300)
    parser.add_argument("--overhead-child", metavar="RAW_LIB", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.overhead_child:
        return overhead_child(args.overhead_child, args.overhead_batches, args.overhead_per_batch)

    deadline = time.monotonic() + args.budget
    report = Report()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    gpus = gpu_count()
    results = {"gpus": gpus, "conf": args.conf}
    if gpus == 0:
        print("skipped: no GPU (nvidia-smi lists none)")
        report.add("all", "preload GPU checks", None, "skipped: no GPU")
        write_outputs(args, report, results)
        print("preload_gpu: 0 passed, 0 failed, 1 skipped (skipped: no GPU)")
        return 0
    missing = [f"--{name.replace('_', '-')} {getattr(args, name)}"
               for name in ("shim", "plugin", "raw_lib", "static_bin")
               if not getattr(args, name) or not os.path.exists(getattr(args, name))]
    if missing:
        report.add("setup", "inputs present", False, "missing: " + ", ".join(missing))
        write_outputs(args, report, results)
        print(f"preload_gpu: 0 passed, 1 failed, 0 skipped (missing inputs: {', '.join(missing)})")
        return 1
    args.shim, args.plugin, args.raw_lib, args.static_bin = (
        os.path.abspath(p) for p in (args.shim, args.plugin, args.raw_lib, args.static_bin))

    with tempfile.TemporaryDirectory(prefix="preload_gpu-") as scratch:
        results["workloads"] = check_workloads(args, report, scratch, min(gpus, 2), deadline)
    results["route_pressure"] = check_pressure(args, report, deadline)
    results["static_cudart"] = check_static(args, report, deadline)
    results["overhead"] = check_overhead(args, report, deadline)
    write_outputs(args, report, results)

    passed, failed, skipped = report.counts()
    print("\n| result | check | what |\n|---|---|---|")
    for c in report.checks:
        print(f"| {'skip' if c['ok'] is None else ('pass' if c['ok'] else 'FAIL')} | {c['check']} | {c['name']} |")
    overhead = "; ".join(results["overhead"].get("rows", [])) or "overhead not measured"
    print(f"preload_gpu: {passed} passed, {failed} failed, {skipped} skipped; {overhead}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

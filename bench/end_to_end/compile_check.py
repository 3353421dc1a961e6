#!/usr/bin/env python3
"""Does torch.compile(mode="reduce-overhead") work with vramledger as torch's allocator?

    python3 bench/end_to_end/compile_check.py --out DIR [--time-limit-s 85] [--parallel N]

mode="reduce-overhead" runs compiled code under CUDA graph trees, which record every graph into
a private memory pool and, after each recording, ask the allocator for a checkpoint of that
pool's state (getCheckpointState) to restore before recording on a new path
(setCheckpointPoolState). The plugin implements both (torch_plugin/vramledger_allocator.cpp); a
"refused" result means an old plugin is installed.
Three cases, each in a fresh process under the native allocator and under vramledger
(backend:vmm), outputs compared bitwise with native's and approximately with eager mode:

  inference_fixed  an MLP's inference at one fixed shape, called 6 times
  train_step       forward + backward compiled (optimizer eager), 6 training steps
  two_shapes       inference at 64 then 128 then 64 rows (dynamic=False): CUDA graph trees
                   record a second graph and switch between them

Prints a table of which cases work and the exact error of those that fail; writes
compile_check.json and compile_check.md to --out, logs to --out/logs. The last line printed
starts with "SUMMARY ". Exit status: 0 when native and vramledger run every case and
vramledger's outputs match native's bitwise; 1 for anything else (native failing, a refusal, a
crash, a timeout, another error, different outputs); 77 without a GPU; 124 when stopped.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import e2e_common as common  # noqa: E402

CASES = {
    "inference_fixed": "MLP inference, fixed shape 64x256, reduce-overhead, 6 calls",
    "train_step": "MLP forward+backward compiled with reduce-overhead, SGD eager, 6 steps",
    "two_shapes": "MLP inference at 64/128/64/128 rows, dynamic=False: a second CUDA graph",
}
ALLOCATOR_CONFS = {"native": None, "vramledger": "backend:vmm"}
# The plugin's deliberate refusals (torch_plugin/vramledger_allocator.cpp); any other error is
# unexpected.
KNOWN_REFUSALS = ("does not support checkpointing", "does not support restoring")
EAGER_TOLERANCE = 1e-3   # compiled vs eager, max |difference| relative to max |eager output|


# --------------------------------------------------------------------------------------------
# Child side


def digest(tensor) -> str:
    """Exact fingerprint of a tensor's values (and shape); copies to the host at once, before a
    later CUDA graph replay can overwrite the output."""
    values = tensor.detach().float().cpu().flatten().tolist()
    text = "x".join(map(str, tensor.shape)) + ":" + ",".join(v.hex() for v in values)
    return hashlib.sha256(text.encode()).hexdigest()


def relative_difference(torch, compiled_out, eager_out) -> float:
    scale = eager_out.detach().abs().max().item() or 1.0
    return (compiled_out.detach().float() - eager_out.detach().float()).abs().max().item() / scale


def make_mlp(torch):
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                               torch.nn.Linear(1024, 1024), torch.nn.GELU(),
                               torch.nn.Linear(1024, 256))


def run_inference(torch, model, eager, row_counts: Sequence[int], dynamic: Optional[bool]):
    compiled = torch.compile(model.eval(), mode="reduce-overhead", dynamic=dynamic)
    eager.eval()
    gen = torch.Generator(device="cuda").manual_seed(1)
    outputs, worst = [], 0.0
    with torch.no_grad():
        for rows in row_counts:
            x = torch.randn(rows, 256, device="cuda", generator=gen)
            torch.compiler.cudagraph_mark_step_begin()
            y = compiled(x)
            outputs.append(digest(y))
            worst = max(worst, relative_difference(torch, y, eager(x)))
    return outputs, worst


def case_inference_fixed(torch, model, eager):
    return run_inference(torch, model, eager, [64] * 6, dynamic=None)


def case_two_shapes(torch, model, eager):
    return run_inference(torch, model, eager, [64, 64, 64, 128, 128, 128, 64, 64, 128, 128],
                         dynamic=False)


def case_train_step(torch, model, eager):
    compiled = torch.compile(model.train(), mode="reduce-overhead")
    eager.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.01)
    gen = torch.Generator(device="cuda").manual_seed(1)
    losses, worst = [], 0.0
    for _ in range(6):
        x = torch.randn(64, 256, device="cuda", generator=gen)
        y = torch.randn(64, 256, device="cuda", generator=gen)
        torch.compiler.cudagraph_mark_step_begin()
        loss = ((compiled(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        eager_loss = ((eager(x) - y) ** 2).mean()
        eager_loss.backward()
        eager_opt.step()
        eager_opt.zero_grad(set_to_none=True)
        losses.append(loss.item().hex())
        worst = max(worst, relative_difference(torch, loss, eager_loss))
    return losses, worst


CASE_FUNCTIONS = {"inference_fixed": case_inference_fixed, "train_step": case_train_step,
                  "two_shapes": case_two_shapes}


def cudagraph_facts(torch) -> Dict[str, Any]:
    """What CUDA graph trees did (private torch APIs: absent figures are None, not errors)."""
    facts: Dict[str, Any] = {"graphs_recorded": None, "checkpoints_applied": None,
                             "cudagraph_skips": None}
    try:
        from torch._dynamo.utils import counters

        facts["cudagraph_skips"] = int(counters["inductor"]["cudagraph_skips"])
    except Exception:  # noqa: BLE001
        pass
    try:
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_manager(torch.cuda.current_device(),
                                              create_if_none_exists=False)
        if manager is not None:
            nodes, stack = 0, [n for roots in manager.roots.values() for n in roots]
            while stack:
                node = stack.pop()
                nodes += 1
                stack.extend(child for children in node.children.values() for child in children)
            facts["graphs_recorded"] = nodes
            facts["checkpoints_applied"] = manager.debug_checkpointing_counter
    except Exception:  # noqa: BLE001
        pass
    return facts


def child_main(case: str, allocator: str, result_file: Path) -> int:
    common.die_with_parent()
    result: Dict[str, Any] = {"case": case, "allocator": allocator, "status": "error"}
    started = time.perf_counter()
    torch = None
    try:
        import torch

        if not torch.cuda.is_available():  # allocates nothing: install() may still follow
            result.update(status="no_gpu", error="torch.cuda.is_available() is False")
            common.write_json_atomic(result_file, result)
            return common.EXIT_NO_GPU
        conf = ALLOCATOR_CONFS[allocator]
        if conf is not None:
            import vramledger

            vramledger.install(conf)
        torch.use_deterministic_algorithms(True, warn_only=True)
        result["backend"] = torch.cuda.memory.get_allocator_backend()
        result["torch_version"] = torch.__version__
        torch.manual_seed(0)
        model = make_mlp(torch).cuda()
        eager = copy.deepcopy(model)
        outputs, worst = CASE_FUNCTIONS[case](torch, model, eager)
        torch.cuda.synchronize()
        result.update(status="ok", outputs=outputs, eager_relative_difference=worst)
        exit_code = 0
    except Exception as error:  # noqa: BLE001 -- the error IS the finding: record it exactly
        result.update(error_type=type(error).__name__, error_message=str(error)[:4000],
                      traceback=traceback.format_exc()[-6000:])
        print(result["traceback"], file=sys.stderr, flush=True)
        exit_code = 1
    if torch is not None:
        result["cudagraph"] = cudagraph_facts(torch)
    result["seconds"] = time.perf_counter() - started
    common.write_json_atomic(result_file, result)
    return exit_code


# --------------------------------------------------------------------------------------------
# Parent side


def classify(run: Dict[str, Any]) -> str:
    """works / refused (the plugin's known refusal) / error / timeout / no_gpu / not_run."""
    if run["status"] != "ok":
        result = run.get("result", {})
        message = (result.get("error_message") or "") + (result.get("traceback") or "")
        if run["status"] == "failed" and any(k in message for k in KNOWN_REFUSALS):
            return "refused"
        return {"failed": "error"}.get(run["status"], run["status"])
    return "works"


def first_line(text: Optional[str]) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def finish_document(doc: Dict[str, Any]) -> None:
    runs = {(r["case"], r["allocator"]): r for r in doc["runs"]}
    rows, problems = [], []
    if doc.get("skipped"):
        doc.update(rows=[], problems=[], checkpointing_needed=None)
        return
    for case in doc["plan"]["cases"]:
        native, ours = runs.get((case, "native")), runs.get((case, "vramledger"))
        row: Dict[str, Any] = {"case": case,
                               "native": classify(native) if native else "not_run",
                               "vramledger": classify(ours) if ours else "not_run"}
        if row["native"] == "works" and row["vramledger"] == "works":
            row["identical"] = native["result"]["outputs"] == ours["result"]["outputs"]
        else:
            row["identical"] = None
        for name, run in (("native", native), ("vramledger", ours)):
            if run and run["status"] == "ok":
                if run["result"].get("eager_relative_difference", 0) > EAGER_TOLERANCE:
                    problems.append(f"{case}: {name}'s compiled output differs from eager by "
                                    f"{run['result']['eager_relative_difference']:.3g} (relative)")
            facts = (run or {}).get("result", {}).get("cudagraph") or {}
            row[f"{name}_graphs"] = facts.get("graphs_recorded")
            row[f"{name}_skips"] = facts.get("cudagraph_skips")
        if ours and ours["status"] != "ok":
            result = ours.get("result", {})
            row["vramledger_error"] = (
                f"{result.get('error_type')}: {result.get('error_message')}"
                if result.get("error_type") else ours.get("error", ""))
        if row["native"] != "works":
            native = native or {}
            why = first_line(native.get("result", {}).get("error_message")) or \
                native.get("error", "")
            problems.append(f"{case}: native {row['native']}: {why}")
        if row["vramledger"] != "works":
            problems.append(f"{case}: vramledger {row['vramledger']}: "
                            f"{first_line(row.get('vramledger_error'))}")
        if row["identical"] is False:
            problems.append(f"{case}: vramledger's outputs differ from native's")
        rows.append(row)
    doc["rows"] = rows
    doc["problems"] = problems
    doc["checkpointing_needed"] = any(r["vramledger"] == "refused" for r in rows)


def render_markdown(doc: Dict[str, Any]) -> str:
    env = doc["meta"].get("environment", {})
    lines = ["# torch.compile(mode=\"reduce-overhead\") under vramledger", "",
             f"Date {doc['meta'].get('date')}, commit {doc['meta'].get('commit') or 'unknown'}; "
             f"GPU {', '.join(env.get('gpus') or []) or 'unknown'}; torch {env.get('torch')}, "
             f"triton {env.get('triton')}. Every cell is a fresh process; vramledger is "
             f"{ALLOCATOR_CONFS['vramledger']}.", ""]
    if doc.get("skipped"):
        lines += [f"**SKIPPED**: {doc['skipped']}", ""]
    lines += ["| case | native | vramledger | outputs identical to native | CUDA graphs recorded "
              "(native / vramledger) | error under vramledger |", "|---|---|---|---|---|---|"]
    for row in doc.get("rows", []):
        identical = {True: "yes", False: "**no**", None: "n/a"}[row["identical"]]
        error = first_line(row.get("vramledger_error")).replace("|", "\\|")
        lines.append(f"| {row['case']} | {row['native']} | {row['vramledger']} | {identical} | "
                     f"{row.get('native_graphs')} / {row.get('vramledger_graphs')} | {error} |")
    lines += ["", "Cases:", ""] + [f"- `{c}`: {CASES[c]}" for c in doc["plan"]["cases"]]
    lines += ["", "Verdict: " + verdict(doc), ""]
    errors = [(r["case"], r["vramledger_error"]) for r in doc.get("rows", [])
              if r.get("vramledger_error")]
    if errors:
        lines += ["## Exact errors under vramledger", ""]
        for case, error in errors:
            lines += [f"`{case}`:", "", "```", error.strip(), "```", ""]
    if doc.get("problems"):
        lines += ["## Problems", ""] + [f"- {p}" for p in doc["problems"]] + [""]
    return "\n".join(lines)


def verdict(doc: Dict[str, Any]) -> str:
    rows = doc.get("rows", [])
    works = sum(r["vramledger"] == "works" for r in rows)
    native = sum(r["native"] == "works" for r in rows)
    text = (f"reduce-overhead under vramledger: {works}/{len(rows)} cases work "
            f"(native {native}/{len(rows)})")
    if doc.get("checkpointing_needed"):
        refused = [r["case"] for r in rows if r["vramledger"] == "refused"]
        text += ("; checkpointing (getCheckpointState/setCheckpointPoolState) NEEDED: refused in "
                 + ", ".join(refused))
    if doc.get("problems"):
        text += f"; {len(doc['problems'])} problem(s)"
    return text


def exit_status(doc: Dict[str, Any]) -> int:
    if doc.get("skipped"):
        return common.EXIT_NO_GPU
    if doc.get("interrupted"):
        return common.EXIT_INTERRUPTED
    return 1 if doc.get("problems") else 0


def child_command(args, case: str, allocator: str, result_file: Path) -> List[str]:
    return [args.python, str(Path(__file__).resolve()), "--child", case, "--allocator",
            allocator, "--result-file", str(result_file)]


def run_all(args, doc: Dict[str, Any], registry: common.ProcessRegistry, deadline: float,
            cache_dir: str) -> None:
    """Every (case, allocator) in its own process, `args.parallel` at a time."""
    out = Path(args.out)
    pending = [(case, allocator) for case in doc["plan"]["cases"] for allocator in ALLOCATOR_CONFS]
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending:
                    return
                case, allocator = pending.pop(0)
            key = f"{case}.{allocator}"
            run: Dict[str, Any] = {"case": case, "allocator": allocator, "status": "not_run"}
            left = deadline - time.monotonic()
            if registry.stopped:
                run["error"] = "stopped before this run started"
            elif left < 10:
                run["error"] = f"not started: only {left:.0f}s of the time limit left"
            else:
                result_file = out / "runs" / f"{key}.json"
                log_file = out / "logs" / f"{key}.log"
                result_file.unlink(missing_ok=True)
                timeout = min(args.run_timeout_s, left)
                # One compile thread: no worker pool to start for a handful of kernels; a cache
                # of our own, shared by these runs only.
                env = common.child_environment({"TORCHINDUCTOR_COMPILE_THREADS": "1",
                                                "TORCHINDUCTOR_CACHE_DIR": cache_dir})
                outcome = common.run_process(child_command(args, case, allocator, result_file),
                                             env, timeout, log_file, registry)
                result = common.read_json(result_file) or {}
                run.update(result=result, exit_code=outcome.exit_code,
                           wall_s=round(outcome.wall_s, 2), log=str(log_file.relative_to(out)))
                if outcome.timed_out:
                    run.update(status="timeout", error=f"timed out after {timeout:.0f}s")
                elif registry.stopped and result.get("status") != "ok":
                    run.update(status="interrupted", error="killed: the check was stopped")
                elif result.get("status") == "no_gpu" or outcome.exit_code == common.EXIT_NO_GPU:
                    run.update(status="no_gpu", error=result.get("error", "no GPU"))
                elif outcome.exit_code == 0 and result.get("status") == "ok":
                    run["status"] = "ok"
                else:
                    run["status"] = "failed"
                    if not result:
                        run["error"] = (f"exit {outcome.exit_code} without a result: "
                                        + common.log_tail(log_file, 8))
                print(f"  {key}: {run['status']} ({outcome.wall_s:.1f}s)"
                      + (f": {first_line(result.get('error_message') or run.get('error'))}"
                         if run["status"] != "ok" else ""), flush=True)
            with lock:
                doc["runs"].append(run)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.parallel)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.5)
    except common.Interrupted:
        registry.stop()
        end = time.monotonic() + 10
        for thread in threads:  # let the workers record their killed runs
            thread.join(max(end - time.monotonic(), 0))
        raise


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="compile-check-results")
    parser.add_argument("--time-limit-s", type=float, default=85)
    parser.add_argument("--run-timeout-s", type=float, default=75)
    parser.add_argument("--parallel", type=int, default=min(6, max(1, (os.cpu_count() or 2) // 2)),
                        help="processes at a time (compilation is CPU-bound; the GPU work tiny)")
    parser.add_argument("--only", help="comma-separated case names")
    parser.add_argument("--commit")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--allocator", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.child not in CASES or args.allocator not in ALLOCATOR_CONFS or not args.result_file:
            parser.error("--child needs a known case, --allocator and --result-file")
        return child_main(args.child, args.allocator, Path(args.result_file))
    cases = list(CASES)
    if args.only:
        cases = [c.strip() for c in args.only.split(",") if c.strip()]
        unknown = [c for c in cases if c not in CASES]
        if unknown:
            parser.error(f"--only: unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    if args.parallel < 1:
        parser.error("--parallel must be at least 1")

    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    registry = common.ProcessRegistry()
    common.install_signal_handlers(registry)
    started = time.monotonic()
    doc: Dict[str, Any] = {
        "schema": "vramledger-compile-check/1",
        "meta": {"date": common.utc_now(), "commit": args.commit or common.git_commit(REPO),
                 "time_limit_s": args.time_limit_s},
        "plan": {"cases": cases, "allocators": ALLOCATOR_CONFS,
                 "descriptions": {c: CASES[c] for c in cases}},
        "runs": [],
    }
    try:
        probe = common.probe_environment(args.python, registry,
                                         out / "logs" / "compile_check_probe.log",
                                         timeout_s=min(60, args.time_limit_s / 2))
        doc["meta"]["environment"] = probe
        reason = common.no_gpu_reason(probe)
        if reason:
            doc["skipped"] = reason
        else:
            with tempfile.TemporaryDirectory(prefix="vramledger-compile-check-") as cache_dir:
                run_all(args, doc, registry, started + args.time_limit_s, cache_dir)
    except common.Interrupted as stop:
        doc["interrupted"] = str(stop)
    doc["meta"]["total_wall_s"] = round(time.monotonic() - started, 1)
    finish_document(doc)
    if doc.get("interrupted"):
        doc["problems"].append(f"interrupted: {doc['interrupted']}")
    common.write_json_atomic(out / "compile_check.json", doc)
    text = render_markdown(doc)
    common.write_text_atomic(out / "compile_check.md", text)
    print(text)
    if doc.get("skipped"):
        print(f"SUMMARY skipped: {doc['skipped']}")
    else:
        print("SUMMARY " + verdict(doc))
    return exit_status(doc)


if __name__ == "__main__":
    sys.exit(main())

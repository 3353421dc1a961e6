#!/usr/bin/env python3
"""Runs the H200 checks of process classification and profiling (docs/classification.md,
"Checks still to run on the H200", checks 1-5), each as a subprocess with a time limit, and
writes what they found.

    PYTHONPATH=build-torch-gpu-stage python tests/classification_gpu/run_checks.py \\
        --out DIR [--budget SECONDS] [--only neighbour,instants,...]

Prints a pass/fail table with the key figures, writes DIR/results.json (every check's
CHECK_RESULT document), DIR/summary.md (the table and each check's figures) and
DIR/summary_line.txt (one line for scripts/gpu_suite.sh). Each check's own logs go to
DIR/<check>/. Exit status: 1 when any check failed or timed out, else 0 (a check that is
skipped for lack of a GPU, or not run for a stated reason, does not fail the run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _common  # noqa: E402

# (check, script, what it answers, limit in seconds, workers run one after the other): the
# headline first; the budget (--budget) cuts the later ones. Expected on the H200: ~10-15 s per
# worker (torch import, CUDA init, model), ~80 s in all.
CHECKS = (
    ("neighbour", "neighbour.py", "2: a neighbour moves vLLM's figure, not ours", 100, 3),
    ("instants", "instants.py", "1+3: exact sum at >= 20 instants; context size", 70, 2),
    ("ground_truth", "ground_truth.py", "4: weights / peak / non-torch vs the script", 35, 1),
    ("fallback", "fallback.py", "5: device-used fallback in a PID namespace", 40, 1),
)


def run_check(script: str, folder: str, limit: float, workers: int) -> Dict[str, Any]:
    """One check script; its CHECK_RESULT document, or a made-up one saying why there is none.
    Its workers share the limit, less a margin for the script itself (and fallback's probes)."""
    worker_limit = max(10.0, (limit - 8.0 - (10.0 if script == "fallback.py" else 0.0)) / workers)
    command = [sys.executable, os.path.join(HERE, script), "--out", folder,
               "--timeout", f"{worker_limit:.0f}"]
    started = time.monotonic()
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=limit,
                                   stdin=subprocess.DEVNULL)
        out, err, rc = completed.stdout, completed.stderr, completed.returncode
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode(errors="replace") if isinstance(expired.stdout, bytes) \
            else (expired.stdout or "")
        err = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) \
            else (expired.stderr or "")
        rc = None
    elapsed = time.monotonic() - started
    with open(os.path.join(folder, "check.log"), "w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(command)}\n# exit {rc}, {elapsed:.1f} s\n--- stdout\n{out}\n"
                  f"--- stderr\n{err[-20000:]}\n")
    document = None
    for line in out.splitlines():
        if line.startswith("CHECK_RESULT "):
            document = json.loads(line[len("CHECK_RESULT "):])
    if rc is None:
        document = {"status": "timeout", "figures": (document or {}).get("figures", {}),
                    "failures": [f"timed out after {limit:.0f} s"], "notes": []}
    elif document is None:
        tail = [line for line in err.strip().splitlines() if line.strip()][-1:] or ["no stderr"]
        document = {"status": "fail", "figures": {}, "notes": [],
                    "failures": [f"exit {rc} without a CHECK_RESULT line: {tail[0][:300]}"]}
    elif rc != 0 and document["status"] != "fail":
        document["failures"].append(f"exit {rc} although the check said {document['status']}")
        document["status"] = "fail"
    document["seconds"] = round(elapsed, 1)
    return document


def summary_markdown(results: Dict[str, Dict[str, Any]], answers: Dict[str, str]) -> str:
    lines = ["# Classification checks on the GPU (docs/classification.md, checks 1-5)", "",
             "| check | answers | status | seconds |", "|---|---|---|---|"]
    for name, document in results.items():
        lines.append(f"| {name} | {answers[name]} | {document['status']} | "
                     f"{document.get('seconds', '')} |")
    for name, document in results.items():
        lines += ["", f"## {name}: {document['status']}", ""]
        lines += [f"- {key}: {value}" for key, value in document.get("figures", {}).items()]
        lines += [f"- FAIL: {text}" for text in document.get("failures", [])]
        lines += [f"- note: {text}" for text in document.get("notes", [])[:20]]
    return "\n".join(lines) + "\n"


def summary_line(results: Dict[str, Dict[str, Any]]) -> str:
    counts = {status: sum(1 for d in results.values() if d["status"] == status)
              for status in ("pass", "fail", "timeout", "skip", "not_run")}
    line = (f"{counts['pass']} passed, {counts['fail'] + counts['timeout']} failed, "
            f"{counts['skip'] + counts['not_run']} skipped")
    parts = [f"{name} {document['status']}" for name, document in results.items()]
    figures = results.get("neighbour", {}).get("figures", {})
    key = [f"{k.split(':')[0]} vLLM {v.split('(')[-1].rstrip(')')}" for k, v in figures.items()
           if k.endswith("vLLM moves")]
    moves = [f"ours {v}" for k, v in figures.items() if k.startswith("alloc vs alone: ours")]
    return "; ".join([line, ", ".join(parts)] + moves + key)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for results.json, summary.md, logs")
    parser.add_argument("--budget", type=float, default=150.0,
                        help="seconds for all checks together (each also has its own limit)")
    parser.add_argument("--only", default="", help="comma-separated check names")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    started = time.monotonic()
    wanted = [c for c in CHECKS if not args.only or c[0] in args.only.split(",")]
    answers = {name: answer for name, _, answer, _, _ in CHECKS}
    results: Dict[str, Dict[str, Any]] = {}

    reason = _common.gpu_skip_reason()
    for name, script, _, limit, workers in wanted:
        folder = os.path.join(args.out, name)
        os.makedirs(folder, exist_ok=True)
        left = args.budget - (time.monotonic() - started)
        if reason is not None:  # each script would say the same; do not start them
            results[name] = {"status": "skip", "figures": {}, "failures": [],
                             "notes": [f"no GPU: {reason}"]}
            continue
        if left < 15:
            results[name] = {"status": "not_run", "figures": {}, "failures": [],
                             "notes": [f"budget exhausted ({left:.0f} s left)"]}
            continue
        print(f"=== {name} (limit {min(limit, left):.0f} s)", flush=True)
        results[name] = run_check(script, folder, min(limit, left), workers)

    print()
    print(f"{'check':<14}{'status':<9}{'s':>6}  answers")
    for name, document in results.items():
        print(f"{name:<14}{document['status']:<9}{document.get('seconds', 0):>6}  {answers[name]}")
        for key, value in document.get("figures", {}).items():
            print(f"{'':<14}  {key}: {value}")
        for text in document.get("failures", []):
            print(f"{'':<14}  FAIL: {text}")
        for text in document.get("notes", [])[:5]:
            print(f"{'':<14}  note: {text}")
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as handle:
        handle.write(summary_markdown(results, answers))
    line = summary_line(results)
    if reason is not None:
        line = f"skipped: no GPU ({reason}); " + line
    with open(os.path.join(args.out, "summary_line.txt"), "w", encoding="utf-8") as handle:
        handle.write(line + "\n")
    print(line)
    failed = any(d["status"] in ("fail", "timeout") for d in results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

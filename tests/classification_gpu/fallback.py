#!/usr/bin/env python3
"""Check 5 (docs/classification.md, "Checks still to run on the H200"): the container fallback,
when NVML does not list our PID.

    python tests/classification_gpu/fallback.py [--out DIR]

The plugin offers no switch that forces the fallback (process_report always asks NVML), so the
condition is made real: the worker runs in a new PID namespace (`unshare --pid --fork`, as root,
else inside a user namespace with --map-root-user), where getpid() is a namespace PID that
NVML's host-PID process list does not contain. There, under `vramledger run`, asserted at
several instants of a small workload:
  basis device_used_fallback, a caveat, other_processes null, Σ lines == process usage ==
  device used, and that device used equals NVML's device figure read independently (ctypes);
  a memory_profile fed by nvml_process_memory() reports basis device_used_fallback with the
  warning and its lines still add up to the budget.
Outcomes besides pass/fail: not_run when no PID namespace can be created here (the reason is
recorded), and not_run when NVML does list the namespaced PID (the driver translates PIDs into
the namespace: the fallback cannot be provoked this way on that driver). Without a GPU:
"skipped: no GPU", exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from _common import MIB, Outcome  # noqa: E402

CHECK = "fallback"


def worker() -> int:
    import torch

    import vramledger
    from vramledger.profiling import memory_profile, nvml_process_memory

    assert vramledger.is_installed(), "vramledger run did not install vramledger"
    torch.cuda.synchronize()
    nvml = _common.Nvml(_common.cuda_pci_bus_id(torch.cuda.current_device()))
    instants: List[Dict[str, Any]] = []

    def instant(label: str) -> None:
        torch.cuda.synchronize()
        used_before, _ = nvml.device_used_total()
        report = json.loads(vramledger.process_report(format="json"))
        used_after, _ = nvml.device_used_total()
        instants.append({
            "label": label, "basis": report["basis"], "source": report["process_memory_source"],
            "caveat": report["caveat"], "other_processes": report["other_processes_bytes"],
            "lines_sum": sum(int(line["bytes"]) for line in report["lines"]),
            "process_usage_bytes": report["process_usage_bytes"],
            "device_used_bytes": report["device_used_bytes"],
            "nvml_device_used_before": used_before, "nvml_device_used_after": used_after,
            "remainder_label": report["remainder"]["label"],
            "missing_hook": report["missing_hook"],
        })

    instant("context created")
    with memory_profile(process_memory=nvml_process_memory()) as prof:
        with prof.loading():
            weights = torch.randn(4096, 4096, device="cuda")
        instant("loaded")
        with prof.profiling():
            activation = weights @ weights
            del activation
            torch.cuda.synchronize()
    instant("profiled")
    result = prof.result(utilization=0.9)
    _common.emit({
        "getpid": os.getpid(), "nvml_lists_getpid": nvml.process_used() is not None,
        "instants": instants, "profile_basis": result.non_torch_basis,
        "profile_warnings": result.warnings,
        "accounted_equals_budget": result.accounted_bytes() == result.budget_bytes,
    })
    return 0


def analyse(result: Dict[str, Any], outcome: Outcome) -> None:
    """The assertions on the namespaced worker's RESULT (pure: test_offline.py feeds it made-up
    data). NVML listing the namespaced PID makes the check not applicable, not failed."""
    outcome.figures["getpid() in the namespace"] = result["getpid"]
    if result["nvml_lists_getpid"] or any(at["basis"] == "nvml_per_process"
                                          for at in result["instants"]):
        outcome.status_override = "not_run"
        outcome.notes.append(f"NVML lists PID {result['getpid']} inside the PID namespace (or "
                             "the report found it): this driver translates PIDs, so the fallback "
                             "cannot be provoked this way")
        return
    for at in result["instants"]:
        where = f"instant '{at['label']}'"
        outcome.expect(at["basis"] == "device_used_fallback", f"{where}: basis {at['basis']}")
        outcome.expect(bool(at["caveat"]), f"{where}: no caveat")
        outcome.expect(at["other_processes"] is None,
                       f"{where}: other_processes {at['other_processes']}, expected null")
        outcome.expect(at["lines_sum"] == at["process_usage_bytes"] == at["device_used_bytes"],
                       f"{where}: Σ lines {at['lines_sum']}, process usage "
                       f"{at['process_usage_bytes']}, device used {at['device_used_bytes']}")
        outcome.expect(at["missing_hook"] is None, f"{where}: {at['missing_hook']}")
        outcome.expect("other processes" in at["remainder_label"],
                       f"{where}: remainder label '{at['remainder_label']}'")
        if at["nvml_device_used_before"] == at["nvml_device_used_after"]:
            outcome.expect(at["device_used_bytes"] == at["nvml_device_used_before"],
                           f"{where}: device used {at['device_used_bytes']} != NVML's "
                           f"{at['nvml_device_used_before']}")
        else:
            outcome.notes.append(f"{where}: device used moved during the report; not compared")
    outcome.expect(result["profile_basis"] == "device_used_fallback",
                   f"profile basis {result['profile_basis']}")
    outcome.expect(any("device used memory" in w for w in result["profile_warnings"]),
                   f"profile has no fallback warning: {result['profile_warnings']}")
    outcome.expect(result["accounted_equals_budget"], "profile lines do not add up to budget")
    if result["instants"]:
        first = result["instants"][0]
        outcome.figures["caveat"] = (first["caveat"] or "")[:160]
        outcome.figures["process usage (= device used) after init"] = (
            f"{first['process_usage_bytes']} B ({first['process_usage_bytes'] / MIB:.0f} MiB)")


def namespace_prefixes() -> List[List[str]]:
    """unshare command lines to try, most direct first."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    prefixes = []
    if os.geteuid() == 0:
        prefixes.append([unshare, "--pid", "--fork", "--kill-child"])
    prefixes.append([unshare, "--user", "--map-root-user", "--pid", "--fork", "--kill-child"])
    return prefixes


def probe_inside() -> int:
    """--role probe, run inside the namespace: our PID there, and whether the GPU is usable."""
    print(json.dumps({"getpid": os.getpid(), "gpu": _common.gpu_skip_reason()}))
    return 0


def probe(prefix: List[str]) -> Optional[str]:
    """None when `prefix` starts a process in a new PID namespace that can use the GPU, else
    why not."""
    try:
        completed = subprocess.run(prefix + [sys.executable, os.path.abspath(__file__),
                                             "--role", "probe"],
                                   capture_output=True, text=True, timeout=20,
                                   stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if completed.returncode != 0:
        return (completed.stderr.strip().splitlines() or ["exit %d" % completed.returncode])[-1]
    try:
        found = json.loads(completed.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"unexpected probe output {completed.stdout.strip()[:200]!r}"
    if found["getpid"] != 1:
        return f"not a new PID namespace (getpid() = {found['getpid']})"
    if found["gpu"] is not None:
        return f"no GPU inside the namespace: {found['gpu']}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("main", "worker", "probe"), default="main")
    parser.add_argument("--out", default=None)
    parser.add_argument("--timeout", type=float, default=45.0, help="worker, seconds")
    args = parser.parse_args()
    if args.role == "worker":
        return worker()
    if args.role == "probe":
        return probe_inside()

    _common.skip_without_gpu(CHECK)
    folder = _common.out_dir(args.out, CHECK)
    outcome = Outcome(CHECK)
    reasons = []
    chosen = None
    for prefix in namespace_prefixes():
        why = probe(prefix)
        if why is None:
            chosen = prefix
            break
        reasons.append(f"{' '.join(prefix[1:])}: {why}")
    if chosen is None:
        outcome.status_override = "not_run"
        outcome.notes.append("no PID namespace could be created: "
                             + ("; ".join(reasons) or "unshare not installed"))
        outcome.finish()
    outcome.figures["namespace"] = " ".join(chosen[1:])
    command = chosen + _common.vramledger_run(os.path.abspath(__file__), ["--role", "worker"],
                                              track_non_torch=False)
    outcome.run_worker_then_finish(command, args.timeout, folder, analyse,
                                   what="worker in the PID namespace")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Helpers shared by compare_allocators.py and compile_check.py: running one child process
under a time limit (and killing everything it started when the limit passes or the parent is
stopped), probing the Python environment, small statistics and file helpers.

Standard library only: the parent processes run (and are tested) on machines without torch.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

# Exit status of a script that found no GPU: skipped, not failed (the automake convention).
EXIT_NO_GPU = 77
# Exit status when the run was stopped by its time limit or a signal before it finished.
EXIT_INTERRUPTED = 124

# Variables that choose or configure an allocator: removed from every child's environment and
# set again only where an allocator configuration asks for them, so the caller's shell cannot
# leak a setting into the wrong run.
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "VRAMLEDGER_CONF",
                       "VRAMLEDGER_AUTOINSTALL")

# Settings that make cuBLAS pick deterministic algorithms; must be in the environment before the
# child's first cuBLAS call, so the parent sets it.
DETERMINISM_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONHASHSEED": "0"}


class Interrupted(Exception):
    """The parent received SIGTERM/SIGINT: stop starting runs, write what exists, exit."""


def install_signal_handlers(registry: "ProcessRegistry") -> None:
    """SIGTERM/SIGINT kill every running child group and raise Interrupted in the main thread
    (a `timeout` around the parent would otherwise leave children running on the GPU)."""

    def handler(signum, _frame):
        registry.stop()
        raise Interrupted(f"stopped by signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def die_with_parent() -> None:
    """In a child: ask Linux to SIGKILL this process when the parent dies (even by SIGKILL), so
    a killed harness never leaves a process holding the GPU. No-op where prctl is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(EXIT_INTERRUPTED)


class ProcessRegistry:
    """The child processes running now (each the leader of its own session), so that a stop
    request can kill them and everything they started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Dict[int, subprocess.Popen] = {}
        self.stopped = False

    def add(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._running[proc.pid] = proc
        if self.stopped:  # a stop raced with the start
            kill_group(proc)

    def discard(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self._running.pop(proc.pid, None)

    def stop(self) -> None:
        self.stopped = True
        with self._lock:
            procs = list(self._running.values())
        for proc in procs:
            kill_group(proc)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads (it was started with start_new_session=True)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class ProcessOutcome:
    exit_code: Optional[int]   # None when the process could not be started
    timed_out: bool
    wall_s: float
    start_error: Optional[str] = None


def run_process(command: Sequence[str], env: Dict[str, str], timeout_s: float, log_path: Path,
                registry: ProcessRegistry, max_log_bytes: int = 64 * 1024) -> ProcessOutcome:
    """Runs `command` with stdout+stderr into log_path, in its own session, for at most
    timeout_s seconds; then kills its whole process group (grandchildren such as compile
    workers included). The log keeps its last max_log_bytes (logs travel back from the GPU
    machine in a tarball)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(list(command), env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as error:
            return ProcessOutcome(None, False, time.monotonic() - start, f"cannot start: {error}")
        registry.add(proc)
        timed_out = False
        try:
            exit_code = proc.wait(timeout=max(timeout_s, 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc)
            exit_code = proc.wait()
        finally:
            kill_group(proc)  # leftovers of a finished leader (its group may outlive it)
            registry.discard(proc)
    wall = time.monotonic() - start
    trim_log(log_path, max_log_bytes)
    return ProcessOutcome(exit_code, timed_out, wall)


def trim_log(path: Path, max_bytes: int) -> None:
    """Keeps the last max_bytes of a log, marking the cut."""
    try:
        size = path.stat().st_size
        if size <= max_bytes:
            return
        with open(path, "rb") as f:
            f.seek(size - max_bytes)
            tail = f.read()
        with open(path, "wb") as f:
            f.write(f"[... first {size - max_bytes} bytes of this log cut ...]\n".encode())
            f.write(tail)
    except OSError:
        pass


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def child_environment(extra: Dict[str, str], gpu: Optional[str] = None) -> Dict[str, str]:
    """The caller's environment without allocator settings, plus the determinism settings,
    unbuffered output, `extra`, and CUDA_VISIBLE_DEVICES=gpu when given."""
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_VARIABLES}
    env.update(DETERMINISM_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    env.update(extra)
    return env


def visible_gpu_ids(count: int) -> List[str]:
    """The CUDA_VISIBLE_DEVICES value for each of the first `count` GPUs this process sees."""
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited:
        ids = [part.strip() for part in inherited.split(",") if part.strip()]
        return ids[:count]
    return [str(i) for i in range(count)]


def read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json_atomic(path: Path, data: object) -> None:
    """Writes JSON through a temporary file, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def median(values: Sequence[float]) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def percentile_nearest_rank(values: Sequence[float], q: float) -> Optional[float]:
    """The q-th percentile (0 < q <= 100) by the nearest-rank method: a value that occurred."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def git_commit(repo: Path) -> Optional[str]:
    try:
        done = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


# The probe: one child that reports what the GPU machine has, without allocating on the GPU.
PROBE_CODE = r"""
import json, sys, importlib.metadata as md
info = {"python": sys.version.split()[0], "executable": sys.executable}
def version(name):
    try:
        return md.version(name)
    except Exception:
        return None
for name in ("transformers", "torchvision", "triton", "matplotlib", "numpy"):
    info[name] = version(name)
try:
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["cuda_available"] = torch.cuda.is_available()
    info["device_count"] = torch.cuda.device_count() if info["cuda_available"] else 0
    info["gpus"] = [torch.cuda.get_device_name(i) for i in range(info["device_count"])]
except Exception as error:
    info["torch_error"] = repr(error)
try:
    import vramledger
    info["vramledger"] = vramledger.__version__
    info["vramledger_path"] = vramledger.__file__
except Exception as error:
    info["vramledger_error"] = repr(error)
print("PROBE " + json.dumps(info))
"""


def probe_environment(python: str, registry: ProcessRegistry, log_path: Path,
                      timeout_s: float = 90) -> dict:
    """Runs PROBE_CODE in a child; returns its findings, or {"probe_error": ...}."""
    outcome = run_process([python, "-c", PROBE_CODE], child_environment({}), timeout_s, log_path,
                          registry)
    text = ""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        pass
    for line in text.splitlines():
        if line.startswith("PROBE "):
            try:
                return json.loads(line[len("PROBE "):])
            except ValueError:
                break
    reason = "timed out" if outcome.timed_out else f"exit {outcome.exit_code}"
    return {"probe_error": f"environment probe failed ({reason}): {log_tail(log_path, 5)}"}


def no_gpu_reason(probe: dict) -> Optional[str]:
    """Why the probe says there is no usable GPU, or None when there is one."""
    if "probe_error" in probe:
        return probe["probe_error"]
    if "torch_error" in probe:
        return f"torch is not importable: {probe['torch_error']}"
    if not probe.get("cuda_available"):
        return (f"no CUDA device (torch {probe.get('torch')} reports "
                "torch.cuda.is_available() == False)")
    return None


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def fmt_optional(value: Optional[float], spec: str, missing: str = "n/a") -> str:
    return missing if value is None else format(value, spec)


def first_difference(reference: Sequence[str], other: Sequence[str]) -> Optional[int]:
    """Index of the first differing entry (a length difference counts at the shorter end), or
    None when both are identical."""
    for index, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return index
    if len(reference) != len(other):
        return min(len(reference), len(other))
    return None


def eprint(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)

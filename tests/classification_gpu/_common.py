"""Shared pieces of the H200 classification checks (docs/classification.md, "Checks still to run
on the H200"): GPU detection without torch, an NVML reader of our own (ctypes, independent of
the plugin's NvmlProcessMemory so the comparison is not circular), raw device allocations
outside torch, worker processes with time limits, and the result protocol run_checks.py reads.

Protocol: a check script prints exactly one line `CHECK_RESULT {json}` last, with
  {"check": name, "status": "pass" | "fail" | "skip" | "not_run", "figures": {...},
   "failures": [text, ...], "notes": [text, ...]}
and exits 0 for pass / skip / not_run, 1 for fail. Workers print `RESULT {json}`.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

MIB = 1 << 20
GIB = 1 << 30
DRIVER_GRANULE = 2 * MIB  # the driver's allocation granularity on the H200 (anchors.md)
HERE = os.path.dirname(os.path.abspath(__file__))


def round_up(num_bytes: int, granule: int) -> int:
    return -(-num_bytes // granule) * granule


def gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:+.3f} GiB" if num_bytes < 0 else f"{num_bytes / GIB:.3f} GiB"


# ---------------------------------------------------------------- GPU presence, without torch


def gpu_skip_reason() -> Optional[str]:
    """Why there is no usable GPU, or None. Asks the driver directly (libcuda), so it answers on
    machines where torch cannot even be imported (this project's CPU machines)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        return f"no CUDA driver ({error})"
    status = cuda.cuInit(0)
    if status != 0:
        return f"cuInit failed with CUresult {status}"
    count = ctypes.c_int(0)
    status = cuda.cuDeviceGetCount(ctypes.byref(count))
    if status != 0 or count.value == 0:
        return f"no CUDA device (cuDeviceGetCount: status {status}, count {count.value})"
    return None


def cuda_pci_bus_id(ordinal: int = 0) -> str:
    """The PCI bus id of CUDA device `ordinal` (as CUDA_VISIBLE_DEVICES maps it)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    _check(cuda.cuInit(0), "cuInit")
    device = ctypes.c_int(0)
    _check(cuda.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
    text = ctypes.create_string_buffer(64)
    _check(cuda.cuDeviceGetPCIBusId(text, 64, device), "cuDeviceGetPCIBusId")
    return text.value.decode()


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} failed with CUresult {status}")


# ---------------------------------------------------------------- NVML, read independently


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t as the _v3 query fills it
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _Memory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class Nvml:
    """NVML's view of one GPU, found by PCI bus id, read with ctypes: the ground truth the
    plugin's figures are compared with."""

    def __init__(self, bus_id: str) -> None:
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._call(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.device = ctypes.c_void_p()
        self._call(self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id.encode(),
                                                             ctypes.byref(self.device)),
                   f"nvmlDeviceGetHandleByPciBusId_v2({bus_id})")

    def _call(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed: NVML error {status}")

    def process_used(self, pid: Optional[int] = None) -> Optional[int]:
        """usedGpuMemory of `pid` (default: us), or None when NVML does not list it."""
        pid = os.getpid() if pid is None else pid
        capacity = 64
        while True:
            infos = (_ProcessInfo * capacity)()
            count = ctypes.c_uint(capacity)
            status = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(
                self.device, ctypes.byref(count), infos)
            if status == 7:  # NVML_ERROR_INSUFFICIENT_SIZE: the list grew; ask again
                capacity = count.value + 16
                continue
            self._call(status, "nvmlDeviceGetComputeRunningProcesses_v3")
            for info in infos[:count.value]:
                if info.pid == pid:
                    return int(info.usedGpuMemory)
            return None

    def device_used_total(self) -> Tuple[int, int]:
        memory = _Memory()
        self._call(self.lib.nvmlDeviceGetMemoryInfo(self.device, ctypes.byref(memory)),
                   "nvmlDeviceGetMemoryInfo")
        return int(memory.used), int(memory.total)


# ---------------------------------------------------------------- raw allocations outside torch


class RawCuda:
    """cudaMalloc / cudaFree from the libcudart torch already loaded (found in /proc/self/maps,
    so the same runtime and the same current device), else the driver's cuMemAlloc_v2. Call
    after torch created the CUDA context. `via` names the path taken."""

    def __init__(self) -> None:
        runtime = None
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if os.path.basename(path).startswith("libcudart.so"):
                    runtime = path
                    break
        if runtime is not None:
            self.lib = ctypes.CDLL(runtime)
            self.lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
            self.lib.cudaFree.argtypes = [ctypes.c_void_p]
            self.via = f"cudaMalloc ({os.path.basename(runtime)})"
            self._runtime = True
        else:
            self.lib = ctypes.CDLL("libcuda.so.1")
            self.lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
            self.lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
            self.via = "cuMemAlloc_v2 (libcuda.so.1; no libcudart mapped)"
            self._runtime = False

    def alloc(self, num_bytes: int) -> int:
        if self._runtime:
            pointer = ctypes.c_void_p()
            status = self.lib.cudaMalloc(ctypes.byref(pointer), num_bytes)
            if status != 0:
                raise RuntimeError(f"cudaMalloc({num_bytes}) failed with cudaError {status}")
            return int(pointer.value)
        pointer = ctypes.c_uint64()
        _check(self.lib.cuMemAlloc_v2(ctypes.byref(pointer), num_bytes), "cuMemAlloc_v2")
        return int(pointer.value)

    def free(self, address: int) -> None:
        if self._runtime:
            status = self.lib.cudaFree(ctypes.c_void_p(address))
            if status != 0:
                raise RuntimeError(f"cudaFree failed with cudaError {status}")
        else:
            _check(self.lib.cuMemFree_v2(ctypes.c_uint64(address)), "cuMemFree_v2")


# ---------------------------------------------------------------- processes and results


def emit(result: Dict[str, Any]) -> None:
    """A worker's result line."""
    print("RESULT " + json.dumps(result), flush=True)


def vramledger_run(script: str, args: List[str], track_non_torch: Optional[bool],
                   conf: Optional[str] = None) -> List[str]:
    """`python -m vramledger run [...] -- python script args...`: the documented CLI path."""
    command = [sys.executable, "-m", "vramledger", "run"]
    if conf is not None:
        command += ["--conf", conf]
    if track_non_torch is True:
        command.append("--track-non-torch")
    elif track_non_torch is False:
        command.append("--no-track-non-torch")
    return command + ["--", sys.executable, script] + args


def run_worker(command: List[str], timeout_s: float, log_path: Optional[str] = None,
               env: Optional[Dict[str, str]] = None,
               result_path: Optional[str] = None) -> Tuple[Optional[Dict[str, Any]], str]:
    """Runs a worker; returns (its RESULT dict or None, a one-line reason when None). Output goes
    to log_path and the result to result_path (both kept for the GPU logs)."""
    started = time.monotonic()
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                                   env=env, stdin=subprocess.DEVNULL)
        out, err, rc = completed.stdout, completed.stderr, completed.returncode
    except subprocess.TimeoutExpired as expired:
        out = _text(expired.stdout)
        err = _text(expired.stderr)
        rc = None
    elapsed = time.monotonic() - started
    if log_path:
        with open(log_path, "w", encoding="utf-8") as log:
            log.write(f"$ {' '.join(command)}\n# exit {rc}, {elapsed:.1f} s\n--- stdout\n{out}"
                      f"\n--- stderr\n{err[-20000:]}\n")
    result = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    if rc is None:
        return None, f"timed out after {timeout_s:.0f} s ({_last_line(err)})"
    if rc != 0:
        return None, f"exit {rc}: {_last_line(err)}"
    if result is None:
        return None, "no RESULT line"
    result["wall_s"] = round(elapsed, 1)
    if result_path:
        with open(result_path, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    return result, ""


def _text(data: Any) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output on stderr"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Outcome:
    """What a check found; finish() prints it and the CHECK_RESULT line, and exits."""

    def __init__(self, check: str) -> None:
        self.check = check
        self.figures: Dict[str, Any] = {}
        self.failures: List[str] = []
        self.notes: List[str] = []
        self.status_override: Optional[str] = None

    def expect(self, condition: bool, failure: str) -> bool:
        if not condition:
            self.failures.append(failure)
        return condition

    def status(self) -> str:
        if self.failures:
            return "fail"
        return self.status_override or "pass"

    def document(self) -> Dict[str, Any]:
        return {"check": self.check, "status": self.status(), "figures": self.figures,
                "failures": self.failures, "notes": self.notes}

    def run_worker_then_finish(self, command: List[str], timeout_s: float, folder: str,
                               analyse, what: str = "worker") -> None:
        """Runs the check's worker (logs and result.json in `folder`), lets analyse(result,
        self) judge what it measured or records why there is nothing to judge, and finishes."""
        result, why = run_worker(command, timeout_s, os.path.join(folder, "worker.log"),
                                 env=worker_env(), result_path=os.path.join(folder, "result.json"))
        if result is None:
            self.failures.append(f"{what}: {why} (see worker.log)")
        else:
            analyse(result, self)
        self.finish()

    def finish(self) -> None:
        for key, value in self.figures.items():
            print(f"  {key}: {value}")
        for note in self.notes:
            print(f"  note: {note}")
        for failure in self.failures:
            print(f"  FAIL: {failure}")
        print(f"{self.check}: {self.status().upper()}")
        print("CHECK_RESULT " + json.dumps(self.document()), flush=True)
        sys.exit(1 if self.failures else 0)


def skip_without_gpu(check: str) -> None:
    """Exits 0 with 'skipped: no GPU' (and a CHECK_RESULT) when there is no usable GPU."""
    reason = gpu_skip_reason()
    if reason is None:
        return
    print(f"skipped: no GPU ({reason})")
    outcome = Outcome(check)
    outcome.status_override = "skip"
    outcome.notes.append(f"no GPU: {reason}")
    outcome.finish()


def out_dir(path: Optional[str], check: str) -> str:
    folder = path or os.path.join(os.getcwd(), "classification_gpu_logs", check)
    os.makedirs(folder, exist_ok=True)
    return folder


def worker_env(drop_preload: bool = False) -> Dict[str, str]:
    """The environment for workers: NVLink multicast off (the device runner asks for it)."""
    env = dict(os.environ)
    env.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1", "PYTHONUNBUFFERED": "1"})
    if drop_preload:
        env.pop("LD_PRELOAD", None)
    return env

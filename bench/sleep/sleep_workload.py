"""The workload shared by the sleep/wake GPU test (tests/torch/test_sleep.py) and the benchmark
(bench/sleep/bench_sleep.py): a model whose weights are tagged (offloaded on sleep), a KV cache
(discarded), a CUDA graph captured over the model, and the checks an engine relies on after a
wake: weights bitwise intact, the graph's replay bitwise the same, the cache usable.

Memory is measured by NVML's per-process figure (ctypes over libnvidia-ml, no pynvml needed),
falling back to the device's used memory (torch.cuda.mem_get_info) where NVML has no
per-process data; `basis` says which.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Callable, ContextManager, Dict

import torch

GIB = 1 << 30
HIDDEN = 8192  # one bf16 layer: 128 MiB


class _ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class ProcessMemory:
    """This process's memory on one GPU, as NVML reports it."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.basis = "device used (torch.cuda.mem_get_info)"
        self._handle = None
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if nvml.nvmlInit_v2() != 0:
                return
            props = torch.cuda.get_device_properties(device)
            bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(handle)) != 0:
                return
            self._nvml, self._handle = nvml, handle
            if self._per_process() is not None:
                self.basis = "NVML per-process"
        except (OSError, AttributeError):
            self._handle = None

    def _per_process(self):
        if self._handle is None:
            return None
        count = ctypes.c_uint(64)
        infos = (_ProcessInfo * 64)()
        get = getattr(self._nvml, "nvmlDeviceGetComputeRunningProcesses_v3", None)
        if get is None or get(self._handle, ctypes.byref(count), infos) != 0:
            return None
        for i in range(count.value):
            if infos[i].pid == os.getpid():
                return int(infos[i].usedGpuMemory)
        return None

    def used(self) -> int:
        torch.cuda.synchronize(self.device)
        value = self._per_process() if self.basis == "NVML per-process" else None
        if value is not None:
            return value
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free


def build(weights_bytes: int, kv_bytes: int, weights_region: Callable[[], ContextManager],
          kv_region: Callable[[], ContextManager]) -> Dict:
    """The model (bf16 Linear layers of HIDDEN x HIDDEN until weights_bytes), the KV cache and a
    CUDA graph of the model's forward pass; allocations inside the given regions (tags)."""
    torch.manual_seed(0)
    layers = max(1, weights_bytes // (HIDDEN * HIDDEN * 2))
    with weights_region():
        model = torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN, bias=True, device="cuda",
                                                      dtype=torch.bfloat16)
                                      for _ in range(layers)])
        for parameter in model.parameters():
            parameter.requires_grad_(False)
            parameter.normal_(0, HIDDEN ** -0.5)
    with kv_region():
        kv = torch.empty(kv_bytes, dtype=torch.uint8, device="cuda")
        kv.fill_(7)
    static_input = torch.randn(8, HIDDEN, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture, as torch asks
        for _ in range(2):
            model(static_input)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_output = model(static_input)
    graph.replay()
    torch.cuda.synchronize()
    return {"model": model, "kv": kv, "graph": graph, "input": static_input,
            "output": static_output, "reference": static_output.clone(),
            "checksums": checksums(model), "layers": layers}


def checksums(model: torch.nn.Module) -> torch.Tensor:
    """Two exact integer sums per parameter (plain and position-weighted, over the bits as int16):
    any changed bit changes them (short of a coincidence the test would not hit)."""
    sums = []
    for parameter in model.parameters():
        bits = parameter.detach().reshape(-1).view(torch.int16).to(torch.int64)
        weights = torch.arange(1, bits.numel() + 1, device=bits.device, dtype=torch.int64) % 65521
        sums.append(torch.stack([bits.sum(), (bits * weights).sum()]))
    return torch.stack(sums).cpu()


def check_after_wake(state: Dict) -> Dict:
    """Weights bitwise intact, the graph's replay bitwise the same, the KV cache writable."""
    weights_intact = bool(torch.equal(checksums(state["model"]), state["checksums"]))
    state["graph"].replay()
    torch.cuda.synchronize()
    graph_identical = bool(torch.equal(state["output"], state["reference"]))
    state["kv"].fill_(3)
    kv_usable = bool(state["kv"][-1].item() == 3 and state["kv"][0].item() == 3)
    return {"weights_intact": weights_intact, "graph_identical": graph_identical,
            "kv_usable": kv_usable}


def timed(call: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return time.perf_counter() - start

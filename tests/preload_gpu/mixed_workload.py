#!/usr/bin/env python3
"""The test program of the H200 checks 1, 2, 3 and 5 of docs/preload.md (run by run_checks.py).

One process that uses torch (under vramledger or torch's own allocator), cuBLAS (a matmul),
cuDNN (a conv), a Triton kernel, a CUDA graph (capture, instantiate, replay), NCCL (world size 1
here; world size 2 in two child processes when 2 GPUs are present), and raw cudaMalloc /
cuMemAlloc / cuMemCreate of known sizes from ctypes and from C (libraw_alloc.so). At chosen
instants it reads the shim's figures (vramledger_preload_get_stats through ctypes), NVML's
per-process usage, and, under vramledger, vramledger.process_report(format="json"), and checks:

  - every raw byte is seen, in the "user" category, and nothing else moved meanwhile;
  - host-located cuMemCreate holds no device bytes;
  - torch's memory is in the torch line (native allocator) or the vramledger category
    (vramledger installed), never in the non-torch total; no unknown / unknown-JIT bytes;
  - NCCL's memory is in the nccl category;
  - torch (or vramledger) reserved + non-torch tracked bytes <= NVML per-process usage;
  - unwrapped_lookups == 0, no table overflow, no untracked frees of our own memory.

    python mixed_workload.py --raw-lib PATH --expect-allocator vramledger|native
        --expect-shim yes|no [--expect-torch-install yes|no] [--nccl-ranks 1|2]

The last stdout line is "RESULT {json}": ok, checks [{name, ok, detail}], outputs_sha256 (the
computed tensors), torch_figures (allocated/reserved current and peak), shim figures. Exit 0 when
every check passed; "skipped: no GPU" and exit 0 without a CUDA device.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

CATEGORIES = ["nccl", "cublas", "cudnn", "triton", "unknown/JIT", "torch", "vramledger", "user",
              "unknown", "routed cache (idle)"]
NCCL, CUBLAS, CUDNN, TRITON, JIT, TORCH, VRAMLEDGER, USER, UNKNOWN, ROUTED_IDLE = range(len(CATEGORIES))
MiB = 1 << 20


# --- the shim's C API (abi/vramledger_preload.h) ----------------------------------------

class CategoryStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in
                ("current_bytes", "peak_bytes", "live_allocations", "allocations", "frees",
                 "failed_calls", "routed_current_bytes")]


class ShimStats(ctypes.Structure):
    _fields_ = [("categories", CategoryStats * len(CATEGORIES))] + [
        (name, ctypes.c_int64) for name in
        ("non_torch_current_bytes", "intercepted_calls", "table_capacity", "table_live",
         "table_overflow", "table_overflow_bytes", "untracked_frees", "unwrapped_lookups",
         "torch_install", "route_state", "routed_reserved_bytes", "routed_reserved_peak_bytes",
         "routed_live_bytes", "routed_allocations", "routed_declined", "routed_failed")]


def shim_api():
    """The shim's get_stats function when the shim is loaded in this process, else None."""
    try:
        fn = ctypes.CDLL(None).vramledger_preload_get_stats
    except AttributeError:
        return None
    fn.argtypes = [ctypes.POINTER(ShimStats)]
    fn.restype = ctypes.c_int
    return fn


def read_shim(fn) -> ShimStats:
    stats = ShimStats()
    if fn is not None and fn(ctypes.byref(stats)) != 0:
        raise RuntimeError("vramledger_preload_get_stats failed")
    return stats


def shim_dict(stats: ShimStats) -> dict:
    out = {name: getattr(stats, name) for name, _ in ShimStats._fields_[1:]}
    out["categories"] = {CATEGORIES[i]: {f: getattr(stats.categories[i], f)
                                         for f, _ in CategoryStats._fields_}
                         for i in range(len(CATEGORIES))}
    return out


# --- NVML per-process usage, through ctypes (independent of vramledger's own NVML code) -------

class NvmlProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t of the _v3 query
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class NvmlMemory(ctypes.Structure):  # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class Nvml:
    """Per-process used memory of this process on one CUDA device; falls back to the device's
    used memory (an upper bound that includes other processes) when NVML does not list this pid
    (a container's PID namespace), and says which basis it used."""

    NOT_AVAILABLE = (1 << 64) - 1

    def __init__(self, cudart, device: int):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        bus_id = ctypes.create_string_buffer(64)
        status = cudart.cudaDeviceGetPCIBusId(bus_id, 64, device)
        if status != 0:
            raise RuntimeError(f"cudaDeviceGetPCIBusId failed: {status}")
        self.handle = ctypes.c_void_p()
        status = self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus_id, ctypes.byref(self.handle))
        if status != 0:
            raise RuntimeError(f"nvmlDeviceGetHandleByPciBusId_v2({bus_id.value!r}) failed: {status}")
        self.bus_id = bus_id.value.decode()

    def process_usage(self) -> "tuple[int, str]":
        infos = (NvmlProcessInfo * 256)()
        count = ctypes.c_uint(256)
        status = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(self.handle,
                                                                  ctypes.byref(count), infos)
        if status == 0:
            for info in infos[:count.value]:
                if info.pid == os.getpid() and info.usedGpuMemory != self.NOT_AVAILABLE:
                    return int(info.usedGpuMemory), "nvml_per_process"
        memory = NvmlMemory()
        if self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(memory)) != 0:
            raise RuntimeError("nvmlDeviceGetMemoryInfo failed")
        return int(memory.used), "nvml_device_used (pid not listed)"


# --- the checks ------------------------------------------------------------------------------

class Checks:
    def __init__(self):
        self.items = []

    def add(self, name: str, ok: bool, detail: str = "") -> bool:
        self.items.append({"name": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", file=sys.stderr, flush=True)
        return bool(ok)

    def equal(self, name: str, actual, expected, what: str = "") -> bool:
        return self.add(name, actual == expected, f"{actual} (expected {expected}){what}")

    @property
    def ok(self) -> bool:
        return all(item["ok"] for item in self.items)


def tensor_digest(tensors) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        cpu = tensor.detach().to("cpu").contiguous()
        digest.update(str((tuple(cpu.shape), str(cpu.dtype))).encode())
        try:
            digest.update(cpu.numpy().tobytes())
        except Exception:  # numpy missing: exact float text of every element
            digest.update(",".join(float(v).hex() for v in cpu.flatten().tolist()).encode())
    return digest.hexdigest()


def torch_figures(torch) -> dict:
    return {"allocated": torch.cuda.memory_allocated(0),
            "max_allocated": torch.cuda.max_memory_allocated(0),
            "reserved": torch.cuda.memory_reserved(0),
            "max_reserved": torch.cuda.max_memory_reserved(0)}


def run_triton(torch, notes: list):
    try:
        import triton
        import triton.language as tl
    except ImportError as error:
        notes.append(f"triton not importable ({error}): Triton kernel skipped")
        return None

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) +
                 tl.load(y_ptr + offsets, mask=mask), mask=mask)

    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    y = torch.full_like(x, 0.5)
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
    if not torch.equal(out, x + y):
        raise RuntimeError("Triton add kernel computed a wrong result")
    return out


def library_workload(torch, dist, init_file: str, notes: list) -> list:
    """cuBLAS, cuDNN, Triton, CUDA graph, NCCL (world size 1). Returns the output tensors."""
    import torch.nn.functional as F

    torch.manual_seed(1234)
    torch.backends.cudnn.enabled = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(512, 384, device="cuda")
    b = torch.randn(384, 256, device="cuda")
    matmul = a @ b                                                       # cuBLAS
    images = torch.randn(8, 3, 32, 32, device="cuda")
    weight = torch.randn(16, 3, 3, 3, device="cuda")
    conv = F.conv2d(images, weight, padding=1)                           # cuDNN
    if not torch.backends.cudnn.is_available():
        notes.append("cuDNN not available: the conv did not use cuDNN")
    outputs = [matmul, conv]
    triton_out = run_triton(torch, notes)                                # Triton
    if triton_out is not None:
        outputs.append(triton_out)
    # CUDA graph: capture on a side stream after a warm-up, instantiate, replay twice.
    static_in = torch.linspace(0, 1, 8192, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        static_out = static_in * 3 + 1
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = static_in * 3 + 1
    static_in.copy_(torch.linspace(1, 2, 8192, device="cuda"))
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    outputs.append(static_out.clone())
    # NCCL, world size 1; device_id makes the communicator eager (created now, not lazily).
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    reduced = torch.arange(1, 1025, device="cuda", dtype=torch.float32)
    dist.all_reduce(reduced)
    torch.cuda.synchronize()
    outputs.append(reduced)
    return outputs


class RawLibraries:
    """Raw allocations of known sizes: ctypes on libcudart / libcuda, and C (libraw_alloc.so)."""

    def __init__(self, raw_lib: str):
        self.c = ctypes.CDLL(raw_lib)
        for name in ("raw_cuda_malloc", "raw_cu_mem_alloc", "raw_cu_mem_create_host",
                     "raw_cu_granularity"):
            getattr(self.c, name).restype = ctypes.c_int
        self.cudart = find_cudart()
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.cuda.cuMemRelease.argtypes = [ctypes.c_uint64]
        self.cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.cudart.cudaFree.argtypes = [ctypes.c_void_p]

    def granularity(self) -> int:
        out = ctypes.c_size_t()
        status = self.c.raw_cu_granularity(0, ctypes.byref(out))
        if status != 0:
            raise RuntimeError(f"cuMemGetAllocationGranularity failed: {status}")
        return out.value


class MemAllocationProp(ctypes.Structure):  # CUmemAllocationProp (cuda.h), 64-bit Linux
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location_type", ctypes.c_int), ("location_id", ctypes.c_int),
                ("win32HandleMetaData", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


def find_cudart():
    """The libcudart torch loaded (any major version), reached with dlopen(RTLD_NOLOAD)."""
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libcudart.so" in line})
    if not paths:
        raise RuntimeError("no libcudart.so mapped in this process (torch links it dynamically)")
    return ctypes.CDLL(paths[0])


def raw_phase(raw: RawLibraries, shim, nvml, checks: Checks, figures: dict,
              expect_shim: bool, before_free=None, expect_route: bool = False) -> None:
    """Allocates known sizes through every path, checks the shim saw exactly them, frees."""
    granularity = raw.granularity()
    before = read_shim(shim)
    live = []       # (free function, key)
    expected = 0    # device bytes
    routable = 0    # bytes of cudaMalloc / cuMemAlloc calls (VRAMLEDGER_PRELOAD_ROUTE serves them)
    calls = 0       # successful allocating calls (host cuMemCreate included)

    def need(status, what):
        if status != 0:
            raise RuntimeError(f"{what} failed with status {status}")

    # ctypes -> libcudart / libcuda (caller: libffi, i.e. user code)
    pointer = ctypes.c_void_p()
    size = 5 * MiB + 321
    need(raw.cudart.cudaMalloc(ctypes.byref(pointer), size), "ctypes cudaMalloc")
    routable += size
    live.append((lambda p=pointer.value: raw.cudart.cudaFree(ctypes.c_void_p(p)), "cudaMalloc"))
    expected += size; calls += 1
    dptr = ctypes.c_uint64()
    size = 3 * MiB + 17
    need(raw.cuda.cuMemAlloc_v2(ctypes.byref(dptr), size), "ctypes cuMemAlloc_v2")
    routable += size
    live.append((lambda p=dptr.value: raw.cuda.cuMemFree_v2(p), "cuMemAlloc_v2"))
    expected += size; calls += 1
    prop = MemAllocationProp(type=1, location_type=1, location_id=0)  # pinned, device 0
    handle = ctypes.c_uint64()
    size = 3 * granularity
    need(raw.cuda.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop),
                              ctypes.c_ulonglong(0)), "ctypes cuMemCreate")
    live.append((lambda h=handle.value: raw.cuda.cuMemRelease(h), "cuMemCreate"))
    expected += size; calls += 1
    # C -> direct calls, cuGetProcAddress pointer, cudaGetDriverEntryPointByVersion pointer
    out = ctypes.c_uint64()
    fn = ctypes.c_uint64()
    size = 7 * MiB + 5
    need(raw.c.raw_cuda_malloc(ctypes.c_size_t(size), ctypes.byref(out)), "C cudaMalloc")
    routable += size
    live.append((lambda p=out.value: raw.c.raw_cuda_free(ctypes.c_uint64(p)), "C cudaMalloc"))
    expected += size; calls += 1
    size = 2 * MiB + 999
    need(raw.c.raw_cu_mem_alloc(ctypes.c_size_t(size), ctypes.byref(out)), "C cuMemAlloc")
    routable += size
    live.append((lambda p=out.value: raw.c.raw_cu_mem_free(ctypes.c_uint64(p)), "C cuMemAlloc"))
    expected += size; calls += 1
    size = 2 * granularity
    need(raw.c.raw_cu_mem_create(ctypes.c_size_t(size), 0, ctypes.byref(out)), "C cuMemCreate")
    live.append((lambda h=out.value: raw.c.raw_cu_mem_release(ctypes.c_uint64(h)), "C cuMemCreate"))
    expected += size; calls += 1
    size = 4 * MiB + 3
    need(raw.c.raw_cu_mem_alloc_via_proc_address(ctypes.c_size_t(size), ctypes.byref(out),
                                                 ctypes.byref(fn)), "C cuGetProcAddress cuMemAlloc")
    routable += size
    figures["cuGetProcAddress_cuMemAlloc_pointer"] = hex(fn.value)
    live.append((lambda p=out.value: raw.c.raw_cu_mem_free_via_proc_address(ctypes.c_uint64(p)),
                 "cuGetProcAddress cuMemAlloc"))
    expected += size; calls += 1
    size = 1 * MiB + 77
    need(raw.c.raw_cu_mem_alloc_via_entry_point(ctypes.c_size_t(size), ctypes.byref(out),
                                                ctypes.byref(fn)),
         "C cudaGetDriverEntryPointByVersion cuMemAlloc")
    routable += size
    figures["cudaGetDriverEntryPoint_cuMemAlloc_pointer"] = hex(fn.value)
    live.append((lambda p=out.value: raw.c.raw_cu_mem_free(ctypes.c_uint64(p)),
                 "entry-point cuMemAlloc"))
    expected += size; calls += 1
    figures["dlsym_cuMemAlloc_v2_pointer"] = hex(ctypes.cast(raw.cuda.cuMemAlloc_v2,
                                                             ctypes.c_void_p).value or 0)
    # Host memory through cuMemCreate: 0 device bytes.
    host_status = raw.c.raw_cu_mem_create_host(ctypes.c_size_t(granularity), ctypes.byref(out))
    if host_status == 0:
        live.append((lambda h=out.value: raw.c.raw_cu_mem_release(ctypes.c_uint64(h)),
                     "host cuMemCreate"))
        calls += 1
    figures["host_cuMemCreate_status"] = host_status
    figures["raw_expected_device_bytes"] = expected
    figures["raw_allocating_calls"] = calls

    during = read_shim(shim)
    if before_free is not None:
        before_free(during)  # the NVML / process-report checks while the raw memory is live
    for free, what in reversed(live):
        need(free(), f"free of {what}")
    after = read_shim(shim)
    if not expect_shim:
        return
    user_b, user_d, user_a = (s.categories[USER] for s in (before, during, after))
    checks.equal("raw: user bytes seen while live", user_d.current_bytes - user_b.current_bytes,
                 expected, " (ctypes + C, direct + cuGetProcAddress + entry point)")
    checks.equal("raw: user allocating calls seen", user_d.allocations - user_b.allocations, calls)
    # The routed cache's idle memory moves when it serves the raw calls (checked below).
    others = {CATEGORIES[c]: during.categories[c].current_bytes - before.categories[c].current_bytes
              for c in range(len(CATEGORIES)) if c not in (USER, ROUTED_IDLE)}
    checks.equal("raw: no other category moved", {k: v for k, v in others.items() if v}, {})
    checks.equal("raw: user bytes back after the frees", user_a.current_bytes, user_b.current_bytes)
    checks.equal("raw: user frees seen", user_a.frees - user_d.frees, len(live))
    checks.equal("raw: no untracked frees", after.untracked_frees - before.untracked_frees, 0)
    if expect_route:
        checks.equal("route: raw cudaMalloc/cuMemAlloc bytes served by the routed cache",
                     user_d.routed_current_bytes - user_b.routed_current_bytes, routable)
        checks.equal("route: routed allocations", during.routed_allocations - before.routed_allocations, 6)
        checks.equal("route: routed bytes back after the frees", user_a.routed_current_bytes,
                     user_b.routed_current_bytes)
        checks.equal("route: cache reserved = routed live + idle",
                     during.routed_reserved_bytes,
                     during.routed_live_bytes + during.categories[ROUTED_IDLE].current_bytes)
        checks.equal("route: nothing failed or declined", (after.routed_failed, after.route_state),
                     (0, 1))
        figures["route"] = {"reserved": during.routed_reserved_bytes,
                            "live": during.routed_live_bytes,
                            "idle_after_frees": after.categories[ROUTED_IDLE].current_bytes,
                            "declined": after.routed_declined,
                            "by_library_routed": {CATEGORIES[c]: after.categories[c].routed_current_bytes
                                                  for c in range(len(CATEGORIES))
                                                  if after.categories[c].routed_current_bytes}}
    if host_status != 0:
        checks.add("raw: host cuMemCreate holds no device bytes", True,
                   f"skipped: host cuMemCreate unsupported here (status {host_status})")
    else:
        checks.add("raw: host cuMemCreate holds no device bytes", True,
                   "included above: user bytes matched the device sizes only")


def accounting_checks(torch, vramledger, shim, nvml, checks: Checks, figures: dict, label: str,
                      expect_allocator: str, expect_shim: bool, stats=None, device: int = 0) -> None:
    """torch/vramledger lines + non-torch <= NVML per-process usage on `device` (the only device
    this process uses, so the shim's process-wide figures are that device's), and the process
    report's lines."""
    stats = stats if stats is not None else read_shim(shim)
    usage, basis = nvml.process_usage()
    if expect_allocator == "vramledger":
        torch_lines = vramledger.stats(device)["reserved_bytes"]["all"]["current"]
    else:
        torch_lines = torch.cuda.memory_reserved(device)
    non_torch = stats.non_torch_current_bytes if expect_shim else 0
    remainder = usage - torch_lines - non_torch
    figures[label] = {"process_usage": usage, "basis": basis, "torch_lines": torch_lines,
                      "non_torch": non_torch, "remainder": remainder,
                      "by_category": {CATEGORIES[c]: stats.categories[c].current_bytes
                                      for c in range(len(CATEGORIES))}}
    checks.add(f"{label}: torch lines + non-torch <= NVML usage", remainder >= 0,
               f"{torch_lines} + {non_torch} <= {usage} ({basis}); remainder {remainder}")
    if expect_allocator != "vramledger":
        return
    report = json.loads(vramledger.process_report(device, format="json"))
    figures[label]["process_report"] = {k: report.get(k) for k in
                                       ("basis", "process_usage_bytes", "non_torch", "remainder",
                                        "missing_hook", "problems", "notes")}
    checks.add(f"{label}: process report remainder >= 0, no missing hook",
               report["remainder"]["bytes"] >= 0 and report["missing_hook"] is None,
               f"remainder {report['remainder']['bytes']}, missing_hook {report['missing_hook']}")
    names = [line["name"] for line in report["lines"] if line["kind"] == "non_torch"]
    # Lines are named "non-torch: <library>": the library part must not be ours or torch's.
    libraries = [n.split(":", 1)[-1].strip() for n in names]
    checks.add(f"{label}: no torch/vramledger in the report's non-torch lines",
               not any(lib in ("torch", "vramledger") or "vramledger" in lib
                       for lib in libraries), f"lines {names}")
    if expect_shim:
        by_library = report["non_torch"]["by_library"]
        checks.add(f"{label}: report's library lines = shim's non-torch total",
                   report["non_torch"]["hooked"] and sum(by_library.values()) == non_torch,
                   f"hooked {report['non_torch']['hooked']}, by_library {by_library}, "
                   f"shim {non_torch}")


def nccl_two_ranks(args, checks: Checks, figures: dict) -> None:
    """World size 2 in two child processes (same environment: shim and vramledger inherited)."""
    with tempfile.TemporaryDirectory() as scratch:
        init_file = os.path.join(scratch, "nccl-init")
        command = [sys.executable, os.path.abspath(__file__), "--raw-lib", args.raw_lib,
                   "--expect-allocator", args.expect_allocator, "--expect-shim", args.expect_shim,
                   "--nccl-child-init", init_file]
        children = [subprocess.Popen(command + ["--nccl-child-rank", str(rank)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                    for rank in range(2)]
        for rank, child in enumerate(children):
            try:
                output, _ = child.communicate(timeout=args.child_timeout)
            except subprocess.TimeoutExpired:
                for other in children:
                    other.kill()
                checks.add(f"nccl 2 ranks: rank {rank}", False,
                           f"timed out after {args.child_timeout}s")
                continue
            results = [line[len("RESULT "):] for line in output.splitlines()
                       if line.startswith("RESULT ")]
            result = json.loads(results[-1]) if results else {"ok": False, "checks": []}
            figures[f"nccl_rank{rank}"] = result.get("figures", {})
            failed = [c for c in result.get("checks", []) if not c["ok"]]
            checks.add(f"nccl 2 ranks: rank {rank}", child.returncode == 0 and result.get("ok"),
                       f"exit {child.returncode}; {len(result.get('checks', []))} checks, "
                       f"failed: {failed or 'none'}"
                       + ("" if results else f"; no RESULT line; output tail: {output[-800:]}"))


def nccl_child(args) -> int:
    import torch
    import torch.distributed as dist

    rank = args.nccl_child_rank
    checks, figures = Checks(), {}
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{args.nccl_child_init}", rank=rank,
                            world_size=2, device_id=torch.device("cuda", rank))
    tensor = torch.full((4096,), float(rank + 1), device="cuda")
    dist.all_reduce(tensor)
    torch.cuda.synchronize()
    checks.add("all_reduce sum", bool(torch.all(tensor == 3.0)), f"first {tensor[0].item()}")
    shim = shim_api()
    if args.expect_shim == "yes":
        stats = read_shim(shim)
        cat = stats.categories
        checks.add("nccl bytes in the nccl category", cat[NCCL].current_bytes > 0,
                   f"nccl {cat[NCCL].current_bytes} B in {cat[NCCL].live_allocations} allocations")
        checks.equal("no unknown / unknown-JIT / user bytes",
                     (cat[UNKNOWN].current_bytes, cat[JIT].current_bytes, cat[USER].current_bytes),
                     (0, 0, 0))
        checks.equal("unwrapped_lookups", stats.unwrapped_lookups, 0)
        vramledger = None
        if args.expect_allocator == "vramledger":
            import vramledger
        cudart = find_cudart()
        nvml = Nvml(cudart, rank)
        # NVML is per device; the shim is per process: this child uses its own device only.
        accounting_checks(torch, vramledger, shim, nvml, checks, figures, f"rank {rank}",
                          args.expect_allocator, True, stats, device=rank)
        figures["shim"] = shim_dict(stats)
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"ok": checks.ok, "checks": checks.items, "figures": figures}),
          flush=True)
    return 0 if checks.ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw-lib", required=True, help="libraw_alloc.so (raw_alloc.c)")
    parser.add_argument("--expect-allocator", choices=("vramledger", "native"), required=True)
    parser.add_argument("--expect-shim", choices=("yes", "no"), required=True)
    parser.add_argument("--expect-torch-install", choices=("yes", "no"), default="no",
                        help="the shim installed vramledger (VRAMLEDGER_PRELOAD_INSTALL_TORCH=1)")
    parser.add_argument("--nccl-ranks", type=int, choices=(1, 2), default=1,
                        help="2: also NCCL world size 2 in two child processes (needs 2 GPUs)")
    parser.add_argument("--child-timeout", type=int, default=90)
    parser.add_argument("--expect-route", choices=("yes", "no"), default="no",
                        help="VRAMLEDGER_PRELOAD_ROUTE=1 is set: raw allocations are routed")
    parser.add_argument("--nccl-child-rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--nccl-child-init", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.nccl_child_rank is not None:
        return nccl_child(args)

    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("skipped: no GPU (torch.cuda.is_available() is False)")
        print("RESULT " + json.dumps({"ok": True, "skipped": "no GPU"}))
        return 0
    started = time.monotonic()
    checks, figures, notes = Checks(), {}, []
    expect_shim = args.expect_shim == "yes"
    shim = shim_api()
    checks.equal("shim loaded", shim is not None, expect_shim)
    if expect_shim and shim is None:
        print("RESULT " + json.dumps({"ok": False, "checks": checks.items}))
        return 1
    vramledger = None
    if args.expect_allocator == "vramledger":
        import vramledger
    if expect_shim:
        checks.equal("shim torch_install state", read_shim(shim).torch_install,
                     1 if args.expect_torch_install == "yes" else 0)

    torch.cuda.init()
    torch.cuda.set_device(0)
    with tempfile.TemporaryDirectory() as scratch:
        outputs = library_workload(torch, dist, os.path.join(scratch, "nccl-init"), notes)
        figures["torch_after_workload"] = torch_figures(torch)
        if vramledger is not None:
            checks.add("vramledger is torch's allocator", vramledger.is_installed(), "")
            ours = vramledger.stats(0)
            checks.equal("torch.cuda.memory_stats answers with vramledger's numbers",
                         (torch.cuda.memory_stats(0)["allocated_bytes.all.current"],
                          torch.cuda.memory_reserved(0)),
                         (ours["allocated_bytes"]["all"]["current"],
                          ours["reserved_bytes"]["all"]["current"]))
        raw = RawLibraries(args.raw_lib)
        cudart = raw.cudart
        nvml = Nvml(cudart, 0)
        figures["nvml_bus_id"] = nvml.bus_id
        accounting_checks(torch, vramledger, shim, nvml, checks, figures, "after libraries",
                          args.expect_allocator, expect_shim)

        def while_live(stats):
            accounting_checks(torch, vramledger, shim, nvml, checks, figures, "raw memory live",
                              args.expect_allocator, expect_shim, stats)

        raw_phase(raw, shim, nvml, checks, figures, expect_shim, while_live,
                  expect_route=args.expect_route == "yes")
        if expect_shim:
            stats = read_shim(shim)
            cat = stats.categories
            figures["shim"] = shim_dict(stats)
            checks.equal("check 1: unwrapped_lookups", stats.unwrapped_lookups, 0)
            checks.equal("table overflow", stats.table_overflow, 0)
            checks.add("nccl bytes in the nccl category", cat[NCCL].current_bytes > 0,
                       f"{cat[NCCL].current_bytes} B live in {cat[NCCL].live_allocations} "
                       f"allocations ({cat[NCCL].allocations} made)")
            checks.equal("every live byte attributed to a named library (unknown, unknown/JIT, "
                         "user)", (cat[UNKNOWN].current_bytes, cat[JIT].current_bytes,
                                   cat[USER].current_bytes), (0, 0, 0))
            if vramledger is not None:
                reserved = sum(s["reserved_bytes"]["all"]["current"] for s in vramledger.all_stats())
                checks.equal("vramledger category = vramledger's reserved bytes",
                             cat[VRAMLEDGER].current_bytes, reserved)
                checks.equal("torch category empty (torch allocates through vramledger)",
                             cat[TORCH].current_bytes, 0)
            else:
                checks.equal("torch category = torch.cuda.memory_reserved()",
                             cat[TORCH].current_bytes, torch.cuda.memory_reserved(0))
                checks.equal("vramledger category empty (vramledger not installed)",
                             cat[VRAMLEDGER].current_bytes, 0)
            figures["cublas_cudnn_triton_bytes"] = {
                "cublas": cat[CUBLAS].current_bytes, "cudnn": cat[CUDNN].current_bytes,
                "triton": cat[TRITON].current_bytes}
            overhead_ns = ctypes.CDLL(None).vramledger_preload_overhead_ns
            overhead_ns.restype = ctypes.c_uint64
            figures["shim_bookkeeping_ns_total"] = overhead_ns()
        figures["torch_final"] = torch_figures(torch)
        digest = tensor_digest(outputs)
        if args.nccl_ranks == 2:
            if torch.cuda.device_count() >= 2:
                nccl_two_ranks(args, checks, figures)
            else:
                notes.append("NCCL 2 ranks skipped: only one GPU")
        dist.destroy_process_group()
    figures["wall_s"] = round(time.monotonic() - started, 2)
    print("RESULT " + json.dumps({"ok": checks.ok, "checks": checks.items,
                                  "outputs_sha256": digest,
                                  "torch_figures": figures["torch_after_workload"],
                                  "figures": figures, "notes": notes}), flush=True)
    return 0 if checks.ok else 1


if __name__ == "__main__":
    sys.exit(main())

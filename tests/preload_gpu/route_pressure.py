#!/usr/bin/env python3
"""H200 check 8 of docs/preload.md: in routing mode, memory idle in one vramledger cache serves the
other before either reports out of memory.

    LD_PRELOAD=libvramledger_preload.so VRAMLEDGER_PRELOAD_ROUTE=1 \\
    VRAMLEDGER_PRELOAD_INSTALL_TORCH=1 VRAMLEDGER_TORCH_PLUGIN=.../libvramledger_torch.so \\
        python route_pressure.py --raw-lib libraw_alloc.so

With routing on, memory a library frees stays in the routed cache, and memory torch frees stays
in torch's cache; without cross-release each would block the other and a program that fits
without vramledger would fail with out of memory. Sequence, with X = 70% of the free memory:
a routed cudaMalloc(X) from C, freed (X idle in the routed cache); a torch tensor of X bytes
(torch's first attempt fails, the routed cache gives its idle memory back, the retry succeeds);
the tensor deleted (X idle in torch's cache); a routed cudaMalloc(X) again (the routed cache
fails, asks torch's allocator to empty its cache, succeeds). Prints one RESULT json line."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mixed_workload import ROUTED_IDLE, read_shim, shim_api  # noqa: E402  (the C struct mirror)

MiB = 1 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw-lib", required=True)
    parser.add_argument("--fraction", type=float, default=0.7)
    args = parser.parse_args()

    import torch

    checks = []

    def check(name, ok, detail=""):
        checks.append({"name": name, "ok": bool(ok), "detail": str(detail)})

    if not torch.cuda.is_available():
        print("RESULT " + json.dumps({"ok": True, "skipped": "no GPU"}))
        return 0
    shim = shim_api()
    if shim is None or read_shim(shim).route_state != 1:
        print("RESULT " + json.dumps({"ok": False, "error": "needs the shim with routing on"}))
        return 1
    import vramledger

    check("vramledger is torch's allocator", vramledger.is_installed())
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")
    raw = ctypes.CDLL(args.raw_lib)
    raw.raw_cuda_malloc.restype = ctypes.c_int
    raw.raw_cuda_free.restype = ctypes.c_int
    raw.raw_cuda_free.argtypes = [ctypes.c_uint64]
    if raw.raw_init(0) != 0:
        print("RESULT " + json.dumps({"ok": False, "error": "raw_init failed"}))
        return 1

    free, total = torch.cuda.mem_get_info(0)
    size = int(free * args.fraction) // (2 * MiB) * (2 * MiB)
    figures = {"free_at_start": free, "total": total, "x_bytes": size}

    # 1. Routed, freed: idle in the routed cache.
    pointer = ctypes.c_uint64()
    status = raw.raw_cuda_malloc(ctypes.c_size_t(size), ctypes.byref(pointer))
    check("routed cudaMalloc(X)", status == 0, f"status {status}")
    before = read_shim(shim)
    check("served by the routed cache", before.routed_live_bytes >= size,
          f"routed live {before.routed_live_bytes}")
    status = raw.raw_cuda_free(pointer.value)
    check("routed cudaFree", status == 0, f"status {status}")
    idle = read_shim(shim).categories[ROUTED_IDLE].current_bytes
    check("X idle in the routed cache", idle >= size, f"idle {idle}")
    figures["device_free_with_routed_idle"] = torch.cuda.mem_get_info(0)[0]

    # 2. torch needs it: the routed cache gives it back.
    try:
        tensor = torch.empty(size, dtype=torch.uint8, device="cuda")
        tensor.fill_(7)
        torch.cuda.synchronize()
        check("torch tensor of X bytes (routed idle memory given back)", True)
    except torch.cuda.OutOfMemoryError as error:
        tensor = None
        check("torch tensor of X bytes (routed idle memory given back)", False,
              str(error).splitlines()[0])
    after_torch = read_shim(shim)
    idle = after_torch.categories[ROUTED_IDLE].current_bytes
    check("routed cache idle below X after the release", idle < size, f"idle {idle}")
    figures["routed_reserved_after_torch"] = after_torch.routed_reserved_bytes
    del tensor
    reserved = torch.cuda.memory_reserved(0)
    check("X idle in torch's cache", reserved >= size, f"reserved {reserved}")

    # 3. The routed cache needs it: torch's allocator empties its cache.
    status = raw.raw_cuda_malloc(ctypes.c_size_t(size), ctypes.byref(pointer))
    check("routed cudaMalloc(X) again (torch's idle memory given back)", status == 0,
          f"status {status}")
    reserved = torch.cuda.memory_reserved(0)
    check("torch's cache emptied", reserved < size, f"reserved {reserved}")
    if status == 0:
        check("routed cudaFree again", raw.raw_cuda_free(pointer.value) == 0)
    final = read_shim(shim)
    check("no routed call failed", final.routed_failed == 0, f"failed {final.routed_failed}")
    check("books: routed reserved = live + idle",
          final.routed_reserved_bytes == final.routed_live_bytes
          + final.categories[ROUTED_IDLE].current_bytes,
          f"{final.routed_reserved_bytes} vs {final.routed_live_bytes} + "
          f"{final.categories[ROUTED_IDLE].current_bytes}")
    ok = all(c["ok"] for c in checks)
    print("RESULT " + json.dumps({"ok": ok, "checks": checks, "figures": figures}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

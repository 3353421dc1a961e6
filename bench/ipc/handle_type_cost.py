"""What asking cuMemCreate for an exportable page costs (docs/ipc.md): the VMM backend creates its
physical chunks with requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR so CUDA IPC
can share them. Times cuMemCreate + cuMemRelease of 2 MiB and 64 MiB chunks with no handle type
and with the POSIX one, alternating, plus one cuMemExportToShareableHandle; prints a Markdown
table and one JSON line. Driver API through ctypes (no torch needed); about 5 s on the H200.

    python bench/ipc/handle_type_cost.py [--device 0] [--repeats 200]
"""

import argparse
import ctypes
import json
import os
import statistics
import time

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
HANDLE_NONE = 0
HANDLE_POSIX_FD = 1
MIB = 1 << 20


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", AllocFlags)]


def check(result, what):
    if result != 0:
        raise RuntimeError(f"{what} failed with CUresult {result}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    cuda = ctypes.CDLL("libcuda.so.1")
    check(cuda.cuInit(0), "cuInit")
    device = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(device), args.device), "cuDeviceGet")
    context = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")

    def prop(handle_type):
        p = Prop()
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED
        p.requestedHandleTypes = handle_type
        p.location = Location(CU_MEM_LOCATION_TYPE_DEVICE, device.value)
        return p

    def create_release_us(size, handle_type):
        p = prop(handle_type)
        handle = ctypes.c_ulonglong()
        start = time.perf_counter_ns()
        check(cuda.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(p),
                               ctypes.c_ulonglong(0)), "cuMemCreate")
        check(cuda.cuMemRelease(handle), "cuMemRelease")
        return (time.perf_counter_ns() - start) / 1000

    rows = []
    for size in (2 * MIB, 64 * MIB):
        samples = {HANDLE_NONE: [], HANDLE_POSIX_FD: []}
        for _ in range(args.repeats):  # alternated, so drift hits both alike
            for handle_type in (HANDLE_NONE, HANDLE_POSIX_FD):
                samples[handle_type].append(create_release_us(size, handle_type))
        none, posix = (statistics.median(samples[t]) for t in (HANDLE_NONE, HANDLE_POSIX_FD))
        rows.append({"bytes": size, "none_us": none, "posix_fd_us": posix,
                     "ratio": posix / none if none else None})

    p = prop(HANDLE_POSIX_FD)
    handle = ctypes.c_ulonglong()
    check(cuda.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(2 * MIB), ctypes.byref(p),
                           ctypes.c_ulonglong(0)), "cuMemCreate")
    fd = ctypes.c_int(-1)
    start = time.perf_counter_ns()
    check(cuda.cuMemExportToShareableHandle(ctypes.byref(fd), handle, HANDLE_POSIX_FD,
                                            ctypes.c_ulonglong(0)), "cuMemExportToShareableHandle")
    export_us = (time.perf_counter_ns() - start) / 1000
    os.close(fd.value)
    check(cuda.cuMemRelease(handle), "cuMemRelease")

    print("| chunk | cuMemCreate+cuMemRelease, no handle type (median us) | with POSIX fd (median us) | ratio |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['bytes'] // MIB} MiB | {row['none_us']:.1f} | {row['posix_fd_us']:.1f} | "
              f"{row['ratio']:.2f} |")
    print(f"\ncuMemExportToShareableHandle (2 MiB, POSIX fd): {export_us:.1f} us")
    print(json.dumps({"repeats": args.repeats, "rows": rows, "export_us": export_us}))


if __name__ == "__main__":
    main()

"""vramledger's native functions (the _C extension's interface) over fake_gpu.Device: stats and
the process report in the shapes the plugin gives them (docs/report_schema.md)."""

from __future__ import annotations

import json

import fake_gpu


def install(conf: str = "") -> None:
    fake_gpu.device()


def is_installed() -> bool:
    return True


def _stats() -> dict:
    d = fake_gpu.device()

    def pooled(current: int, peak: int) -> dict:
        stat = {"current": current, "peak": peak, "allocated": 0, "freed": 0}
        return {"all": stat, "small_pool": dict(stat), "large_pool": dict(stat)}

    return {"device": 0, "backend": "fake", "total_bytes": fake_gpu.CAPACITY,
            "allocated_bytes": pooled(d.allocated, d.peak_allocated),
            "reserved_bytes": pooled(d.reserved, d.peak_reserved),
            "requested_bytes": pooled(d.allocated, d.peak_allocated),
            "num_ooms": d.num_ooms, "num_alloc_retries": 0, "tags": {},
            "fragmentation": {"gmlake_ratio": 0.0, "overhead_ratio": 1.0}}


def stats_json(device: int) -> str:
    if device == -1:
        return json.dumps([_stats()] if fake_gpu.device().used else [])
    return json.dumps(_stats())


def report() -> str:
    return "fake"


def process_report(device: int, format: str = "text") -> str:
    d = fake_gpu.device()
    usage = d.usage()
    torch_lines = {"requested": d.allocated, "rounding": 0, "pending_frees": 0,
                   "cached_usable": d.reserved - d.allocated, "fragmentation": 0,
                   "unmapped_physical": 0, "reserved": d.reserved}
    remainder = usage - d.reserved
    lines = [{"kind": "torch", "name": name, "bytes": value}
             for name, value in torch_lines.items() if name != "reserved"]
    lines.append({"kind": "remainder", "name": "context", "bytes": remainder})
    used = fake_gpu.all_usage() + fake_gpu.UNATTRIBUTED
    return json.dumps({
        "schema": "vramledger.process_report", "schema_version": 1, "device": 0,
        "basis": "nvml_per_process", "process_memory_source": "nvml", "allocators": 1,
        "lines": lines, "torch": torch_lines,
        "non_torch": {"hooked": False, "source": "fake", "by_library": {}, "tracked_total": 0},
        "remainder": {"label": "context, modules, driver", "bytes": remainder},
        "process_usage_bytes": usage, "sum_bytes": usage, "non_torch_bytes": remainder,
        "other_processes_bytes": used - usage, "device_used_bytes": used,
        "device_total_bytes": fake_gpu.NVML_TOTAL, "all_lines_non_negative": True,
        "trustworthy": True, "missing_hook": None, "problems": [], "notes": [], "caveat": None})


def empty_cache() -> None:
    d = fake_gpu.device()
    d.reserved = -(-d.allocated // fake_gpu.PAGE) * fake_gpu.PAGE


def reset_peak_stats(device: int) -> None:
    fake_gpu.device().reset_peaks()


def reset_accumulated_stats(device: int) -> None:
    pass


def tag_push(name: str) -> None:
    pass


def tag_pop() -> None:
    pass


def set_oom_note(device: int, text: str) -> None:
    fake_gpu.device().note = text

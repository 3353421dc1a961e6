"""The cluster report's document (docs/report_schema.md, "Cluster report"): one entry per rank,
one per device inside it, built from each rank's own books (stats, process report, the board
publisher's samples). Pure functions of those inputs, so CPU tests feed them made-up but
well-shaped figures and check the same code the GPU path runs.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Dict, List, Optional

SCHEMA = "vramledger.cluster_report"
SCHEMA_VERSION = 1
TORCH_LINES = ("requested", "rounding", "pending_frees", "cached_usable", "fragmentation",
               "unmapped_physical")


def _stat(stats: Dict[str, Any], key: str, which: str) -> int:
    return int(stats[key]["all"][which])


def device_entry(stats: Dict[str, Any], report: Optional[Dict[str, Any]],
                 timeline: Optional[List[List[int]]] = None) -> Dict[str, Any]:
    """One device of one rank: `stats` as vramledger.stats() returns it, `report` the process
    report's JSON (None where it could not be taken: then only torch's figures are known)."""
    entry: Dict[str, Any] = {
        "device": int(stats["device"]),
        "torch_allocated_bytes": _stat(stats, "allocated_bytes", "current"),
        "torch_reserved_bytes": _stat(stats, "reserved_bytes", "current"),
        "peak_allocated_bytes": _stat(stats, "allocated_bytes", "peak"),
        "peak_reserved_bytes": _stat(stats, "reserved_bytes", "peak"),
        "num_ooms": int(stats.get("num_ooms", 0)),
        "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
        "fragmentation": dict(stats.get("fragmentation") or {}),
        "basis": None, "process_usage_bytes": None, "device_total_bytes": None,
        "lines": None, "non_torch_by_library": {}, "remainder_label": None,
        "timeline": [list(map(int, sample)) for sample in (timeline or [])],
    }
    if report is not None:
        # Non-torch lines as the report lists them (they sum to the usage with the rest; with
        # several devices it leaves the libraries out and its remainder holds them).
        lines = {name: int(report["torch"][name]) for name in TORCH_LINES}
        libraries = {line["name"].replace("non-torch: ", "", 1): int(line["bytes"])
                     for line in report["lines"] if line["kind"] == "non_torch"}
        lines["non_torch_tracked"] = sum(libraries.values())
        lines["remainder"] = sum(int(line["bytes"]) for line in report["lines"]
                                 if line["kind"] == "remainder")
        entry.update({
            "basis": report["basis"],
            "process_usage_bytes": int(report["process_usage_bytes"]),
            "device_total_bytes": int(report["device_total_bytes"]),
            "lines": lines,
            "non_torch_by_library": libraries,
            "remainder_label": report["remainder"]["label"],
        })
    return entry


def rank_document(rank: int, world_size: int, devices: List[Dict[str, Any]],
                  error: Optional[str] = None) -> Dict[str, Any]:
    return {"rank": int(rank), "world_size": int(world_size), "host": socket.gethostname(),
            "pid": os.getpid(), "devices": devices, "error": error}


def local_rank_document(rank: int, world_size: int) -> Dict[str, Any]:
    """This process's document from vramledger: every device it used. Errors are carried in the
    document (one rank failing must not hang the others inside the collective)."""
    try:
        import json

        from .. import process_report, stats, used_devices
        from ..board.publisher import timeline

        devices = []
        for device in used_devices():
            try:
                report = json.loads(process_report(device, format="json"))
            except Exception:  # no NVML, odd device: torch's figures still count
                report = None
            devices.append(device_entry(stats(device), report, timeline(device)))
        return rank_document(rank, world_size, devices)
    except Exception as error:
        return rank_document(rank, world_size, [], f"{type(error).__name__}: {error}")


def assemble(ranks: List[Dict[str, Any]], backend: str) -> Dict[str, Any]:
    """The cluster document from every rank's document."""
    ranks = sorted(ranks, key=lambda entry: entry["rank"])
    totals = {"process_usage_bytes": 0, "torch_reserved_bytes": 0, "num_ooms": 0,
              "ranks_with_errors": 0}
    highest: Optional[Dict[str, Any]] = None
    for entry in ranks:
        totals["ranks_with_errors"] += 1 if entry.get("error") else 0
        for device in entry["devices"]:
            totals["process_usage_bytes"] += device["process_usage_bytes"] or 0
            totals["torch_reserved_bytes"] += device["torch_reserved_bytes"]
            totals["num_ooms"] += device["num_ooms"]
            if highest is None or device["peak_reserved_bytes"] > highest["peak_reserved_bytes"]:
                highest = {"rank": entry["rank"], "device": device["device"],
                           "peak_reserved_bytes": device["peak_reserved_bytes"]}
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "generator": "vramledger",
            "backend": backend, "world_size": len(ranks), "time_ns": time.time_ns(),
            "ranks": ranks, "totals": totals, "highest_peak": highest}

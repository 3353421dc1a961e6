"""Prometheus text exposition (format 0.0.4) of a cluster document, or of one rank's: every
sample labelled by `rank` and `device` (and `host`), so one scrape configuration covers a job
(docs/examples/prometheus_cluster_scrape.yml). Family names start with vramledger_rank_, apart
from the per-process families of accounting/reports (vramledger_<counter>{device,pool}).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

# (family, type, help, value of a device entry or None to leave the sample out)
_FAMILIES = (
    ("vramledger_rank_process_usage_bytes", "gauge",
     "Process usage on the device (NVML per-process, or the device-used fallback; see basis)",
     lambda d: d["process_usage_bytes"]),
    ("vramledger_rank_torch_reserved_bytes", "gauge", "Torch reserved bytes (vramledger)",
     lambda d: d["torch_reserved_bytes"]),
    ("vramledger_rank_torch_allocated_bytes", "gauge", "Torch allocated bytes (vramledger)",
     lambda d: d["torch_allocated_bytes"]),
    ("vramledger_rank_peak_reserved_bytes", "gauge", "Peak torch reserved bytes",
     lambda d: d["peak_reserved_bytes"]),
    ("vramledger_rank_peak_allocated_bytes", "gauge", "Peak torch allocated bytes",
     lambda d: d["peak_allocated_bytes"]),
    ("vramledger_rank_ooms_total", "counter", "Out-of-memory errors raised",
     lambda d: d["num_ooms"]),
    ("vramledger_rank_alloc_retries_total", "counter", "Allocations retried after freeing cache",
     lambda d: d["num_alloc_retries"]),
    ("vramledger_rank_fragmentation_gmlake_ratio", "gauge",
     "1 - peak active / peak reserved (left out while peak reserved is 0)",
     lambda d: d["fragmentation"].get("gmlake_ratio")),
    ("vramledger_rank_overhead_ratio", "gauge",
     "Peak reserved / peak requested (left out while peak requested is 0)",
     lambda d: d["fragmentation"].get("overhead_ratio")),
)


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: List[Tuple[str, Any]]) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in pairs) + "}"


def _number(value: Any) -> str:
    """Integers exactly (byte counts exceed a double's 2^53 only past 8 PiB, but never round)."""
    return str(int(value)) if isinstance(value, int) else repr(float(value))


def to_prometheus(document: Dict[str, Any]) -> str:
    """The exposition of a cluster document (assemble()) or a single rank document."""
    ranks = document["ranks"] if "ranks" in document else [document]
    out: List[str] = []

    def family(name: str, kind: str, text: str, samples: List[Tuple[str, Any]]) -> None:
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)

    def base(rank: Dict[str, Any], device: Dict[str, Any]) -> List[Tuple[str, Any]]:
        return [("rank", rank["rank"]), ("device", device["device"]), ("host", rank["host"])]

    for name, kind, text, value_of in _FAMILIES:
        samples = []
        for rank in ranks:
            for device in rank["devices"]:
                value = value_of(device)
                if value is not None:
                    samples.append((_labels(base(rank, device)), value))
        family(name, kind, text, samples)
    lines, libraries = [], []
    for rank in ranks:
        for device in rank["devices"]:
            for line, value in (device["lines"] or {}).items():
                lines.append((_labels(base(rank, device) + [("line", line)]), value))
            for library, value in device["non_torch_by_library"].items():
                libraries.append((_labels(base(rank, device) + [("library", library)]), value))
    family("vramledger_rank_line_bytes", "gauge",
           "The additive lines of the process report; sum by (rank, device) = process usage",
           lines)
    family("vramledger_rank_non_torch_library_bytes", "gauge",
           "Non-torch bytes by library (LD_PRELOAD shim)", libraries)
    family("vramledger_rank_up", "gauge", "1 when the rank's books could be read, else 0",
           [(_labels([("rank", rank["rank"]), ("host", rank["host"])]),
             0 if rank.get("error") else 1) for rank in ranks])
    return "\n".join(out) + "\n"

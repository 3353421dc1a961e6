#!/usr/bin/env python3
"""Converts a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot pickle, or the dict
from torch.cuda.memory._snapshot()) into a vramledger workload trace.

    python3 bench/traces/torch_snapshot_to_workload.py snapshot.pickle out.vlt.gz [--device 0]

The format is described in docs/workload_trace_format.md. Only the requests the program made
are kept (alloc, free, and the completion of frees delayed by other streams); what PyTorch's
allocator did with segments is summarised in the header so a replay can be compared with it.
Needs only the standard library (the pickle holds plain dicts and lists).
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload_writer import FORMAT_LINE, write_trace  # noqa: E402,F401


class SnapshotError(ValueError):
    pass


def _pick_device_trace(snapshot: dict, device: int | None) -> tuple[int, list]:
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or not traces:
        raise SnapshotError("snapshot has no 'device_traces': record it with "
                            "torch.cuda.memory._record_memory_history() enabled")
    if device is None:
        device = max(range(len(traces)), key=lambda d: len(traces[d] or []))
    if device >= len(traces):
        raise SnapshotError(f"snapshot has traces for {len(traces)} device(s), not device {device}")
    return device, traces[device] or []


def convert(snapshot: dict, device: int | None = None) -> tuple[list[str], dict]:
    """Returns the trace lines (without header) and a summary of what the trace holds."""
    device, entries = _pick_device_trace(snapshot, device)
    lines: list[str] = []
    streams: dict[int, int] = {}
    live: dict[int, tuple[int, int]] = {}      # address -> (id, size) of allocated blocks
    pending: dict[int, tuple[int, int]] = {}   # address -> (id, size) freed, awaiting completion
    next_id = 0
    requested = peak_requested = 0
    segments = peak_segments = 0
    skipped = 0
    allocs = 0
    for index, entry in enumerate(entries):
        action = entry.get("action")
        addr = entry.get("addr")
        size = int(entry.get("size", 0))
        if action == "alloc":
            stream = int(entry.get("stream", 0))
            if stream not in streams:
                streams[stream] = len(streams)
                lines.append(f"s {streams[stream]} {stream}")
            live[addr] = (next_id, size)
            lines.append(f"a {next_id} {size} {streams[stream]}")
            next_id += 1
            allocs += 1
            requested += size
            peak_requested = max(peak_requested, requested)
        elif action == "free_requested":
            if addr not in live:
                skipped += 1  # allocated before recording started
                continue
            block_id, block_size = live.pop(addr)
            following = entries[index + 1] if index + 1 < len(entries) else None
            completes_now = (following is not None and following.get("action") == "free_completed"
                             and following.get("addr") == addr)
            if completes_now:
                lines.append(f"f {block_id}")
            else:
                lines.append(f"r {block_id}")
                pending[addr] = (block_id, block_size)
        elif action == "free_completed":
            if addr in pending:
                block_id, block_size = pending.pop(addr)
                lines.append(f"c {block_id}")
                requested -= block_size
            else:
                # Completion right after its request (already written as 'f'), or unknown.
                requested -= _completed_size(entries, index)
        elif action in ("segment_alloc", "segment_map"):
            segments += size
            peak_segments = max(peak_segments, segments)
        elif action in ("segment_free", "segment_unmap"):
            segments -= size
    summary = {
        "device": device,
        "events": len(lines),
        "allocations": allocs,
        "streams": len(streams),
        "peak_requested_bytes": peak_requested,
        "torch_peak_segment_bytes": peak_segments,
        "skipped_frees": skipped,
        "still_live": len(live) + len(pending),
    }
    return lines, summary


def _completed_size(entries: list, index: int) -> int:
    """Size of the block whose completion is entries[index]: its free request precedes it."""
    previous = entries[index - 1] if index > 0 else None
    if (previous is not None and previous.get("action") == "free_requested"
            and previous.get("addr") == entries[index].get("addr")):
        return int(previous.get("size", 0))
    return 0


def write_workload(snapshot: dict, path: Path, source: str, torch_figures: dict | None = None,
                   device: int | None = None) -> dict:
    lines, summary = convert(snapshot, device)
    metadata: list[tuple[str, object]] = [("source", source), *summary.items()]
    for key in ("peak_reserved_bytes", "peak_requested_bytes", "alloc_conf", "gpu"):
        if torch_figures and key in torch_figures:
            metadata.append((f"torch_{key}", torch_figures[key]))
    write_trace(path, lines, metadata)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--device", type=int, default=None)
    args = parser.parse_args()
    try:
        with open(args.snapshot, "rb") as f:
            snapshot = pickle.load(f)
        summary = write_workload(snapshot, args.output, source=str(args.snapshot),
                                 device=args.device)
    except (OSError, pickle.UnpicklingError, EOFError, SnapshotError) as error:
        print(f"error: {args.snapshot}: {error}", file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

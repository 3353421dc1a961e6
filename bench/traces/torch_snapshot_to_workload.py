#!/usr/bin/env python3
"""Converts a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot pickle, or the dict
from torch.cuda.memory._snapshot()) into a vramledger workload trace.

    python3 bench/traces/torch_snapshot_to_workload.py snapshot.pickle out.vlt.gz [--device 0]

The format is described in docs/workload_trace_format.md. Only the requests the program made
are kept (alloc, free, and the completion of frees delayed by other streams); what PyTorch's
allocator did with segments is summarised in the header so a replay can be compared with it.
Needs only the standard library (the pickle holds plain dicts and lists).

A pickle can run any code while it loads. Snapshots hold only dicts, lists, tuples, strings,
numbers, booleans and None, so they are loaded by an unpickler that refuses every class or
function a pickle names (load_snapshot): a crafted file ends in an error, not in its code
running. Loading may map at most 1 GiB + 64 bytes per byte of pickle (a memo index of 2^30 in
a tiny file would otherwise touch gigabytes). Entries of the wrong shape end in an error naming
the entry.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload_writer import FORMAT_LINE, write_trace  # noqa: E402,F401


class SnapshotError(ValueError):
    pass


# The largest request the allocator supports (16 TiB); the C++ trace reader refuses larger sizes.
MAX_ALLOCATION_BYTES = 1 << 44
MAX_HANDLE = (1 << 64) - 1
MAX_STREAMS = 4096  # as the C++ trace reader


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds only the pickle's plain data: any class or function it names is refused, so
    loading cannot import a module or call anything (pickle's REDUCE, BUILD, INST, OBJ and the
    extension registry all go through find_class)."""

    def find_class(self, module, name):
        raise SnapshotError(f"refusing to load {module}.{name}: a memory snapshot holds only "
                            "dicts, lists, strings, numbers, booleans and None (not a snapshot, "
                            "or a crafted file)")

    def persistent_load(self, pid):
        raise SnapshotError("refusing a persistent id: a memory snapshot has none")


# What a malformed pickle can raise while loading, besides our own SnapshotError.
_LOAD_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
                AttributeError, OverflowError, MemoryError, RecursionError, struct.error)


# Memory a snapshot may take once loaded, per byte of pickle (dicts and lists take ~10x their
# pickle), plus a fixed allowance.
_MEMORY_PER_PICKLE_BYTE = 64
_MEMORY_ALLOWANCE = 1 << 30


@contextlib.contextmanager
def _address_space_bounded_by(extra_bytes: int):
    """While inside, the process may map at most `extra_bytes` more (RLIMIT_AS). The C
    unpickler sizes its memo by the indices a pickle names: a few bytes asking for index 2^30
    would otherwise touch gigabytes. Where the limit cannot be set, nothing is bounded."""
    try:
        import resource
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        yield
        return
    limit = mapped + extra_bytes
    if soft != resource.RLIM_INFINITY and soft <= limit:
        yield  # already tighter
        return
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def loads_snapshot(data: bytes) -> dict:
    """The snapshot in `data`, loaded without running anything it names, and with memory bounded
    by its size."""
    budget = _MEMORY_ALLOWANCE + _MEMORY_PER_PICKLE_BYTE * len(data)
    try:
        with _address_space_bounded_by(budget):
            snapshot = _PlainDataUnpickler(io.BytesIO(data)).load()
    except SnapshotError:
        raise
    except MemoryError:
        raise SnapshotError(f"loading needs more than {budget} bytes of memory for a pickle of "
                            f"{len(data)} bytes: not a snapshot (a crafted file?)") from None
    except _LOAD_ERRORS as error:
        raise SnapshotError(f"not a readable pickle: {type(error).__name__}: {error}") from None
    if not isinstance(snapshot, dict):
        raise SnapshotError(f"not a memory snapshot: the pickle holds a {type(snapshot).__name__}, "
                            "not a dict")
    return snapshot


def load_snapshot(path: Path) -> dict:
    with open(path, "rb") as f:
        return loads_snapshot(f.read())


def _whole(entry: dict, key: str, where: str, default=None, low: int = 0,
           high: int = MAX_HANDLE) -> int:
    """entry[key] as an int in [low, high] (bools are not numbers here)."""
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SnapshotError(f"{where}: '{key}' is {value!r}, expected a whole number from {low} "
                            f"to {high}")
    return value


def _pick_device_trace(snapshot: dict, device: int | None) -> tuple[int, list]:
    if not isinstance(snapshot, dict):
        raise SnapshotError(f"not a memory snapshot: a {type(snapshot).__name__}, not a dict")
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or not traces:
        raise SnapshotError("snapshot has no 'device_traces': record it with "
                            "torch.cuda.memory._record_memory_history() enabled")
    for index, trace in enumerate(traces):
        if trace is not None and not isinstance(trace, list):
            raise SnapshotError(f"device_traces[{index}] is a {type(trace).__name__}, "
                                "expected a list of events")
    if device is None:
        device = max(range(len(traces)), key=lambda d: len(traces[d] or []))
    if not 0 <= device < len(traces):
        raise SnapshotError(f"snapshot has traces for {len(traces)} device(s), not device {device}")
    return device, traces[device] or []


_ACTIONS_READ = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_map",
                 "segment_free", "segment_unmap")


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
        where = f"device_traces[{device}][{index}]"
        if not isinstance(entry, dict):
            raise SnapshotError(f"{where} is a {type(entry).__name__}, expected a dict")
        action = entry.get("action")
        if not isinstance(action, str):
            raise SnapshotError(f"{where}: 'action' is {action!r}, expected a string")
        if action not in _ACTIONS_READ:
            continue  # e.g. 'snapshot', 'oom': nothing the program asked for
        addr = _whole(entry, "addr", where)
        size = _whole(entry, "size", where, default=0)
        if action == "alloc":
            stream = _whole(entry, "stream", where, default=0)
            if not 0 < size <= MAX_ALLOCATION_BYTES:
                raise SnapshotError(f"{where}: allocation of {size} bytes (expected 1 to "
                                    f"{MAX_ALLOCATION_BYTES})")
            if stream not in streams:
                if len(streams) == MAX_STREAMS:
                    raise SnapshotError(f"{where}: more than {MAX_STREAMS} streams")
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
            completes_now = (isinstance(following, dict)
                             and following.get("action") == "free_completed"
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
    if (isinstance(previous, dict) and previous.get("action") == "free_requested"
            and previous.get("addr") == entries[index].get("addr")):
        return _whole(previous, "size", f"entry {index - 1}", default=0)
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
        snapshot = load_snapshot(args.snapshot)
        summary = write_workload(snapshot, args.output, source=str(args.snapshot),
                                 device=args.device)
    except (OSError, SnapshotError) as error:
        print(f"error: {args.snapshot}: {error}", file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Converts an RMM replay log (the CSV written by rmm::mr::logging_resource_adaptor, columns
Thread,Time,Action,Pointer,Size,Stream) into a vramledger workload trace
(docs/workload_trace_format.md).

    python3 bench/traces/rmm_log_to_workload.py rmm_log.csv out.vlt.gz

"allocate failure" rows are skipped and counted. A free of a pointer that is not live, a
malformed row, an unknown action, bytes that are not UTF-8 text (or NUL bytes) and sizes or
streams the trace format cannot hold are errors naming the line. Only the standard library.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload_writer import FORMAT_LINE, write_trace  # noqa: E402,F401
REQUIRED = ("Action", "Pointer", "Size", "Stream")
MAX_ALLOCATION_BYTES = 1 << 44  # the allocator's largest request; the C++ reader refuses more
MAX_HANDLE = (1 << 64) - 1
MAX_STREAMS = 4096              # as the C++ trace reader


class RmmLogError(ValueError):
    pass


def _number(text: str, what: str, line: int) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise RmmLogError(f"line {line}: bad {what} {text!r}") from None


def decoded_lines(binary):
    """Lines of a file opened in binary mode, decoded one by one so that a byte that is not UTF-8
    is reported with its line (a text-mode file decodes whole blocks ahead of the CSV reader)."""
    for number, raw in enumerate(binary, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise RmmLogError(f"line {number}: not UTF-8 text ({error.reason} at byte "
                              f"{error.start})") from None


def _rows(reader: csv.DictReader):
    """The reader's rows; undecodable bytes and CSV syntax errors become RmmLogError."""
    iterator = iter(reader)
    while True:
        try:
            row = next(iterator)
        except StopIteration:
            return
        except UnicodeDecodeError as error:
            raise RmmLogError(f"line {reader.line_num + 1}: not UTF-8 text ({error.reason} at "
                              f"byte {error.start} of a read block)") from None
        except csv.Error as error:
            raise RmmLogError(f"line {reader.line_num + 1}: not CSV: {error}") from None
        yield row


def convert(rows, source: str = "rmm log") -> tuple[list[str], dict]:
    """rows: an iterable of lines of the CSV (header first). Returns trace lines and a summary."""
    reader = csv.DictReader(rows)
    try:
        fieldnames = reader.fieldnames
    except UnicodeDecodeError as error:
        raise RmmLogError(f"line 1: not UTF-8 text ({error.reason})") from None
    except csv.Error as error:
        raise RmmLogError(f"line 1: not CSV: {error}") from None
    if fieldnames is None:
        raise RmmLogError("empty input")
    missing = [name for name in REQUIRED if name not in fieldnames]
    if missing:
        raise RmmLogError(f"line 1: not an RMM log, missing column(s) {', '.join(missing)}")
    lines: list[str] = []
    streams: dict[int, int] = {}
    live: dict[int, tuple[int, int]] = {}
    next_id = 0
    requested = peak = failures = 0
    for row in _rows(reader):
        line = reader.line_num
        action = (row.get("Action") or "").strip().lower()
        if action == "allocate failure":
            failures += 1
            continue
        pointer = _number((row.get("Pointer") or "").strip(), "pointer", line)
        size = _number((row.get("Size") or "").strip(), "size", line)
        stream = _number((row.get("Stream") or "0").strip(), "stream", line)
        if not 0 <= stream <= MAX_HANDLE:
            raise RmmLogError(f"line {line}: stream {stream} is not a 64-bit handle")
        if action == "allocate":
            if not 0 < size <= MAX_ALLOCATION_BYTES:
                raise RmmLogError(f"line {line}: allocation of size {size} (expected 1 to "
                                  f"{MAX_ALLOCATION_BYTES})")
            if pointer in live:
                raise RmmLogError(f"line {line}: pointer {pointer:#x} allocated twice")
            if stream not in streams:
                if len(streams) == MAX_STREAMS:
                    raise RmmLogError(f"line {line}: more than {MAX_STREAMS} streams")
                streams[stream] = len(streams)
                lines.append(f"s {streams[stream]} {stream}")
            live[pointer] = (next_id, size)
            lines.append(f"a {next_id} {size} {streams[stream]}")
            next_id += 1
            requested += size
            peak = max(peak, requested)
        elif action == "free":
            if pointer not in live:
                raise RmmLogError(f"line {line}: free of {pointer:#x}, which is not live")
            block_id, block_size = live.pop(pointer)
            lines.append(f"f {block_id}")
            requested -= block_size
        else:
            raise RmmLogError(f"line {line}: unknown action {row.get('Action')!r}")
    summary = {"allocations": next_id, "streams": len(streams), "peak_requested_bytes": peak,
               "allocation_failures_skipped": failures, "still_live": len(live),
               "source": source}
    return lines, summary


def write_workload(rows, path: Path, source: str) -> dict:
    lines, summary = convert(rows, source)
    write_trace(path, lines, list(summary.items()))
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path)
    parser.add_argument("output", type=Path)
    args = parser.parse_args()
    try:
        with open(args.log, "rb") as binary:
            summary = write_workload(decoded_lines(binary), args.output, str(args.log))
    except (OSError, RmmLogError) as error:
        print(f"error: {args.log}: {error}", file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Writes a vramledger workload trace (docs/workload_trace_format.md): the format line, metadata
comments, then the records; gzip-compressed when the path ends in .gz."""

from __future__ import annotations

import gzip
from pathlib import Path

FORMAT_LINE = "# vramledger workload trace v1"


def write_trace(path: Path, records: list[str], metadata: list[tuple[str, object]]) -> None:
    header = [FORMAT_LINE] + [f"# {key}: {value}" for key, value in metadata]
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as out:
        out.write("\n".join(header + records) + "\n")

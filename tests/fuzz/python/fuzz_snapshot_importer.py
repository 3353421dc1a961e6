"""Atheris target: the PyTorch snapshot importer (bench/traces/torch_snapshot_to_workload.py).
Any bytes are loaded with the restricted unpickler and converted; the only exception allowed is
SnapshotError (a clear message), never a traceback, code run from the pickle, or a hang."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import atheris_main  # noqa: E402


def import_target():
    import torch_snapshot_to_workload as importer

    def test_one_input(data: bytes) -> None:
        try:
            lines, _ = importer.convert(importer.loads_snapshot(data))
        except importer.SnapshotError:
            return
        for line in lines:  # what is accepted is a trace: one record a line, printable
            if not line.isprintable() or not line:
                raise AssertionError(f"unprintable record {line!r}")

    return test_one_input


if __name__ == "__main__":
    sys.exit(atheris_main.run(import_target))

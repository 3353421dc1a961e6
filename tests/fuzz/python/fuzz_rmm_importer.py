"""Atheris target: the RMM log importer (bench/traces/rmm_log_to_workload.py). Any bytes are
decoded line by line and converted; the only exception allowed is RmmLogError (a clear message
naming the line), never a traceback."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import atheris_main  # noqa: E402


def import_target():
    import rmm_log_to_workload as importer

    def test_one_input(data: bytes) -> None:
        try:
            lines, _ = importer.convert(importer.decoded_lines(data.splitlines(keepends=True)))
        except importer.RmmLogError:
            return
        for line in lines:
            if not line.isprintable() or not line:
                raise AssertionError(f"unprintable record {line!r}")

    return test_one_input


if __name__ == "__main__":
    sys.exit(atheris_main.run(import_target))

"""The main() of the Python fuzz targets (issue 16): with atheris installed, fuzzes the target
(libFuzzer's flags and corpus folders as arguments, e.g. -max_total_time=5 NEW_DIR SEEDS); without
it, runs every file of the given folders through the target once, so the seeds and every kept
crasher are regression tests wherever Python runs (the role corpus_driver.cpp has for the C++
targets). atheris: pip install atheris (a wheel for CPython 3.11 on x86-64 Linux)."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "traces"))


def run(import_target):
    """import_target() imports the code under test and returns its TestOneInput(bytes)."""
    try:
        import atheris
    except ImportError:
        atheris = None
    if atheris is None:
        test_one_input = import_target()
        folders = [a for a in sys.argv[1:] if not a.startswith("-")]
        count = 0
        for folder in folders:
            for path in sorted(Path(folder).rglob("*")):
                if path.is_file():
                    test_one_input(path.read_bytes())
                    count += 1
        if count == 0:
            print("no inputs found in the given paths", file=sys.stderr)
            return 1
        print(f"atheris not installed: ran {count} inputs once, without a failure")
        return 0
    with atheris.instrument_imports():
        test_one_input = import_target()
    os.makedirs(next((a for a in sys.argv[1:] if not a.startswith("-")), "."), exist_ok=True)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
    return 0

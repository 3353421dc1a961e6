#!/usr/bin/env python3
"""Counts test results across meson build folders and prints the closing line.

Reads BUILD/meson-logs/testlog.json (one JSON object per test run) for each BUILD given and prints
'N passed, N failed, N skipped' on its own line. Exits 1 when anything failed, when a build failed
(--build-failures, counted as failures), or when no test ran at all.
"""
import argparse
import json
import pathlib
import sys

PASSED = {"OK", "EXPECTEDFAIL"}
SKIPPED = {"SKIP"}
# Everything else (FAIL, UNEXPECTEDPASS, TIMEOUT, INTERRUPT, ERROR, ...) is a failure.


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-failures", type=int, default=0)
    parser.add_argument("builds", nargs="+")
    args = parser.parse_args()

    passed = failed = skipped = 0
    for build in args.builds:
        log = pathlib.Path(build) / "meson-logs" / "testlog.json"
        if not log.exists():
            print(f"summary: {build}: no testlog.json (build failed or ran no test)")
            continue
        b_passed = b_failed = b_skipped = 0
        for line in log.read_text().splitlines():
            if not line.strip():
                continue
            result = json.loads(line).get("result", "ERROR")
            if result in PASSED:
                b_passed += 1
            elif result in SKIPPED:
                b_skipped += 1
            else:
                b_failed += 1
                print(f"summary: {build}: {json.loads(line).get('name')} -> {result}")
        print(f"summary: {build}: {b_passed} passed, {b_failed} failed, {b_skipped} skipped")
        passed, failed, skipped = passed + b_passed, failed + b_failed, skipped + b_skipped

    failed += args.build_failures
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

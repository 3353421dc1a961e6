#!/usr/bin/env python3
"""Side-by-side table of one pytest file run twice: torch's native allocator, then vramledger.

    python3 tests/torch_upstream/compare_junit.py --native native.xml --vramledger vramledger.xml \
        [--native-log native.log] [--vramledger-log vramledger.log] [--collected ids.txt] \
        [--md OUT.md] [--json OUT.json] [--title TEXT] [--note TEXT ...]

Each run is read from its JUnit XML (pytest --junitxml). A run cut short (killed by a time
limit) may have no XML, or an XML without the tests it did not reach: the verbose log
(pytest -v: "path::Class::test PASSED") then fills in what it shows, and the test that was
running when the log ends is marked "killed". A test absent from a run (but seen in the other
run or in --collected) is "not run".

Outcomes: passed, failed, error, skipped, xfailed, xpassed, killed, not run.
A "vramledger-only failure" failed, errored or was killed under vramledger and passed natively;
a "vramledger-only pass" passed under vramledger and failed, errored or was killed natively.

Prints the markdown (table, the two lists with the first line of each failure message) and,
last, one line:
    upstream allocator tests: N run, native F failed, vramledger G failed, vramledger-only failures K
N counts the tests that ran (not skipped, not "not run") in at least one of the two runs; F and G
count failed + error + killed. Exit status 0 whenever the inputs could be read (it is a
measurement); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Tuple

FAILING = ("failed", "error", "killed")
RAN = ("passed", "failed", "error", "xfailed", "xpassed", "killed")

# "path/file.py::Class::test_name PASSED [ 10%]" (pytest -v); also the -rA short summary form
# "PASSED path/file.py::Class::test_name".
_VERBOSE = re.compile(r"^(\S+\.py)::(\S+?)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+\.py)::(\S+)")
_STARTED = re.compile(r"^(\S+\.py)::(\S+)\s*$")
_LOG_OUTCOME = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error",
                "SKIPPED": "skipped", "XFAIL": "xfailed", "XPASS": "xpassed"}


def first_line(text: Optional[str]) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:300]
    return ""


def test_id(classname: str, name: str) -> str:
    """Class::test from a JUnit testcase (classname is "module.Class" under pytest)."""
    cls = classname.rsplit(".", 1)[-1] if classname else ""
    return f"{cls}::{name}" if cls else name


def read_junit(path: Optional[str]) -> Tuple[Dict[str, Tuple[str, str]], Optional[str]]:
    """{test id: (outcome, message)} and an error text when the file is missing or unreadable."""
    results: Dict[str, Tuple[str, str]] = {}
    if not path:
        return results, "no JUnit XML given"
    if not os.path.exists(path):
        return results, f"{path}: missing (the run was cut short or did not start)"
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as error:
        return results, f"{path}: unreadable ({error})"
    for case in root.iter("testcase"):
        if not case.get("name"):
            continue  # pytest's record of an interrupted session
        tid = test_id(case.get("classname", ""), case.get("name", ""))
        outcome, message = "passed", ""
        failure = case.find("failure")
        error = case.find("error")
        skipped = case.find("skipped")
        if failure is not None:
            outcome = "failed"
            message = failure.get("message") or failure.text or ""
            if (failure.get("message") or "").startswith("[XPASS(strict)]"):
                outcome = "xpassed"
        elif error is not None:
            outcome = "error"
            message = error.get("message") or error.text or ""
        elif skipped is not None:
            kind = skipped.get("type", "")
            message = skipped.get("message") or skipped.text or ""
            outcome = "xfailed" if "xfail" in kind else "skipped"
        # A test can have a call failure and a teardown error: the first one wins, but an
        # error after a pass still counts.
        if tid in results and results[tid][0] in FAILING:
            continue
        results[tid] = (outcome, first_line(message))
    return results, None


def read_log(path: Optional[str]) -> Dict[str, Tuple[str, str]]:
    """Outcomes shown by a verbose pytest log (pytest -v prints "path::Class::test " before
    running a test and its outcome after it). A test id left without an outcome at the end of
    the log was still running when the run was stopped: "killed"."""
    results: Dict[str, Tuple[str, str]] = {}
    if not path or not os.path.exists(path):
        return results
    last_started: Optional[str] = None
    with open(path, errors="replace") as log:
        for raw in log:
            line = raw.rstrip("\n")
            match = _VERBOSE.match(line)
            if match:
                tid = match.group(2)
                results.setdefault(tid, (_LOG_OUTCOME[match.group(3)], ""))
                if results[tid][0] == "passed" and _LOG_OUTCOME[match.group(3)] == "error":
                    results[tid] = ("error", "")  # teardown error after a pass
                last_started = None
                continue
            match = _SUMMARY.match(line)
            if match:
                tid = match.group(3).split(" ")[0]
                rest = line.split(" - ", 1)[1] if " - " in line else ""
                outcome = _LOG_OUTCOME[match.group(1)]
                if tid not in results or (outcome in FAILING and results[tid][0] not in FAILING):
                    results[tid] = (outcome, first_line(rest))
                elif outcome == results[tid][0] and rest and not results[tid][1]:
                    results[tid] = (outcome, first_line(rest))
                continue
            match = _STARTED.match(line.strip())
            if match:
                last_started = match.group(2)
    if last_started and last_started not in results:
        results[last_started] = ("killed", "still running when the run was stopped")
    return results


def read_collected(path: Optional[str]) -> List[str]:
    """Test ids from `pytest --collect-only -q` output (path::Class::test, one a line)."""
    if not path or not os.path.exists(path):
        return []
    ids = []
    with open(path, errors="replace") as listing:
        for line in listing:
            line = line.strip()
            if "::" in line and ".py::" in line and " " not in line:
                ids.append(line.split(".py::", 1)[1])
    return ids


def merge(junit: Dict[str, Tuple[str, str]], log: Dict[str, Tuple[str, str]]):
    merged = dict(log)
    merged.update(junit)  # the XML has the messages; the log only what the XML lacks
    return merged


def compare(native: Dict[str, Tuple[str, str]], vramledger: Dict[str, Tuple[str, str]],
            collected: Optional[List[str]] = None):
    names = sorted(set(native) | set(vramledger) | set(collected or []))
    rows = []
    for name in names:
        n_out, n_msg = native.get(name, ("not run", ""))
        v_out, v_msg = vramledger.get(name, ("not run", ""))
        rows.append({"test": name, "native": n_out, "vramledger": v_out,
                     "native_message": n_msg, "vramledger_message": v_msg})
    only_v = [r for r in rows if r["vramledger"] in FAILING and r["native"] == "passed"]
    only_v_pass = [r for r in rows if r["vramledger"] == "passed" and r["native"] in FAILING]
    both = [r for r in rows if r["vramledger"] in FAILING and r["native"] in FAILING]
    v_fail_no_native = [r for r in rows if r["vramledger"] in FAILING
                        and r["native"] not in FAILING and r["native"] != "passed"]
    ran = [r for r in rows if r["native"] in RAN or r["vramledger"] in RAN]
    summary = {
        "run": len(ran),
        "collected": len(rows),
        "native_failed": sum(r["native"] in FAILING for r in rows),
        "vramledger_failed": sum(r["vramledger"] in FAILING for r in rows),
        "vramledger_only_failures": len(only_v),
        "vramledger_only_passes": len(only_v_pass),
        "failed_in_both": len(both),
        "native_not_run": sum(r["native"] == "not run" for r in rows),
        "vramledger_not_run": sum(r["vramledger"] == "not run" for r in rows),
    }
    return rows, only_v, only_v_pass, both, v_fail_no_native, summary


def summary_line(summary) -> str:
    return (f"upstream allocator tests: {summary['run']} run, native {summary['native_failed']} "
            f"failed, vramledger {summary['vramledger_failed']} failed, vramledger-only failures "
            f"{summary['vramledger_only_failures']}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(title, notes, rows, only_v, only_v_pass, both, v_fail_no_native, summary,
             problems) -> str:
    out: List[str] = [f"# {title}", ""]
    out += [f"- {note}" for note in notes]
    out += [f"- problem: {p}" for p in problems]
    if notes or problems:
        out.append("")
    out += [f"{summary['collected']} tests seen, {summary['run']} ran in at least one run; "
            f"native {summary['native_failed']} failed, vramledger {summary['vramledger_failed']} "
            f"failed; not run: native {summary['native_not_run']}, vramledger "
            f"{summary['vramledger_not_run']}.", ""]

    def listing(heading, items, which):
        out.append(f"## {heading} ({len(items)})")
        out.append("")
        if not items:
            out.append("none")
        for r in items:
            message = r[f"{which}_message"] or "(no message)"
            out.append(f"- `{r['test']}` ({r['native']} natively, {r['vramledger']} under "
                       f"vramledger): {_cell(message)}")
        out.append("")

    listing("Fail only under vramledger", only_v, "vramledger")
    listing("Pass only under vramledger", only_v_pass, "native")
    listing("Fail under both", both, "vramledger")
    if v_fail_no_native:
        listing("Fail under vramledger, no native pass to compare (skipped or not run)",
                v_fail_no_native, "vramledger")
    out += ["## All tests", "", "| test | native | vramledger |", "|---|---|---|"]
    for r in rows:
        out.append(f"| `{r['test']}` | {r['native']} | {r['vramledger']} |")
    out += ["", summary_line(summary)]
    return "\n".join(out) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--native", help="JUnit XML of the native run")
    parser.add_argument("--vramledger", help="JUnit XML of the run under vramledger")
    parser.add_argument("--native-log", help="verbose pytest log of the native run")
    parser.add_argument("--vramledger-log", help="verbose pytest log of the vramledger run")
    parser.add_argument("--collected", help="pytest --collect-only -q output: tests that neither "
                                            "run reached read \"not run\"")
    parser.add_argument("--md", help="write the markdown here")
    parser.add_argument("--json", help="write the JSON here")
    parser.add_argument("--title", default="PyTorch allocator tests: native vs vramledger")
    parser.add_argument("--note", action="append", default=[], help="a line for the header")
    args = parser.parse_args(argv)
    if not args.native and not args.native_log:
        parser.error("--native or --native-log is needed")
    if not args.vramledger and not args.vramledger_log:
        parser.error("--vramledger or --vramledger-log is needed")

    problems = []
    n_xml, n_problem = read_junit(args.native)
    v_xml, v_problem = read_junit(args.vramledger)
    for label, problem in (("native", n_problem), ("vramledger", v_problem)):
        if problem:
            problems.append(f"{label}: {problem}")
    native = merge(n_xml, read_log(args.native_log))
    vramledger = merge(v_xml, read_log(args.vramledger_log))
    rows, only_v, only_v_pass, both, v_fail_no_native, summary = compare(
        native, vramledger, read_collected(args.collected))
    text = markdown(args.title, args.note, rows, only_v, only_v_pass, both, v_fail_no_native,
                    summary, problems)
    if args.md:
        os.makedirs(os.path.dirname(os.path.abspath(args.md)), exist_ok=True)
        with open(args.md, "w") as f:
            f.write(text)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"title": args.title, "notes": args.note, "problems": problems,
                       "summary": summary, "summary_line": summary_line(summary),
                       "vramledger_only_failures": only_v,
                       "vramledger_only_passes": only_v_pass,
                       "failed_in_both": both, "tests": rows}, f, indent=1)
            f.write("\n")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

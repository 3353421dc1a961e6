"""compare_junit.py on hand-made JUnit XML and pytest logs (CPU only).

    python3 -m pytest tests/torch_upstream/test_compare_junit.py
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare_junit  # noqa: E402

NATIVE_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="6">
<testcase classname="test_cuda_allocator.TestCuda" name="test_memory_stats" time="0.1"/>
<testcase classname="test_cuda_allocator.TestCuda" name="test_out_of_memory" time="0.1"/>
<testcase classname="test_cuda_allocator.TestCuda" name="test_both_fail" time="0.1">
  <failure message="AssertionError: 1 != 2&#10;second line">trace</failure></testcase>
<testcase classname="test_cuda_allocator.TestMemPool" name="test_native_only_fail" time="0.1">
  <failure message="RuntimeError: native broke">trace</failure></testcase>
<testcase classname="test_cuda_allocator.TestMemPool" name="test_skipped" time="0.0">
  <skipped type="pytest.skip" message="CUDA >= 11.0 required">skip</skipped></testcase>
<testcase classname="test_cuda_allocator.TestCudaMallocAsync" name="test_raises_oom_max_split_size_mb_setting_False" time="0.1"/>
</testsuite></testsuites>
"""

VRAMLEDGER_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="1" tests="6">
<testcase classname="test_cuda_allocator.TestCuda" name="test_memory_stats" time="0.1"/>
<testcase classname="test_cuda_allocator.TestCuda" name="test_out_of_memory" time="0.1">
  <failure message="AssertionError: &quot;Tried to allocate 800000000.00 GiB&quot; does not match &quot;allocation failed: invalid argument&quot;&#10;more">trace</failure></testcase>
<testcase classname="test_cuda_allocator.TestCuda" name="test_both_fail" time="0.1">
  <failure message="AssertionError: 1 != 3">trace</failure></testcase>
<testcase classname="test_cuda_allocator.TestMemPool" name="test_native_only_fail" time="0.1"/>
<testcase classname="test_cuda_allocator.TestMemPool" name="test_skipped" time="0.0">
  <skipped type="pytest.skip" message="CUDA >= 11.0 required">skip</skipped></testcase>
<testcase classname="test_cuda_allocator.TestCudaMallocAsync" name="test_raises_oom_max_split_size_mb_setting_False" time="0.1">
  <error message="failed on teardown with &quot;OSError: boom&quot;">trace</error></testcase>
</testsuite></testsuites>
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_side_by_side(tmp_path):
    native = write(tmp_path, "native.xml", NATIVE_XML)
    vram = write(tmp_path, "vramledger.xml", VRAMLEDGER_XML)
    md, js = str(tmp_path / "out" / "t.md"), str(tmp_path / "out" / "t.json")
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "compare_junit.py"), "--native", native,
         "--vramledger", vram, "--md", md, "--json", js, "--note", "hello"],
        capture_output=True, text=True, check=True)
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == ("upstream allocator tests: 5 run, native 2 failed, vramledger 3 failed, "
                         "vramledger-only failures 2")
    data = json.load(open(js))
    only = {r["test"]: r for r in data["vramledger_only_failures"]}
    assert set(only) == {"TestCuda::test_out_of_memory",
                         "TestCudaMallocAsync::test_raises_oom_max_split_size_mb_setting_False"}
    # first line of the message only
    assert only["TestCuda::test_out_of_memory"]["vramledger_message"].endswith(
        '"allocation failed: invalid argument"')
    assert only["TestCudaMallocAsync::test_raises_oom_max_split_size_mb_setting_False"][
        "vramledger"] == "error"
    assert [r["test"] for r in data["vramledger_only_passes"]] == [
        "TestMemPool::test_native_only_fail"]
    assert [r["test"] for r in data["failed_in_both"]] == ["TestCuda::test_both_fail"]
    assert data["summary"]["vramledger_only_passes"] == 1
    text = open(md).read()
    assert "- hello" in text
    assert "| `TestMemPool::test_skipped` | skipped | skipped |" in text
    assert "## Fail only under vramledger (2)" in text
    assert "## Pass only under vramledger (1)" in text
    assert text.strip().splitlines()[-1] == lines[-1]


def test_missing_xml_uses_the_log_and_marks_the_killed_test(tmp_path):
    native = write(tmp_path, "native.xml", NATIVE_XML)
    log = write(tmp_path, "vramledger.log", "\n".join([
        "============================= test session starts ==============================",
        ".upstream/test_cuda_allocator.py::TestCuda::test_both_fail FAILED          [ 16%]",
        ".upstream/test_cuda_allocator.py::TestCuda::test_memory_stats PASSED       [ 33%]",
        ".upstream/test_cuda_allocator.py::TestMemPool::test_skipped SKIPPED (CUDA) [ 50%]",
        ".upstream/test_cuda_allocator.py::TestCuda::test_out_of_memory ",
    ]))
    rows, only_v, _, both, _, summary = compare_junit.compare(
        compare_junit.merge(compare_junit.read_junit(native)[0], {}),
        compare_junit.merge(compare_junit.read_junit(str(tmp_path / "none.xml"))[0],
                            compare_junit.read_log(log)))
    by = {r["test"]: r for r in rows}
    assert by["TestCuda::test_out_of_memory"]["vramledger"] == "killed"
    assert by["TestCuda::test_memory_stats"]["vramledger"] == "passed"
    assert by["TestMemPool::test_skipped"]["vramledger"] == "skipped"
    assert by["TestMemPool::test_native_only_fail"]["vramledger"] == "not run"
    assert [r["test"] for r in only_v] == ["TestCuda::test_out_of_memory"]
    assert [r["test"] for r in both] == ["TestCuda::test_both_fail"]
    assert summary["vramledger_not_run"] == 2


def test_short_summary_lines_give_messages(tmp_path):
    log = write(tmp_path, "n.log", "\n".join([
        "x.py::TestCuda::test_a FAILED                                     [ 50%]",
        "x.py::TestCuda::test_b PASSED                                     [100%]",
        "=========================== short test summary info ============================",
        "FAILED x.py::TestCuda::test_a - AssertionError: 2048 != 0",
    ]))
    results = compare_junit.read_log(log)
    assert results["TestCuda::test_a"] == ("failed", "AssertionError: 2048 != 0")
    assert results["TestCuda::test_b"] == ("passed", "")


def test_unreadable_xml_is_a_problem_not_a_crash(tmp_path):
    bad = write(tmp_path, "bad.xml", "<testsuites><testcase")
    results, problem = compare_junit.read_junit(bad)
    assert results == {} and "unreadable" in problem
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, "compare_junit.py"), "--native", bad,
         "--vramledger", str(tmp_path / "missing.xml")],
        capture_output=True, text=True)
    assert result.returncode == 0
    assert "problem: native:" in result.stdout and "problem: vramledger:" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == (
        "upstream allocator tests: 0 run, native 0 failed, vramledger 0 failed, "
        "vramledger-only failures 0")


def test_interrupted_session_and_collected_tests(tmp_path):
    xml = write(tmp_path, "n.xml", (
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        '<testsuite name="pytest" tests="1"><testcase classname="test_slow.TestCuda" '
        'name="test_a_fast" time="0.005" /><testcase time="0.000" /></testsuite></testsuites>'))
    collected = write(tmp_path, "ids.txt", "\n".join([
        "test_slow.py::TestCuda::test_a_fast",
        "test_slow.py::TestCuda::test_b_hangs",
        "test_slow.py::TestCuda::test_c_never",
    ]))
    native = compare_junit.read_junit(xml)[0]
    assert list(native) == ["TestCuda::test_a_fast"]
    rows, *_, summary = compare_junit.compare(native, native,
                                              compare_junit.read_collected(collected))
    assert [(r["test"], r["native"]) for r in rows] == [
        ("TestCuda::test_a_fast", "passed"), ("TestCuda::test_b_hangs", "not run"),
        ("TestCuda::test_c_never", "not run")]
    assert summary["run"] == 1 and summary["native_not_run"] == 2

"""CPU tests of the end-to-end harness (compare_allocators.py, compile_check.py): everything but
the models themselves. A fake "python" stands in for the interpreter the harness starts: it
answers the environment probe as if a GPU were there and plays a child run by a scripted
behaviour (succeed, differ at a step, hang, crash, refuse...). The figures it writes exist only
in these tests' temporary folders.

    python3 -m pytest bench/end_to_end/test_end_to_end.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare_allocators as ca  # noqa: E402
import e2e_render as er  # noqa: E402
import e2e_common as common  # noqa: E402

GiB = 1 << 30

FAKE_PYTHON = r'''#!{python}
# A stand-in interpreter for the harness's children (see test_end_to_end.py).
import json, os, sys, time
sys.path.insert(0, {here!r})
args = sys.argv[1:]
if args[:1] == ["-c"]:   # the environment probe
    if os.environ.get("FAKE_PROBE") == "nogpu":
        print("PROBE " + json.dumps({{"python": "3", "torch": "fake", "cuda_available": False}}))
    else:
        n = int(os.environ.get("FAKE_GPUS", "1"))
        print("PROBE " + json.dumps({{"python": "3", "torch": "fake", "torch_cuda": "13.0",
                                      "cuda_available": True, "device_count": n,
                                      "gpus": ["Fake GPU"] * n, "transformers": "fake",
                                      "torchvision": "fake", "triton": "fake"}}))
    sys.exit(0)
if "--child" not in args:   # the harness itself: the real interpreter, children through me
    os.execv(sys.executable, [sys.executable] + args + ["--python", os.path.abspath(__file__)])
import e2e_common
e2e_common.die_with_parent()
script = os.path.basename(args[0])
opts = dict(zip(args[1::2], args[2::2]))
name, allocator, result_file = opts["--child"], opts["--allocator"], opts["--result-file"]
key = name + "." + allocator
pid_dir = os.environ.get("FAKE_PID_DIR")
if pid_dir:
    open(os.path.join(pid_dir, str(os.getpid())), "w").write(key)
behaviour = json.loads(os.environ.get("FAKE_BEHAVIOUR", "{{}}")).get(key, "ok")
count_file = os.path.join(os.path.dirname(result_file), key + ".count")
count = int(open(count_file).read()) + 1 if os.path.exists(count_file) else 1
open(count_file, "w").write(str(count))

def write(result):
    e2e_common.write_json_atomic(__import__("pathlib").Path(result_file), result)

if behaviour == "hang":
    time.sleep(600)
if behaviour.startswith("sleep:"):
    time.sleep(float(behaviour.split(":")[1]))
if behaviour == "crash":
    print("Segmentation fault (fake)", flush=True)
    os._exit(139)
if behaviour == "nogpu":
    write({{"status": "no_gpu", "error": "torch.cuda.is_available() is False"}})
    sys.exit(77)

if script == "compile_check.py":
    if behaviour in ("refuse", "error"):
        message = ("vramledger does not support checkpointing a private pool's state (fake)"
                   if behaviour == "refuse" else "something else went wrong")
        write({{"case": name, "allocator": allocator, "status": "error",
                "error_type": "RuntimeError", "error_message": message,
                "cudagraph": {{"graphs_recorded": 0}}}})
        sys.exit(1)
    outputs = ["h%d" % i for i in range(6)]
    if behaviour == "differ":
        outputs[2] = "other"
    write({{"case": name, "allocator": allocator, "status": "ok", "outputs": outputs,
            "eager_relative_difference": 1e-6, "cudagraph": {{"graphs_recorded": 1}}}})
    sys.exit(0)

# compare_allocators.py: check what the parent put in the environment.
import compare_allocators as ca
expected = ca.ALLOCATORS[allocator].env.get("PYTORCH_CUDA_ALLOC_CONF")
problems = []
if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") != expected:
    problems.append("PYTORCH_CUDA_ALLOC_CONF=%r" % os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
if os.environ.get("CUBLAS_WORKSPACE_CONFIG") != ":4096:8":
    problems.append("CUBLAS_WORKSPACE_CONFIG missing")
if "VRAMLEDGER_CONF" in os.environ:
    problems.append("VRAMLEDGER_CONF leaked")
if problems:
    write({{"status": "error", "error": "environment: " + ", ".join(problems)}})
    sys.exit(1)
steps, warmup = int(opts["--steps"]), int(opts["--warmup"])
records = [float(i + 1).hex() for i in range(steps)]
if behaviour.startswith("differ:"):
    records[int(behaviour.split(":")[1])] = float(999).hex()
if behaviour == "nondeterministic" and count > 1:
    records[1] = float(-1).hex()
seconds = [0.5] + [0.1 + 0.001 * i for i in range(steps - 1)]
measured = [1e3 * s for s in seconds[warmup:]]
reserved = {{"native": 10, "expandable": 9, "malloc_async": 9.5}}.get(allocator, 8.5) * {GiB}
result = {{"status": "ok", "workload": name, "allocator": allocator, "record_kind": "loss_hex",
          "records": records,
          "schedule": [{{"batch": 8, "seq": 128 * (i + 1)}} for i in range(steps)],
          "step_seconds": seconds, "median_step_ms": sorted(measured)[len(measured) // 2],
          "p90_step_ms": max(measured), "peak_reserved_bytes": int(reserved),
          "peak_requested_bytes": None if allocator == "malloc_async" else 8 * {GiB},
          "peak_allocated_bytes": 8 * {GiB} + 4096}}
if "--barrier" in opts:   # --together: step in lock step with the siblings, as the real child
    from step_barrier import StepBarrier
    barrier = StepBarrier(opts["--barrier"], allocator, opts["--barrier-parties"].split(","),
                          timeout_s=30)
    for index in range(steps):
        barrier.wait(index)
    barrier.leave()
    result["lock_step"] = barrier.record()
if allocator.startswith("vramledger"):
    result["vramledger_stats"] = {{"backend": "fake", "paged_heap": True, "num_device_alloc": 3,
                                  "num_maps": 10, "num_unmaps": 2,
                                  "fragmentation": {{"gmlake_ratio": 0.01,
                                                    "overhead_ratio": 1.06}}}}
write(result)
if behaviour == "crash-at-exit":
    os._exit(134)
'''


@pytest.fixture()
def fake_python(tmp_path):
    path = tmp_path / "fake-python"
    path.write_text(FAKE_PYTHON.format(python=sys.executable, here=str(HERE), GiB=GiB))
    path.chmod(0o755)
    return path


def run_script(script, fake_python, out, *args, behaviour=None, env_extra=None, timeout=120):
    env = dict(os.environ)
    env["FAKE_BEHAVIOUR"] = json.dumps(behaviour or {})
    env["PYTORCH_CUDA_ALLOC_CONF"] = "garbage:1"   # must never reach a child
    env["VRAMLEDGER_CONF"] = "backend:garbage"
    env.update(env_extra or {})
    return subprocess.run([sys.executable, str(HERE / script), "--out", str(out), "--python",
                           str(fake_python), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def load(out, name="compare_allocators.json"):
    return json.loads((out / name).read_text())


# --- small pieces ---------------------------------------------------------------------------


def test_statistics():
    assert common.median([3, 1, 2]) == 2
    assert common.median([4, 1, 3, 2]) == 2.5
    assert common.median([]) is None
    values = list(range(1, 10))           # 9 timed steps, as in the default runs
    assert common.percentile_nearest_rank(values, 90) == 9
    assert common.percentile_nearest_rank(values, 50) == 5
    assert common.percentile_nearest_rank([7], 90) == 7


def test_first_difference():
    assert common.first_difference(["a", "b"], ["a", "b"]) is None
    assert common.first_difference(["a", "b", "c"], ["a", "x", "c"]) == 1
    assert common.first_difference(["a", "b"], ["a"]) == 1


def test_parse_names_and_selection():
    assert ca.parse_names("gpt2_train,vramledger") == (["gpt2_train"], ["vramledger"])
    with pytest.raises(ValueError, match="unknown name 'nope'"):
        ca.parse_names("nope")
    args = ca.build_parser().parse_args(["--quick"])
    workloads, allocators = ca.select(args)
    assert workloads == ca.QUICK_WORKLOADS
    assert allocators[0] == "native" and set(allocators) == set(ca.QUICK_ALLOCATORS)
    args = ca.build_parser().parse_args(["--only", "llama_train,malloc_async"])
    assert ca.select(args) == (["llama_train"], ["native", "malloc_async"])  # native added


def test_schedules_are_seeded_and_identical():
    import random
    for workload in ca.WORKLOADS.values():
        a = workload.schedule(random.Random(0), 12)
        b = workload.schedule(random.Random(0), 12)
        assert a == b and len(a) == 12
        assert len({json.dumps(s, sort_keys=True) for s in a}) > 1, "shapes must vary"


def test_plot_axis():
    assert er._nice_ceiling(0.93) == 1.0
    assert er._nice_ceiling(1.31) == 2
    assert er._nice_ceiling(14.2) == 20
    assert er._nice_ceiling(0) == 1.0
    low, high, ticks = er._axis([44.6, 0.5])          # overheads in %
    assert (low, high) == (0.0, 60.0) and ticks == [0.0, 20.0, 40.0, 60.0]
    low, high, ticks = er._axis([3.2, -1.1])          # step times vs native, both signs
    assert low == -2.0 and high == 4.0 and 0.0 in ticks
    assert er._axis([]) [:2] == (0.0, 1.0)


def test_bad_arguments_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(HERE / "compare_allocators.py"), "--dry-run",
                           "--only", "bogus"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown name 'bogus'" in done.stderr
    done = subprocess.run([sys.executable, str(HERE / "compare_allocators.py"), "--dry-run",
                           "--steps", "3", "--warmup", "3"], capture_output=True, text=True)
    assert done.returncode == 2 and "at least one timed step" in done.stderr


def test_dry_run_prints_every_process(tmp_path):
    done = subprocess.run([sys.executable, str(HERE / "compare_allocators.py"), "--dry-run",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = [l for l in done.stdout.splitlines() if "--child" in l]
    assert len(lines) == len(ca.WORKLOADS) * len(ca.ALLOCATORS)
    assert sum("PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync" in l for l in lines) == len(ca.WORKLOADS)
    assert not (tmp_path / "compare_allocators.json").exists()


# --- whole runs with the fake interpreter --------------------------------------------------


def test_all_identical(tmp_path, fake_python):
    out = tmp_path / "out"
    # The hand-written SVG (its bars carry <title>s): matplotlib, where installed (the GPU
    # machine), draws its own.
    done = run_script("compare_allocators.py", fake_python, out, "--commit", "abc123",
                      "--no-matplotlib")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = load(out)
    runs = len(ca.WORKLOADS) * len(ca.ALLOCATORS)
    workloads = len(ca.WORKLOADS)
    assert len(doc["runs"]) == runs and all(r["status"] == "ok" for r in doc["runs"])
    assert all(c["identical"] is True for c in doc["comparisons"])
    assert doc["meta"]["commit"] == "abc123"
    # malloc_async counts no requested bytes: its ratio is against native's requested peak.
    asyncs = [r for r in doc["runs"] if r["allocator"] == "malloc_async"]
    assert all(r["derived"]["ratio_basis"] == "native's requested peak" for r in asyncs)
    assert asyncs[0]["derived"]["overhead_ratio"] == pytest.approx(9.5 / 8)
    ours = next(r for r in doc["runs"] if r["allocator"] == "vramledger")
    assert ours["derived"]["overhead_ratio"] == pytest.approx(8.5 / 8)
    assert ours["derived"]["peak_reserved_vs_native"] == pytest.approx(0.85)
    # The fake steps take equal time under every allocator: step by step, a ratio of 1.
    assert ours["derived"]["paired_step_ratio"] == pytest.approx(1.0)
    md = (out / "compare_allocators.md").read_text()
    assert "| gpt2_train | 10.00 GiB · 1.250 · " in md
    assert md.split("## Workloads")[0].count("| yes |") == workloads   # the main table
    assert "1.188*" in md                       # malloc_async's ratio, marked
    svg = ET.fromstring((out / "compare_allocators.svg").read_text())
    bars = [e for e in svg.iter("{http://www.w3.org/2000/svg}rect") if e.find(
        "{http://www.w3.org/2000/svg}title") is not None]
    assert len(bars) == 3 * runs                # three panels, every run
    summary = done.stdout.strip().splitlines()[-1]
    n = workloads
    assert summary == (f"SUMMARY {runs}/{runs} runs ok; vramledger: identical to native {n}/{n}, "
                       "peak reserved vs native -15.0%, median step +0.0%; vramledger-pages: "
                       f"identical to native {n}/{n}, peak reserved vs native -15.0%, median step "
                       "+0.0%; vramledger-chunk16: "
                       f"identical to native {n}/{n}, peak reserved vs native -15.0%, median step "
                       "+0.0%; vramledger-slack05: "
                       f"identical to native {n}/{n}, peak reserved vs native -15.0%, median step "
                       "+0.0%; vramledger-noslack: "
                       f"identical to native {n}/{n}, peak reserved vs native -15.0%, median step "
                       "+0.0%; vramledger-nostreamorder: "
                       f"identical to native {n}/{n}, peak reserved vs native -15.0%, median step "
                       "+0.0%; vramledger-placed: "
                       f"identical to native {n}/{n}, peak reserved vs native -15.0%, median step "
                       "+0.0%; vramledger-unmapinplace: "
                       f"identical to native {n}/{n}, peak reserved vs native -15.0%, median step "
                       "+0.0%; vramledger-front: "
                       f"identical to native {n}/{n}, peak reserved vs native -15.0%, median step "
                       "+0.0%; vramledger-cuda_malloc: "
                       f"identical to native {n}/{n}, peak reserved vs native -15.0%, median step "
                       "+0.0%")
    assert (out / "logs" / "gpt2_train.native.log").exists()


def test_difference_is_reported_with_its_step_and_a_native_control(tmp_path, fake_python):
    out = tmp_path / "out"
    done = run_script("compare_allocators.py", fake_python, out, "--quick",
                      behaviour={"gpt2_train.vramledger": "differ:4"})
    assert done.returncode == 1
    doc = load(out)
    comp = next(c for c in doc["comparisons"]
                if c["workload"] == "gpt2_train" and c["allocator"] == "vramledger")
    assert comp["identical"] is False and comp["step"] == 4
    assert comp["value"] == float(999).hex()
    assert comp["native_reproducible"] is True            # the control run was made
    assert any(r.get("control") for r in doc["runs"])
    assert any("gpt2_train: vramledger differs from native: step 4 differs" in f
               and "allocator changed results" in f for f in doc["failures"])
    md = (out / "compare_allocators.md").read_text()
    assert "no: vramledger (step 4)" in md


def test_nondeterministic_native_makes_the_difference_inconclusive(tmp_path, fake_python):
    out = tmp_path / "out"
    done = run_script("compare_allocators.py", fake_python, out,
                      "--only", "resnet50_train,vramledger",
                      behaviour={"resnet50_train.vramledger": "differ:2",
                                 "resnet50_train.native": "nondeterministic"})
    assert done.returncode == 1
    doc = load(out)
    assert any("INCONCLUSIVE" in f for f in doc["failures"])


def test_a_difference_outside_vramledger_is_reported_but_not_failed(tmp_path, fake_python):
    out = tmp_path / "out"
    done = run_script("compare_allocators.py", fake_python, out, "--only", "gpt2_train",
                      behaviour={"gpt2_train.expandable": "differ:1"})
    assert done.returncode == 0, done.stdout
    md = (out / "compare_allocators.md").read_text()
    assert "no: expandable (step 1)" in md


def test_timeout_and_crash_are_recorded_and_the_rest_continues(tmp_path, fake_python):
    out = tmp_path / "out"
    start = time.monotonic()
    done = run_script("compare_allocators.py", fake_python, out, "--quick", "--run-timeout-s", "3",
                      behaviour={"gpt2_train.expandable": "hang",
                                 "resnet50_train.vramledger": "crash",
                                 "resnet50_train.native": "crash-at-exit"})
    assert time.monotonic() - start < 60
    assert done.returncode == 1
    doc = load(out)
    status = {r["key"]: r["status"] for r in doc["runs"]}
    assert status["gpt2_train.expandable"] == "timeout"
    assert status["resnet50_train.vramledger"] == "failed"
    assert status["resnet50_train.expandable"] == "ok"
    crashed = next(r for r in doc["runs"] if r["key"] == "resnet50_train.vramledger")
    assert "Segmentation fault (fake)" in crashed["error"]
    late = next(r for r in doc["runs"] if r["key"] == "resnet50_train.native")
    assert late["status"] == "failed" and "after writing its result" in late["error"]
    md = (out / "compare_allocators.md").read_text()
    assert "**TIMEOUT**" in md and "**FAILED**" in md


def test_time_limit_leaves_later_runs_not_run(tmp_path, fake_python):
    out = tmp_path / "out"
    done = run_script("compare_allocators.py", fake_python, out, "--quick", "--time-limit-s", "5",
                      "--min-run-s", "1",
                      behaviour={k: "sleep:2" for k in ("gpt2_train.native",
                                                        "gpt2_train.vramledger",
                                                        "gpt2_train.expandable")})
    assert done.returncode == 1
    doc = load(out)
    not_run = [r for r in doc["runs"] if r["status"] == "not_run"]
    assert not_run and all("time limit" in r["error"] for r in not_run)
    assert len(doc["runs"]) == 6


def test_two_gpus_keep_each_workload_on_one_gpu(tmp_path, fake_python):
    out = tmp_path / "out"
    done = run_script("compare_allocators.py", fake_python, out, "--quick", "--gpus", "2",
                      env_extra={"FAKE_GPUS": "2", "CUDA_VISIBLE_DEVICES": "3,5"})
    assert done.returncode == 0, done.stdout
    doc = load(out)
    gpus = {}
    for run in doc["runs"]:
        gpus.setdefault(run["workload"], set()).add(run["gpu"])
    assert gpus == {"gpt2_train": {"3"}, "resnet50_train": {"5"}}


def test_no_gpu_skips(tmp_path, fake_python):
    out = tmp_path / "out"
    done = run_script("compare_allocators.py", fake_python, out, env_extra={"FAKE_PROBE": "nogpu"})
    assert done.returncode == 77
    assert "SKIPPED: no CUDA device" in done.stdout
    assert "**SKIPPED**" in (out / "compare_allocators.md").read_text()


def test_render_from_json(tmp_path, fake_python):
    out = tmp_path / "out"
    assert run_script("compare_allocators.py", fake_python, out, "--quick").returncode == 0
    (out / "compare_allocators.md").unlink()
    (out / "compare_allocators.svg").unlink()
    again = tmp_path / "again"
    done = subprocess.run([sys.executable, str(HERE / "compare_allocators.py"), "--render",
                           str(out / "compare_allocators.json"), "--out", str(again)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (again / "compare_allocators.md").read_text().startswith("# End-to-end comparison")
    ET.fromstring((again / "compare_allocators.svg").read_text())
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    done = subprocess.run([sys.executable, str(HERE / "compare_allocators.py"), "--render",
                           str(bad)], capture_output=True, text=True)
    assert done.returncode == 2


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for_pids(pid_dir, count, seconds=30):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pids = [int(p.name) for p in pid_dir.iterdir()]
        if len(pids) >= count:
            return pids
        time.sleep(0.1)
    raise AssertionError("the fake children did not start")


def _start_parent(tmp_path, fake_python, out, pid_dir):
    env = dict(os.environ, FAKE_BEHAVIOUR=json.dumps({"gpt2_train.native": "hang"}),
               FAKE_PID_DIR=str(pid_dir))
    return subprocess.Popen([sys.executable, str(HERE / "compare_allocators.py"), "--out",
                             str(out), "--python", str(fake_python), "--quick"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigterm_kills_the_children_and_writes_what_was_measured(tmp_path, fake_python):
    out, pid_dir = tmp_path / "out", tmp_path / "pids"
    pid_dir.mkdir()
    parent = _start_parent(tmp_path, fake_python, out, pid_dir)
    pids = _wait_for_pids(pid_dir, 1)
    parent.send_signal(signal.SIGTERM)
    output, _ = parent.communicate(timeout=30)
    assert parent.returncode == 124, output
    time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids)
    doc = load(out)
    assert doc["interrupted"].startswith("stopped by signal SIGTERM")
    assert {r["status"] for r in doc["runs"]} <= {"interrupted", "not_run"}
    assert len(doc["runs"]) == 6


def test_sigkill_of_the_parent_takes_the_children_along(tmp_path, fake_python):
    out, pid_dir = tmp_path / "out", tmp_path / "pids"
    pid_dir.mkdir()
    parent = _start_parent(tmp_path, fake_python, out, pid_dir)
    pids = _wait_for_pids(pid_dir, 1)
    parent.kill()
    parent.communicate(timeout=30)
    end = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


# --- compile_check ---------------------------------------------------------------------------


def test_compile_check_classifies_the_known_refusal_only():
    sys.path.insert(0, str(HERE))
    import compile_check as cc

    refused = {"status": "failed", "result": {"error_message": "RuntimeError: vramledger does "
                                              "not support checkpointing a private pool's state"}}
    other = {"status": "failed", "result": {"error_message": "CUDA error: invalid argument"}}
    assert cc.classify(refused) == "refused"
    assert cc.classify(other) == "error"
    assert cc.classify({"status": "timeout"}) == "timeout"
    assert cc.classify({"status": "ok", "result": {}}) == "works"


def test_compile_check_refusal_is_a_failure_and_named(tmp_path, fake_python):
    out = tmp_path / "out"
    done = run_script("compile_check.py", fake_python, out,
                      behaviour={"inference_fixed.vramledger": "refuse",
                                 "train_step.vramledger": "refuse",
                                 "two_shapes.vramledger": "refuse"})
    assert done.returncode == 1, done.stdout + done.stderr
    doc = load(out, "compile_check.json")
    assert [r["vramledger"] for r in doc["rows"]] == ["refused"] * 3
    assert doc["checkpointing_needed"] is True
    assert "does not support checkpointing a private pool's state (fake)" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith(
        "SUMMARY reduce-overhead under vramledger: 0/3 cases work (native 3/3); "
        "checkpointing (getCheckpointState/setCheckpointPoolState) NEEDED: refused in "
        "inference_fixed, train_step, two_shapes; 3 problem(s)")


def test_compile_check_failures(tmp_path, fake_python):
    out = tmp_path / "out"
    done = run_script("compile_check.py", fake_python, out, "--run-timeout-s", "3",
                      behaviour={"inference_fixed.vramledger": "differ",
                                 "train_step.vramledger": "error",
                                 "two_shapes.native": "hang"})
    assert done.returncode == 1
    doc = load(out, "compile_check.json")
    rows = {r["case"]: r for r in doc["rows"]}
    assert rows["inference_fixed"]["identical"] is False
    assert rows["train_step"]["vramledger"] == "error"
    assert rows["two_shapes"]["native"] == "timeout"
    assert len(doc["problems"]) == 3
    assert doc["checkpointing_needed"] is False


def test_compile_check_all_working(tmp_path, fake_python):
    out = tmp_path / "out"
    done = run_script("compile_check.py", fake_python, out, "--only", "two_shapes")
    assert done.returncode == 0, done.stdout
    assert "| two_shapes | works | works | yes |" in (out / "compile_check.md").read_text()


def test_compile_check_no_gpu(tmp_path, fake_python):
    done = run_script("compile_check.py", fake_python, tmp_path / "out",
                      env_extra={"FAKE_PROBE": "nogpu"})
    assert done.returncode == 77
    assert done.stdout.strip().splitlines()[-1].startswith("SUMMARY skipped: no CUDA device")


def test_hook_script_is_valid_bash():
    hook = HERE.parent.parent / "scripts" / "gpu_suite.d" / "40-end-to-end.sh"
    done = subprocess.run(["bash", "-n", str(hook)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_module_docstrings_name_every_workload():
    text = textwrap.dedent(ca.__doc__)
    for name in list(ca.WORKLOADS) + list(ca.ALLOCATORS):
        assert name in text


def test_native_last_reverses_each_workloads_order_and_still_compares(tmp_path, fake_python):
    out = tmp_path / "out"
    done = run_script("compare_allocators.py", fake_python, out, "--quick", "--native-last")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = load(out)
    assert doc["meta"]["native_last"] is True
    for workload in doc["plan"]["workloads"]:
        ran = [r["allocator"] for r in doc["runs"] if r["workload"] == workload]
        assert ran == list(reversed(doc["plan"]["allocators"])) and ran[-1] == "native"
    ours = next(r for r in doc["runs"] if r["allocator"] == "vramledger")
    assert ours["derived"]["paired_step_ratio"] == pytest.approx(1.0)


def test_a_run_the_time_left_cannot_hold_is_not_started(tmp_path, fake_python):
    # native takes ~4 s; with a 7 s limit the next run of the workload would be killed midway.
    out = tmp_path / "out"
    done = run_script("compare_allocators.py", fake_python, out, "--only",
                      "gpt2_train,vramledger", "--time-limit-s", "7", "--min-run-s", "1",
                      behaviour={"gpt2_train.native": "sleep:4", "gpt2_train.vramledger": "sleep:4"})
    doc = load(out)
    ours = next(r for r in doc["runs"] if r["allocator"] == "vramledger")
    assert ours["status"] == "not_run", ours
    assert "earlier run took" in ours["error"]
    assert not any(r["status"] == "timeout" for r in doc["runs"])
    assert done.returncode == 1


def test_profile_gpu_time_runs_each_shape_once_and_reports_milliseconds(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)   # no GPU here
    seen = []

    class Workload:
        @staticmethod
        def step(torch_module, state, shape):
            seen.append(shape)
            return torch_module.ones(4).sum()

    out = ca.profile_gpu_time(torch, Workload, {}, [{"seq": 1}, {"seq": 2}])
    assert seen == [{"seq": 1}, {"seq": 2}]
    assert out["shapes"] == seen and len(out["gpu_ms"]) == 2
    assert all(isinstance(v, float) and v >= 0 for v in out["gpu_ms"])


def test_paired_gpu_time_ratio_is_derived_only_when_both_runs_profiled():
    def run(gpu_ms):
        result = {"peak_reserved_bytes": 2, "peak_requested_bytes": 1, "schedule": [1],
                  "step_seconds": [1.0], "warmup": 0}
        if gpu_ms is not None:
            result["profile"] = {"gpu_ms": gpu_ms}
        return {"result": result}
    native = run([10.0, 20.0, 30.0])
    assert ca.derive_figures(run([11.0, 22.0, 36.0]), native)["paired_gpu_time_ratio"] == \
        pytest.approx(1.1)
    assert ca.derive_figures(run(None), native)["paired_gpu_time_ratio"] is None
    assert ca.derive_figures(run([1.0]), native)["paired_gpu_time_ratio"] is None


def test_max_ratio_fails_the_default_configuration_over_it(tmp_path, fake_python):
    # The fake vramledger reserves 8.5 GiB for 8 GiB requested: 1.0625.
    out = tmp_path / "over"
    done = run_script("compare_allocators.py", fake_python, out, "--only",
                      "gpt2_train,vramledger", "--max-ratio", "1.02")
    assert done.returncode == 1
    assert "vramledger peak reserved / peak requested 1.0625 > 1.02" in done.stdout
    out = tmp_path / "under"
    done = run_script("compare_allocators.py", fake_python, out, "--only",
                      "gpt2_train,vramledger", "--max-ratio", "1.07")
    assert done.returncode == 0, done.stdout
    assert run_script("compare_allocators.py", fake_python, tmp_path / "bad",
                      "--max-ratio", "nan").returncode == 2


def test_aba_step_ratio_is_against_the_mean_of_both_natives():
    def run(steps, name="vramledger"):
        return {"allocator": name,
                "result": {"peak_reserved_bytes": 2, "peak_requested_bytes": 1,
                           "schedule": [1, 2, 3], "step_seconds": steps, "warmup": 1}}
    native, again = run([9.0, 1.0, 1.0], "native"), run([9.0, 3.0, 3.0], "native-again")
    ours = run([9.0, 2.0, 2.0])
    figures = ca.derive_figures(ours, native, again)
    assert figures["paired_step_ratio"] == pytest.approx(2.0)
    assert figures["paired_step_ratio_aba"] == pytest.approx(1.0)
    assert ca.derive_figures(ours, native)["paired_step_ratio_aba"] is None
    # The control itself is not paired with itself.
    assert ca.derive_figures(again, native, again)["paired_step_ratio_aba"] is None


def test_the_a_a_control_runs_last_or_first_so_the_others_run_between_two_natives(
        tmp_path, fake_python):
    for flag, out in (((), tmp_path / "first"), (("--native-last",), tmp_path / "last")):
        done = run_script("compare_allocators.py", fake_python, out, "--only",
                          "gpt2_train,vramledger,native-again", *flag)
        assert done.returncode == 0, done.stdout + done.stderr
        ran = [r["allocator"] for r in load(out)["runs"]]
        assert ran[1] == "vramledger" and {ran[0], ran[2]} == {"native", "native-again"}
        ours = next(r for r in load(out)["runs"] if r["allocator"] == "vramledger")
        assert ours["derived"]["paired_step_ratio_aba"] is not None


def test_native_itself_gets_no_aba_figure():
    native = {"allocator": "native",
              "result": {"schedule": [1], "step_seconds": [1.0, 1.0], "warmup": 0}}
    again = {"allocator": "native-again",
             "result": {"schedule": [1], "step_seconds": [2.0, 2.0], "warmup": 0}}
    assert ca.derive_figures(native, native, again)["paired_step_ratio_aba"] is None


def test_timed_step_collects_before_and_keeps_the_collector_out_of_the_step():
    import gc
    seen = []
    order = []

    def step():
        seen.append(gc.isenabled())
        order.append("step")
        return "out"
    result, seconds = ca.timed_step(lambda: order.append("sync"), step)
    assert result == "out" and seconds >= 0
    assert seen == [False]                       # no collection can start inside the step
    assert order == ["sync", "step", "sync"]     # synchronized on both sides of the timer
    assert gc.isenabled()

    def failing():
        raise RuntimeError("step failed")
    with pytest.raises(RuntimeError):
        ca.timed_step(lambda: None, failing)
    assert gc.isenabled()                        # re-enabled when the step raises


def test_step_barrier_keeps_parties_in_step_and_lets_a_leaver_go(tmp_path):
    from step_barrier import StepBarrier
    import threading
    seen = []
    late = StepBarrier(tmp_path, "b", ["a", "b"], timeout_s=10)
    def other():
        time.sleep(0.3)
        late.wait(0)
        seen.append(("b", 0, time.perf_counter()))
        late.leave()                      # b takes no second step
    thread = threading.Thread(target=other)
    early = StepBarrier(tmp_path, "a", ["a", "b"], timeout_s=10)
    started = time.perf_counter()
    thread.start()
    early.wait(0)
    assert time.perf_counter() - started >= 0.25, "a went on before b reached step 0"
    thread.join()
    early.wait(1)                         # b left: no wait, no break
    assert early.broken_at is None and early.record()["waited_s"] >= 0.25
    with pytest.raises(ValueError):
        StepBarrier(tmp_path, "c", ["a", "b"])


def test_step_barrier_breaks_after_its_timeout_and_never_waits_again(tmp_path):
    from step_barrier import StepBarrier
    alone = StepBarrier(tmp_path, "a", ["a", "b"], timeout_s=0.2)
    alone.wait(0)
    assert alone.broken_at == 0
    started = time.perf_counter()
    alone.wait(1)
    assert time.perf_counter() - started < 0.1 and alone.record()["broken_at_step"] == 0


def test_together_runs_a_workloads_allocators_at_once_in_lock_step(tmp_path, fake_python):
    # vramledger's child starts 1.5 s late: in lock step the others wait for it at step 0.
    behaviour = {"gpt2_train.vramledger": "sleep:1.5"}
    done = run_script("compare_allocators.py", fake_python, tmp_path, "--together",
                      "--only", "gpt2_train,vramledger,native-again", "--steps", "4",
                      "--warmup", "1", behaviour=behaviour)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = load(tmp_path)
    assert doc["meta"]["together"] is True
    runs = {r["allocator"]: r for r in doc["runs"]}
    assert set(runs) == {"native", "vramledger", "native-again"}
    for allocator, run in runs.items():
        lock = run["result"]["lock_step"]
        assert sorted(lock["parties"]) == ["native", "native-again", "vramledger"]
        assert lock["broken_at_step"] is None
        if allocator != "vramledger":
            assert lock["waited_s"] >= 1.0, (allocator, lock)
    # At once, not one after the other: the group took about one child's time.
    assert doc["meta"]["total_wall_s"] < 3 * 1.5


def test_together_with_a_gpu_per_allocator_puts_each_on_its_own(tmp_path, fake_python):
    done = run_script("compare_allocators.py", fake_python, tmp_path, "--together", "--gpus",
                      "3", "--only", "gpt2_train,vit_train,vramledger,native-again", "--steps",
                      "3", "--warmup", "1", env_extra={"FAKE_GPUS": "3"})
    assert done.returncode == 0, done.stdout + done.stderr
    doc = load(tmp_path)
    assert doc["meta"]["together_layout"] == "one GPU per allocator"
    for workload in ("gpt2_train", "vit_train"):
        gpus = {r["allocator"]: r["gpu"] for r in doc["runs"] if r["workload"] == workload}
        assert gpus == {"native": "0", "vramledger": "1", "native-again": "2"}

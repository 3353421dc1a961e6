"""Sleep and wake by tag on a GPU (issue 17, docs/sleep.md), each case in a fresh interpreter with
vramledger installed: a model's weights (offloaded) and a KV cache (discarded) give their memory
back (NVML), the weights come back bitwise, a CUDA graph captured before the sleep replays to
bitwise the same output, the ledger agrees with the census while asleep; misuse is refused with
nothing lost. CUDA graph private pools sleep too (the name "graphs"): their memory leaves the
process (NVML, cudaMemGetInfo) and a graph captured before the sleep — torch.cuda.graph, and
torch.compile(mode="reduce-overhead") where inductor compiles — replays bitwise the same after
the wake. Skips (with the reason) without a GPU, torch or the staged package; the CPU side is
tests/policy/sleep_test.cpp and tests/policy/pool_sleep_test.cpp.
"""

import json
import os
import textwrap

import pytest

from conftest import REPO, needs_gpu, run_python

WORKLOAD = os.path.join(REPO, "bench", "sleep")
PRELUDE = f"""
import json, sys
sys.path.insert(0, {WORKLOAD!r})
import torch, vramledger
vramledger.install("sleepable_graph_pools:true")  # "graphs" sleeps only with it
import sleep_workload as w
"""


def run(code, timeout=180, env=None):
    result = run_python(PRELUDE + textwrap.dedent(code), timeout=timeout, env_extra=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@needs_gpu
def test_weights_and_kv_cache_sleep_and_wake():
    out = run("""
    memory = w.ProcessMemory(torch.cuda.current_device())
    state = w.build(1 * w.GIB, 2 * w.GIB, lambda: vramledger.tag("weights"),
                    lambda: vramledger.tag("kv_cache"))
    before = memory.used()
    slept = vramledger.sleep(tags=["weights", "kv_cache"], offload=["weights"])
    asleep = memory.used()
    stats = vramledger.stats()
    report = vramledger.report()
    process = vramledger.process_report()
    tags = vramledger.sleeping_tags()
    woken = vramledger.wake()
    checks = w.check_after_wake(state)
    print(json.dumps(dict(checks, released=before - asleep, slept_bytes=slept.bytes,
                          released_bytes=slept.released_bytes, resident=slept.resident_bytes,
                          offloaded=slept.offloaded_bytes, woken=woken.bytes, tags=tags,
                          report_shows_asleep="asleep" in report,
                          ledger_warning="inconsistent" in report,
                          missing_hook="MISSING HOOK" in process,
                          sleeping_stat=stats["sleeping_bytes"]["all"]["current"],
                          basis=memory.basis)))
    """)
    gib = 1 << 30
    assert out["tags"] == ["weights", "kv_cache"] or sorted(out["tags"]) == ["kv_cache", "weights"]
    assert out["weights_intact"] and out["graph_identical"] and out["kv_usable"], out
    assert out["offloaded"] >= 1 * gib - (64 << 20)
    # Everything but at most a page at each end of a block went back to the driver.
    assert out["released"] >= 3 * gib - (64 << 20), out
    assert out["released_bytes"] + out["resident"] >= out["slept_bytes"] - (64 << 20), out
    assert out["woken"] == out["slept_bytes"]
    # The books while asleep: the sleeping line, no inconsistency, the process report still sums.
    assert out["sleeping_stat"] == out["slept_bytes"], out
    assert out["report_shows_asleep"] and not out["ledger_warning"], out
    assert not out["missing_hook"], out


@needs_gpu
def test_misuse_is_refused_and_loses_nothing():
    out = run("""
    state = w.build(256 << 20, 256 << 20, lambda: vramledger.tag("weights"),
                    lambda: vramledger.tag("kv_cache"))
    errors = {}
    def expect_error(name, call, kind=RuntimeError):
        try:
            call()
            errors[name] = "no error"
        except kind as error:
            errors[name] = str(error)
    expect_error("unknown tag", lambda: vramledger.sleep(tags=["nope"]))
    expect_error("wake not asleep", lambda: vramledger.wake(tags=["weights"]))
    # A sleep during a capture is refused before any device call: the capture goes on.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        expect_error("during capture", lambda: vramledger.sleep(tags=["weights"]))
        y = state["model"](state["input"])
    vramledger.sleep(tags=["weights", "kv_cache"], offload=["weights"])
    expect_error("sleep twice", lambda: vramledger.sleep(tags=["weights"]))
    def allocate_under_sleeping_tag():
        with vramledger.tag("kv_cache"):
            torch.empty(1 << 20, device="cuda")
    expect_error("allocate asleep", allocate_under_sleeping_tag, Exception)
    del state["kv"]  # freed at the wake, not a crash
    vramledger.wake()
    expect_error("wake twice", lambda: vramledger.wake(tags=["weights"]))
    checks = w.check_after_wake(dict(state, kv=torch.zeros(1, dtype=torch.uint8, device="cuda")))
    print(json.dumps(dict(checks, errors=errors)))
    """)
    errors = out["errors"]
    assert "unknown tag 'nope'" in errors["unknown tag"]
    assert "not asleep" in errors["wake not asleep"]
    assert "capture" in errors["during capture"]
    assert "already asleep" in errors["sleep twice"]
    assert "asleep" in errors["allocate asleep"]
    assert "not asleep" in errors["wake twice"]
    assert out["weights_intact"] and out["graph_identical"], out


@needs_gpu
def test_wake_on_a_full_device_fails_cleanly_and_works_later():
    out = run("""
    state = w.build(512 << 20, 512 << 20, lambda: vramledger.tag("weights"),
                    lambda: vramledger.tag("kv_cache"))
    vramledger.sleep(tags=["weights", "kv_cache"], offload=["weights"])
    # Other allocations take all of the device's memory meanwhile.
    blocks = []
    with vramledger.tag("squatter"):
        while True:
            try:
                blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                break
    message = ""
    try:
        vramledger.wake()
    except vramledger.WakeOutOfMemoryError as error:
        message = str(error)
    still = vramledger.sleeping_tags()
    del blocks
    vramledger.empty_cache()
    vramledger.wake()
    checks = w.check_after_wake(state)
    print(json.dumps(dict(checks, message=message, still=still)))
    """)
    assert "Nothing is lost" in out["message"], out["message"]
    assert sorted(out["still"]) == ["kv_cache", "weights"]
    assert out["weights_intact"] and out["graph_identical"] and out["kv_usable"], out


@needs_gpu
def test_graphs_do_not_sleep_unless_installed_with_sleepable_graph_pools():
    # Without the option, graph pools are plain cudaMalloc segments: "graphs" is refused with the
    # option's name, and the pool and its graph are untouched.
    default_install = PRELUDE.replace('vramledger.install("sleepable_graph_pools:true")',
                                      "vramledger.install()")
    assert default_install != PRELUDE
    result = run_python(default_install + textwrap.dedent("""
    x = torch.ones(1 << 20, device="cuda")
    x * 2  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    pools = [p.reserved_bytes for p in vramledger.graph_pools()]
    try:
        vramledger.sleep(tags=["graphs"])
        error = "no error"
    except RuntimeError as e:
        error = str(e)
    x.fill_(3)
    graph.replay()
    torch.cuda.synchronize()
    print(json.dumps(dict(error=error, reserved_same=torch.cuda.memory_reserved() == reserved,
                          pools_same=[p.reserved_bytes for p in vramledger.graph_pools()] == pools,
                          pools=pools, replay_right=bool((y == 6).all()))))
    """), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert "sleepable_graph_pools:true" in out["error"], out
    assert "nothing was changed" in out["error"], out
    assert out["pools"] and out["pools"][0] > 0, out
    assert out["reserved_same"] and out["pools_same"] and out["replay_right"], out


@needs_gpu
def test_graph_pools_sleep_and_the_graph_replays_bitwise():
    out = run("""
    memory = w.ProcessMemory(torch.cuda.current_device())
    torch.manual_seed(0)
    with vramledger.tag("weights"):
        model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()
    static_input = torch.randn(4096, 4096, device="cuda")  # untagged, stays awake
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            model(static_input)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # intermediates freed inside the capture stay in its pool
        output = torch.relu(model(static_input))
    graph.replay()
    torch.cuda.synchronize()
    expected = output.clone()
    pools = vramledger.graph_pools()
    graph_bytes = sum(p.reserved_bytes for p in pools)
    errors = {}
    def expect_error(name, call, kind=RuntimeError):
        try:
            call()
            errors[name] = "no error"
        except kind as error:
            errors[name] = str(error)
    expect_error("wake graphs not asleep", lambda: vramledger.wake(tags=["graphs"]))
    second = torch.cuda.CUDAGraph()
    with torch.cuda.graph(second):
        expect_error("during capture", lambda: vramledger.sleep(tags=["graphs"]))
        torch.relu(static_input)
    before = memory.used()
    free_before = torch.cuda.mem_get_info()[0]
    slept = vramledger.sleep(tags=["weights", "graphs"], offload=["weights"])
    asleep = memory.used()
    free_asleep = torch.cuda.mem_get_info()[0]
    pools_asleep = vramledger.graph_pools()
    tags = vramledger.sleeping_tags()
    stats = vramledger.stats()
    report = vramledger.report()
    process = vramledger.process_report()
    expect_error("sleep graphs twice", lambda: vramledger.sleep(tags=["graphs"]))
    def capture_into_sleeping_pool():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=graph.pool()):
            torch.relu(static_input)
    expect_error("allocate into sleeping pool", capture_into_sleeping_pool, Exception)
    woken = vramledger.wake()
    expect_error("wake graphs twice", lambda: vramledger.wake(tags=["graphs"]))
    output.zero_()  # the replay must compute it again, in the memory the wake mapped
    graph.replay()
    second.replay()
    torch.cuda.synchronize()
    print(json.dumps(dict(
        identical=bool(torch.equal(output.view(torch.int32), expected.view(torch.int32))),
        graph_bytes=graph_bytes, pools=len(pools),
        sleepable=all(p.sleepable for p in pools),
        asleep_pools=[p.asleep for p in pools_asleep],
        asleep_reserved=sum(p.reserved_bytes for p in pools_asleep),
        released=before - asleep, freed_by_driver=free_asleep - free_before,
        released_bytes=slept.released_bytes, woken_blocks=woken.blocks, slept_blocks=slept.blocks,
        tags=tags, errors=errors, sleeping_stat=stats["sleeping_bytes"]["all"]["current"],
        slept_bytes=slept.bytes, ledger_warning="inconsistent" in report,
        missing_hook="MISSING HOOK" in process, basis=memory.basis)))
    """)
    mib = 1 << 20
    weights = 4 * (4096 * 4096 + 4096) * 4
    assert out["pools"] >= 1 and out["sleepable"], out
    assert out["graph_bytes"] >= 64 * mib, out  # 64 MiB activations, freed inside the capture
    assert all(out["asleep_pools"]) and out["asleep_reserved"] == 0, out
    # Every byte of the weights and of every graph pool left the process (2 MiB per block slack
    # for pages the weights share with awake neighbours).
    assert out["released"] >= weights + out["graph_bytes"] - 16 * mib, out
    assert out["freed_by_driver"] >= weights + out["graph_bytes"] - 16 * mib, out
    assert out["identical"], "the graph's replay after the wake differs from before the sleep"
    assert out["woken_blocks"] == out["slept_blocks"], out
    assert sorted(out["tags"]) == ["graphs", "weights"], out
    assert out["sleeping_stat"] == out["slept_bytes"], out
    assert not out["ledger_warning"] and not out["missing_hook"], out
    errors = out["errors"]
    assert "not asleep" in errors["wake graphs not asleep"], errors
    assert "capture" in errors["during capture"], errors
    assert "asleep already" in errors["sleep graphs twice"], errors
    assert "asleep" in errors["allocate into sleeping pool"], errors
    assert "not asleep" in errors["wake graphs twice"], errors
    print(f"graphs: {out['graph_bytes'] / mib:.0f} MiB in {out['pools']} pool(s) released "
          f"({out['released'] / mib:.0f} MiB with the weights, per {out['basis']})")


@needs_gpu
def test_torch_compile_reduce_overhead_sleeps_and_replays_bitwise():
    out = run("""
    torch.manual_seed(0)
    with vramledger.tag("weights"):
        w1 = torch.randn(2048, 8192, device="cuda")
        w2 = torch.randn(8192, 2048, device="cuda")
    x = torch.randn(1024, 2048, device="cuda")
    def step(x):
        return torch.nn.functional.gelu(x @ w1) @ w2
    compiled = torch.compile(step, mode="reduce-overhead")
    try:
        for _ in range(3):  # warm-up, record, replay (cudagraph trees)
            torch.compiler.cudagraph_mark_step_begin()
            y = compiled(x)
            expected = y.clone()
            del y  # no output of the last run alive: the next call replays
        torch.cuda.synchronize()
    except Exception as error:  # no compiler toolchain here: say why
        print(json.dumps(dict(skip=f"torch.compile failed: {type(error).__name__}: {error}"[:400])))
        raise SystemExit(0)
    pools = vramledger.graph_pools()
    free_before = torch.cuda.mem_get_info()[0]
    slept = vramledger.sleep(tags=["weights", "graphs"], offload=["weights"])
    free_asleep = torch.cuda.mem_get_info()[0]
    vramledger.wake()
    torch.compiler.cudagraph_mark_step_begin()
    again = compiled(x)
    torch.cuda.synchronize()
    print(json.dumps(dict(
        identical=bool(torch.equal(again.view(torch.int32), expected.view(torch.int32))),
        pools=len(pools), graph_bytes=sum(p.reserved_bytes for p in pools),
        sleepable=all(p.sleepable for p in pools), freed=free_asleep - free_before,
        released_bytes=slept.released_bytes)))
    """, timeout=300)
    if "skip" in out:
        pytest.skip(out["skip"])
    mib = 1 << 20
    assert out["pools"] >= 1 and out["sleepable"], out
    assert out["freed"] >= 2 * 2048 * 8192 * 4 + out["graph_bytes"] - 8 * mib, out
    assert out["identical"], "the compiled graph's replay after the wake differs"
    print(f"reduce-overhead: {out['graph_bytes'] / mib:.0f} MiB of graph pools released")


@needs_gpu
@pytest.mark.parametrize("pin", ["host_alloc", "register"])
def test_host_memory_prepared_at_start_up_serves_the_first_sleep(pin):
    out = run("""
    import time
    state = w.build(1 * w.GIB, 1 * w.GIB, lambda: vramledger.tag("weights"),
                    lambda: vramledger.tag("kv_cache"))
    start = time.perf_counter()
    kept = vramledger.prepare_offload(["weights"])
    prepare_s = time.perf_counter() - start
    again = vramledger.prepare_offload(["weights"])
    slept = vramledger.sleep(tags=["weights", "kv_cache"], offload=["weights"])
    vramledger.wake()
    checks = w.check_after_wake(state)
    bad = ""
    try:
        vramledger.prepare_offload(["no_such_tag"])
    except RuntimeError as error:
        bad = str(error)
    print(json.dumps(dict(checks, kept=kept, again=again, offloaded=slept.offloaded_bytes,
                          prepare_s=prepare_s, bad=bad)))
    """, env={"VRAMLEDGER_SLEEP_PIN": pin})
    assert out["kept"] == out["offloaded"] and out["kept"] >= 1 << 30, out
    assert out["again"] == out["kept"], "a kept buffer is not pinned twice"
    assert out["weights_intact"] and out["graph_identical"] and out["kv_usable"], out
    assert "unknown tag" in out["bad"], out
    print(f"pin={pin}: {out['kept'] / (1 << 30):.2f} GiB pinned in {out['prepare_s']:.3f} s")


def test_bench_names_its_variants_for_an_unknown_one():
    # CPU-side: the comparison harness names its variants (pinning ways, tms hook modes).
    result = run_python(f"""
import runpy, sys
sys.argv = ["bench_sleep.py", "--which", "no_such_variant", "--budget-s", "30"]
runpy.run_path({os.path.join(REPO, "bench", "sleep", "bench_sleep.py")!r}, run_name="__main__")
""", timeout=60)
    text = result.stdout + result.stderr
    assert "unknown variant" in text and "vramledger-register" in text, text


def test_bench_script_says_when_torch_memory_saver_is_missing():
    # CPU-side: the comparison harness parses its arguments and reports a missing module.
    result = run_python(f"""
import runpy, sys
sys.argv = ["bench_sleep.py", "--check-tms-only"]
runpy.run_path({os.path.join(REPO, "bench", "sleep", "bench_sleep.py")!r}, run_name="__main__")
""", timeout=60)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text
    assert "torch_memory_saver" in text

"""CUDA IPC on a GPU (docs/ipc.md): two processes started with torch.multiprocessing (spawn), a
producer sending a 256 MiB CUDA tensor (a view 16 KiB into its storage) and a consumer reading it
bit-exact and writing it back, under vramledger's backends and against torch's native allocator
on either side. Checked: the data both ways; the consumer's books (imported bytes in stats() and
in the process report, apart from the sum, nothing missing) and their return to zero; the
producer's block kept until the consumer released it, then freed; the device's used memory back
where it was once both processes are gone, whichever exits first, the producer killed included.
On the VMM backend the block's physical chunks travel as file descriptors (kind 'v'); the
malloc_async backend refuses to send, with the reason.

Each case runs tests/torch/ipc_workers.py in a fresh interpreter (which starts the two
processes). Skips without a GPU, torch or the staged package (conftest.py); the bookkeeping
without a GPU is tests/torch/ipc_selftest.cpp.
"""

import json
import os

import pytest

from conftest import HERE, needs_gpu, run_python

MIB = 1 << 20
# What the device's used memory may differ by, before the two processes and after both are
# gone: far below the 256 MiB tensor, above the driver's own noise.
SETTLE_SLACK = 64 * MIB


def run_case(scenario, producer_conf, consumer_conf, timeout=150, env=None):
    code = f"""
import sys
sys.path.insert(0, {HERE!r})
import ipc_workers
sys.argv = ["ipc_workers", {scenario!r}, {producer_conf!r}, {consumer_conf!r}]
ipc_workers.main()
"""
    result = run_python(code, timeout=timeout, env_extra={"VRAMLEDGER_BOARD": "0", **(env or {})})
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    out["stderr_tail"] = result.stderr[-2000:]
    print(json.dumps(out))  # the figures, in the log, for bench/results
    return out


def assert_memory_back(out):
    assert "error" not in out, out
    grew = out["device_used_after"] - out["device_used_before"]
    assert grew < SETTLE_SLACK, f"{grew} bytes still used on the device once both exited: {out}"


def assert_consumer_books(out, vramledger_consumer=True):
    consumer = out["consumer"]
    assert consumer["read_bitwise"], out
    released = out["consumer_release"]
    assert released["read_again_bitwise"] or out["scenario"] != "consumer_first", out
    if not vramledger_consumer:
        return
    books = consumer["books_while_imported"]
    # The whole exported segment is mapped: at least the tensor, counted once, in both places.
    assert books["stats_bytes"] >= out["tensor_bytes"], out
    assert books["stats_mappings"] == 1, out
    assert books["report"] == {"bytes": books["stats_bytes"], "mappings": 1}, out
    assert books["missing_hook"] is None, out
    after = released["books_after_release"]
    assert after["stats_bytes"] == 0 and after["stats_mappings"] == 0, out
    assert after["report"] == {"bytes": 0, "mappings": 0}, out
    # docs/ipc.md: NVML does not charge the importer for imported memory (so it is no line of
    # the sum). Where NVML lists this process (not inside a PID namespace), check it.
    before, during = consumer["own_nvml_before_import"], consumer["own_nvml_after_import"]
    if before is not None and during is not None:
        assert during - before < out["tensor_bytes"] // 2, (
            f"NVML charged the importer {during - before} bytes: imported memory would belong "
            f"in the sum (docs/ipc.md) {out}")


@pytest.mark.parametrize("scenario", ["consumer_first", "producer_killed"])
def test_protocol_dry_run_on_the_cpu(scenario):
    # The processes and their messages with CPU tensors (no GPU, no vramledger): a broken
    # protocol is found here rather than in the GPU budget.
    pytest.importorskip("torch")
    out = run_case(scenario, "native", "native", env={"VRAMLEDGER_IPC_DRY_RUN": "1"})
    assert "error" not in out, out
    assert_consumer_books(out, vramledger_consumer=False)
    assert out["consumer_release"]["read_again_bitwise"], out
    if scenario == "consumer_first":
        assert out["producer"]["write_back_bitwise"], out
    assert out["consumer_exitcode"] == 0, out
    assert out["producer_exitcode"] == (0 if scenario == "consumer_first" else -9), out


@needs_gpu
@pytest.mark.parametrize("backend", ["cuda_malloc", "vmm"])
def test_consumer_exits_first(backend):
    conf = f"backend:{backend}"
    out = run_case("consumer_first", conf, conf)
    assert_consumer_books(out)
    producer = out["producer"]
    assert producer["write_back_bitwise"], out
    assert producer["allocated_while_shared"] >= out["tensor_bytes"], out
    assert producer["allocated_after_free"] == 0, out
    assert out["producer_exitcode"] == 0 and out["consumer_exitcode"] == 0, out
    assert_memory_back(out)


@needs_gpu
@pytest.mark.parametrize("backend", ["cuda_malloc", "vmm"])
def test_producer_exits_first(backend):
    conf = f"backend:{backend}"
    out = run_case("producer_first", conf, conf)
    assert_consumer_books(out)
    assert out["producer_exitcode"] == 0 and out["consumer_exitcode"] == 0, out
    assert_memory_back(out)


@needs_gpu
@pytest.mark.parametrize("backend", ["cuda_malloc", "vmm"])
def test_producer_killed_gives_its_memory_back(backend):
    conf = f"backend:{backend}"
    out = run_case("producer_killed", conf, conf)
    assert_consumer_books(out)
    assert out["producer_exitcode"] == -9, out
    assert out["consumer_exitcode"] == 0, out
    assert_memory_back(out)


@needs_gpu
def test_vmm_mempool_tensor_is_shared():
    # A MemPool's blocks lie on cudaMalloc segments on every backend (kind 'c' from a VMM process).
    out = run_case("mempool", "backend:vmm", "backend:cuda_malloc")
    assert_consumer_books(out)
    assert out["producer"]["write_back_bitwise"], out
    assert out["producer"]["allocated_after_free"] == 0, out
    assert_memory_back(out)


@needs_gpu
def test_malloc_async_refuses_with_the_reason():
    out = run_case("consumer_first", "backend:malloc_async", "backend:cuda_malloc")
    assert "malloc_async backend" in out.get("refused", ""), out
    assert "backend:cuda_malloc" in out["refused"], out
    assert_memory_back(out)


@needs_gpu
@pytest.mark.parametrize("producer_conf,consumer_conf", [("native", "backend:vmm"),
                                                         ("backend:cuda_malloc", "native")])
def test_handles_interoperate_with_torch_native_allocator(producer_conf, consumer_conf):
    out = run_case("consumer_first", producer_conf, consumer_conf)
    assert_consumer_books(out, vramledger_consumer=consumer_conf != "native")
    assert out["producer"]["write_back_bitwise"], out
    assert_memory_back(out)

"""The processes of tests/torch/test_ipc.py (CUDA IPC, docs/ipc.md): a producer that sends a CUDA
tensor to a consumer over a torch.multiprocessing pipe (spawn), the consumer reading it bit-exact
and writing back, in the orders the test asks for, and NVML figures of the device meanwhile.

`python ipc_workers.py SCENARIO PRODUCER_CONF CONSUMER_CONF` runs one scenario and prints one JSON
line. A conf is a vramledger configuration ("backend:cuda_malloc"), or "native" for torch's own
allocator. Scenarios:

  consumer_first   the consumer reads, writes back, releases and exits; the producer then sees
                   the write, frees, and exits
  producer_first   the producer exits once the consumer has read; the consumer then releases
  producer_killed  the producer is killed (SIGKILL) once the consumer has read; the consumer
                   then releases: the producer's memory must go back to the driver
  mempool          as consumer_first, the tensor allocated in a torch.cuda.MemPool (cudaMalloc
                   segments on every backend)

VRAMLEDGER_IPC_DRY_RUN=1 runs the same processes and messages with CPU tensors, without vramledger
or NVML: the protocol checked where there is no GPU (test_ipc.py's dry-run case).
"""

import ctypes
import json
import os
import signal
import sys
import time

DRY = os.environ.get("VRAMLEDGER_IPC_DRY_RUN") == "1"
DEVICE = "cpu" if DRY else "cuda"
# float32: 256 MiB, so a leak stands far above the noise of contexts (4 MiB in a dry run).
NUMEL = (1 << 20) if DRY else (64 << 20)
SEED = 1234
OFFSET = 4096     # elements: the consumer gets a view that starts inside the storage


def expected_cpu():
    import torch

    generator = torch.Generator().manual_seed(SEED)
    return torch.randn(NUMEL, generator=generator)


class Nvml:
    """Device used bytes and per-process used bytes (NVML device 0 = CUDA device 0 here)."""

    class _Info(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                    ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

    class _Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.handle)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex(0) failed")

    def device_used(self):
        memory = self._Memory()
        self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(memory))
        return int(memory.used)

    def process_used(self, pid):
        """NVML's figure for `pid`, or None (not listed: e.g. a PID namespace)."""
        count = ctypes.c_uint(256)
        infos = (self._Info * 256)()
        if self.lib.nvmlDeviceGetComputeRunningProcesses_v3(
                self.handle, ctypes.byref(count), infos) != 0:
            return None
        for i in range(count.value):
            if infos[i].pid == pid:
                return int(infos[i].usedGpuMemory)
        return None


class _NoNvml:
    def device_used(self):
        return 0

    def process_used(self, pid):
        return None


def _nvml():
    return _NoNvml() if DRY else Nvml()


def _sync(torch):
    if not DRY:
        torch.cuda.synchronize()


def _install(conf):
    import torch

    if conf != "native" and not DRY:
        import vramledger

        vramledger.install(conf)
    return torch


def _imported(conf):
    if conf == "native" or DRY:
        return None
    import vramledger

    stats = vramledger.stats()
    report = json.loads(vramledger.process_report(format="json"))
    return {"stats_bytes": stats["imported_bytes"]["current"],
            "stats_mappings": stats["imported_mappings"]["current"],
            "report": report["imported"], "missing_hook": report["missing_hook"],
            "reserved": stats["reserved_bytes"]["all"]["current"]}


def producer(tensors, control, conf, scenario):
    """Sends the tensor on `tensors`; obeys `control` ("check" or "exit"); reports there."""
    try:
        torch = _install(conf)
        expected = expected_cpu()
        pool = torch.cuda.MemPool() if scenario == "mempool" and not DRY else None
        if pool is not None:
            with torch.cuda.use_mem_pool(pool):
                storage = expected.to(DEVICE)
        else:
            storage = expected.to(DEVICE, copy=True)
        _sync(torch)
        try:
            tensors.send(storage[OFFSET:])  # pickled here: a refusal raises here
        except Exception as error:
            tensors.send(None)
            control.send(("refused", f"{type(error).__name__}: {error}"))
            return
        control.send(("sent", os.getpid()))
        order = control.recv()
        if order == "exit":
            os._exit(0)  # at once, the consumer still holding the tensor
        _sync(torch)
        written = storage.cpu()
        wanted = expected.clone()
        wanted[OFFSET:] = -wanted[OFFSET:]
        result = {
            "write_back_bitwise": bool(torch.equal(written.view(torch.int32),
                                                   wanted.view(torch.int32))),
            "allocated_while_shared": 0 if DRY else int(torch.cuda.memory_allocated()),
        }
        # torch keeps our block (its limbo) until the consumer's reference count reached zero.
        del storage, written
        if not DRY:
            torch.cuda.ipc_collect()
        result["allocated_after_free"] = 0 if DRY else int(torch.cuda.memory_allocated())
        control.send(("done", result))
    except Exception as error:  # reported, not lost in a child's stderr
        control.send(("error", f"producer: {type(error).__name__}: {error}"))


def consumer(tensors, control, conf):
    """Reads the tensor, checks and negates it, reports; releases it when told."""
    try:
        torch = _install(conf)
        torch.zeros(1, device=DEVICE)  # a context and a first allocation before the import
        nvml = _nvml()
        _sync(torch)
        own_before = nvml.process_used(os.getpid())
        received = tensors.recv()
        if received is None:
            control.send(("nothing", None))
            return
        _sync(torch)
        own_after = nvml.process_used(os.getpid())
        expected = expected_cpu()[OFFSET:]
        result = {
            "read_bitwise": bool(torch.equal(received.cpu().view(torch.int32),
                                             expected.view(torch.int32))),
            "books_while_imported": _imported(conf),
            "own_nvml_before_import": own_before,
            "own_nvml_after_import": own_after,
        }
        received.neg_()  # the write-back the producer checks
        _sync(torch)
        control.send(("read", result))
        control.recv()  # "release" (the producer may be gone by now: producer_first/_killed)
        result = {"read_again_bitwise": bool(torch.equal(received.cpu().view(torch.int32),
                                                          (-expected).view(torch.int32))),
                  "own_nvml_before_release": nvml.process_used(os.getpid())}
        del received
        _sync(torch)
        result["books_after_release"] = _imported(conf)
        control.send(("released", result))
    except Exception as error:
        control.send(("error", f"consumer: {type(error).__name__}: {error}"))


def _recv(conn, who, timeout=60):
    if not conn.poll(timeout):
        raise TimeoutError(f"{who}: no message within {timeout} s")
    kind, payload = conn.recv()
    if kind == "error":
        raise RuntimeError(payload)
    return kind, payload


def run(scenario, producer_conf, consumer_conf):
    import torch.multiprocessing as mp

    nvml = _nvml()
    used_before = nvml.device_used()
    context = mp.get_context("spawn")
    p_tensors, c_tensors = context.Pipe()
    p_control, p_here = context.Pipe()
    c_control, c_here = context.Pipe()
    out = {"scenario": scenario, "producer_conf": producer_conf, "consumer_conf": consumer_conf,
           "tensor_bytes": (NUMEL - OFFSET) * 4}
    prod = context.Process(target=producer, args=(p_tensors, p_control, producer_conf, scenario))
    cons = context.Process(target=consumer, args=(c_tensors, c_control, consumer_conf))
    prod.start()
    cons.start()
    try:
        kind, payload = _recv(p_here, "producer")
        if kind == "refused":
            out["refused"] = payload
            return out
        kind, out["consumer"] = _recv(c_here, "consumer")
        assert kind == "read", kind
        out["device_used_while_shared"] = nvml.device_used()
        if scenario in ("producer_first", "producer_killed"):
            if scenario == "producer_killed":
                os.kill(prod.pid, signal.SIGKILL)
            else:
                p_here.send("exit")
            prod.join(timeout=30)
            time.sleep(1.0)
            out["device_used_producer_gone"] = nvml.device_used()
            c_here.send("release")
            kind, out["consumer_release"] = _recv(c_here, "consumer")
        else:
            c_here.send("release")
            kind, out["consumer_release"] = _recv(c_here, "consumer")
            cons.join(timeout=30)  # the consumer exits first
            p_here.send("check")
            kind, out["producer"] = _recv(p_here, "producer")
    except Exception as error:
        out["error"] = f"{type(error).__name__}: {error}"
    finally:
        for process in (prod, cons):
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
        time.sleep(1.0)  # a dead process's memory goes back as its context is torn down
        out["device_used_before"] = used_before
        out["device_used_after"] = nvml.device_used()
        out["producer_exitcode"] = prod.exitcode
        out["consumer_exitcode"] = cons.exitcode
    return out


def main():
    scenario, producer_conf, consumer_conf = sys.argv[1:4]
    print(json.dumps(run(scenario, producer_conf, consumer_conf)))


if __name__ == "__main__":
    main()

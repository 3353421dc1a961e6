"""vramledger installed as torch's CUDA allocator in this process (at collection time, before any
CUDA allocation): torch's own memory APIs must answer with vramledger's numbers, and CUDA
graphs, streams, cudnn and OOM handling must work through it.

VRAMLEDGER_TEST_CONF picks the configuration (e.g. "backend:cuda_malloc"); run_on_gpu.sh runs
the suite once per backend.
"""

import gc
import os

import pytest

from conftest import GPU_SKIP_REASON, needs_gpu, torch_format_size

pytestmark = needs_gpu

if GPU_SKIP_REASON is None:
    import torch
    import vramledger

    vramledger.install(os.environ.get("VRAMLEDGER_TEST_CONF", ""))

MiB = 1 << 20


def _settle():
    gc.collect()
    torch.cuda.synchronize()


def _torch_flat_stats():
    return torch.cuda.memory_stats()


TORCH_KEYS = [
    f"{name}.{pool}.{field}"
    for name in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                 "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
    for pool in ("all", "small_pool", "large_pool")
    for field in ("current", "peak", "allocated", "freed")
] + ["num_alloc_retries", "num_ooms"]


def test_installed_as_torchs_allocator():
    assert vramledger.is_installed()
    assert torch.cuda.memory.get_allocator_backend() == "vramledger"
    x = torch.ones(10, device="cuda")
    assert x.sum().item() == 10


def test_torch_memory_stats_are_ours():
    _settle()
    keep = [torch.empty(n, dtype=torch.uint8, device="cuda")
            for n in (1, 511, 513, 4096, 1 * MiB + 1, 7 * MiB, 33 * MiB)]
    _settle()
    theirs = _torch_flat_stats()
    ours = vramledger.flat_stats()
    for key in TORCH_KEYS:
        assert theirs[key] == ours[key], key
    assert torch.cuda.memory_allocated() == ours["allocated_bytes.all.current"]
    assert torch.cuda.memory_reserved() == ours["reserved_bytes.all.current"]
    assert torch.cuda.max_memory_allocated() == ours["allocated_bytes.all.peak"]
    assert torch.cuda.max_memory_reserved() == ours["reserved_bytes.all.peak"]
    assert ours["reserved_bytes.all.current"] >= ours["allocated_bytes.all.current"]
    del keep


def test_requested_and_allocated_bytes_count_exactly():
    _settle()
    before = vramledger.stats()
    x = torch.empty(1000, dtype=torch.uint8, device="cuda")  # rounds to 1024 (512-byte rounding)
    after = vramledger.stats()
    requested = after["requested_bytes"]["all"]["current"] - before["requested_bytes"]["all"]["current"]
    allocated = after["allocated_bytes"]["all"]["current"] - before["allocated_bytes"]["all"]["current"]
    assert requested == 1000
    assert allocated == 1024
    assert after["allocation"]["small_pool"]["current"] == before["allocation"]["small_pool"]["current"] + 1
    del x
    again = vramledger.stats()
    assert again["allocated_bytes"]["all"]["current"] == before["allocated_bytes"]["all"]["current"]


def test_reset_peak_and_accumulated_stats():
    _settle()
    big = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del big
    assert torch.cuda.max_memory_allocated() >= 64 * MiB + torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    assert vramledger.stats()["allocated_bytes"]["all"]["peak"] == torch.cuda.memory_allocated()
    torch.cuda.reset_accumulated_memory_stats()
    stats = torch.cuda.memory_stats()
    assert stats["allocation.all.allocated"] == 0
    assert stats["allocated_bytes.all.freed"] == 0


def test_empty_cache_returns_memory():
    _settle()
    blocks = [torch.empty(48 * MiB, dtype=torch.uint8, device="cuda") for _ in range(4)]
    del blocks
    _settle()
    reserved_before = torch.cuda.memory_reserved()
    frees_before = vramledger.stats()["num_device_free"]
    assert reserved_before - torch.cuda.memory_allocated() >= 4 * 48 * MiB
    torch.cuda.empty_cache()
    reserved_after = torch.cuda.memory_reserved()
    assert reserved_after <= reserved_before - 4 * 48 * MiB
    assert vramledger.stats()["reserved_bytes"]["all"]["current"] == reserved_after
    assert vramledger.stats()["num_device_free"] > frees_before


def test_memory_snapshot_describes_our_blocks():
    _settle()
    keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (3 * MiB, 5000, 21 * MiB)]
    segments = torch.cuda.memory_snapshot()
    assert segments, "no segments in the snapshot"
    allocated = sum(s["allocated_size"] for s in segments)
    assert allocated == torch.cuda.memory_allocated()
    requested = sum(s["requested_size"] for s in segments)
    assert requested == vramledger.stats()["allocated_requested_bytes"]["all"]["current"]
    addresses = set()
    for segment in segments:
        assert sum(b["size"] for b in segment["blocks"]) == segment["total_size"]
        address = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                addresses.add(address)
            address += block["size"]
    for tensor in keep:
        assert tensor.data_ptr() in addresses
    del keep


def test_memory_history_and_pickled_snapshot(tmp_path):
    torch.cuda.memory._record_memory_history(max_entries=10000)
    try:
        x = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
        address = x.data_ptr()
        del x
        snapshot = torch.cuda.memory._snapshot()
        trace = snapshot["device_traces"][torch.cuda.current_device()]
        actions = [(e["action"], e["addr"]) for e in trace]
        assert ("alloc", address) in actions
        assert ("free_requested", address) in actions or ("free_completed", address) in actions
        path = tmp_path / "snapshot.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        assert path.stat().st_size > 0
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def _side_stream_work(streams, rounds, made=None):
    """Each thread on its own stream: tensors of mixed sizes written and checked, some kept
    alive across rounds; returns the first wrong value seen, or None."""
    import threading

    errors = []

    def work(index, stream):
        kept = []
        with torch.cuda.stream(stream):
            for r in range(rounds):
                n = (1 + (r * 7919 + index * 104729) % 4096) * 256
                x = torch.full((n,), float(index + 1), device="cuda")
                if made is not None:
                    made.append(x.data_ptr())
                y = x * 2
                if r % 5 == 0:
                    kept.append(y)
                if len(kept) > 8:
                    kept.pop(0)
                del x
            for y in kept:
                if not torch.equal(y, torch.full_like(y, 2.0 * (index + 1))):
                    errors.append((index, y.numel()))
            stream.synchronize()

    threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors[0] if errors else None


def test_threads_on_their_own_streams_keep_exact_stats_and_history():
    # Several streams open the default pool's per-stream fast path, whose events the ledger's
    # shards count without the event gate (torch_plugin/event_gate.hpp): torch's statistics
    # must stay exact, values right, and history must see every allocation once recording.
    _settle()
    before = torch.cuda.memory_stats()
    streams = [torch.cuda.Stream() for _ in range(4)]
    assert _side_stream_work(streams, 200) is None
    _settle()
    after = torch.cuda.memory_stats()
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["requested_bytes.all.current"] == before["requested_bytes.all.current"]
    made = after["allocation.all.allocated"] - before["allocation.all.allocated"]
    assert made >= 4 * 200 * 2
    assert after["allocation.all.freed"] - before["allocation.all.freed"] == made
    ours = vramledger.flat_stats()
    for key in TORCH_KEYS:
        assert after[key] == ours[key], key
    torch.cuda.memory._record_memory_history(max_entries=100000)
    try:
        addresses = []
        assert _side_stream_work(streams, 50, addresses) is None
        snapshot = torch.cuda.memory._snapshot()
        trace = snapshot["device_traces"][torch.cuda.current_device()]
        allocs = [e for e in trace if e["action"] == "alloc"]
        traced = {e["addr"] for e in allocs}
        missing = [a for a in set(addresses) if a not in traced]
        assert not missing, f"{len(missing)} allocations missing from torch's history"
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def test_raw_caching_allocator_calls():
    _settle()
    before = torch.cuda.memory_allocated()
    ptr = torch.cuda.caching_allocator_alloc(3 * MiB)
    assert torch.cuda.memory_allocated() == before + 3 * MiB
    torch.cuda.caching_allocator_delete(ptr)
    assert torch.cuda.memory_allocated() == before
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total


def test_cuda_graph_capture_of_allocating_ops():
    _settle()
    static_in = torch.randn(1 << 16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the graph, as torch recommends
        for _ in range(2):
            static_out = (static_in * 2 + 1).relu().sum(dim=0, keepdim=True) + static_in
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        # (static_in * 2 + 1) and its relu are temporaries: allocated and freed inside the
        # capture, so the graph reuses their memory on every replay.
        static_out = (static_in * 2 + 1).relu() + static_in
    pool_id = graph.pool()
    pool_segments = [s for s in torch.cuda.memory_snapshot()
                     if tuple(s["segment_pool_id"]) == tuple(pool_id)]
    assert pool_segments, "the graph's allocations are not in its private pool"

    for _ in range(3):
        static_in.copy_(torch.randn_like(static_in))
        graph.replay()
        torch.cuda.synchronize()
        expected = (static_in * 2 + 1).relu() + static_in
        assert torch.equal(static_out, expected)

    # A second graph sharing the first one's pool.
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph2, pool=pool_id):
        static_out2 = static_out * 3
    graph.replay()
    graph2.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out2, static_out * 3)

    del graph, graph2, static_out, static_out2
    _settle()
    torch.cuda.empty_cache()
    leftover = [s for s in torch.cuda.memory_snapshot()
                if tuple(s["segment_pool_id"]) == tuple(pool_id)]
    assert leftover == [], "the released graph pool still holds segments"
    assert torch.cuda.memory_allocated() == vramledger.stats()["allocated_bytes"]["all"]["current"]


def test_torch_compile_reduce_overhead(monkeypatch):
    """torch.compile(mode="reduce-overhead") records CUDA graph trees: torch checkpoints the
    graph pool after every recording (getCheckpointState) and restores it before recording on a
    new path (setCheckpointPoolState). Outputs must equal eager mode, for inference at several
    shapes and for training steps (forward and backward graphs on one path)."""
    _settle()
    calls = {"get": 0, "set": 0}
    real_get = torch._C._cuda_getCheckpointState
    real_set = torch._C._cuda_setCheckpointPoolState

    def counting_get(*args):
        calls["get"] += 1
        return real_get(*args)

    def counting_set(*args):
        calls["set"] += 1
        return real_set(*args)

    monkeypatch.setattr(torch._C, "_cuda_getCheckpointState", counting_get)
    monkeypatch.setattr(torch._C, "_cuda_setCheckpointPoolState", counting_set)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64)).cuda()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for batch in (8, 8, 8, 16, 16, 8, 32, 16):
            x = torch.randn(batch, 64, device="cuda")
            got = compiled(x).clone()
            torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)

    train = torch.compile(model, mode="reduce-overhead")
    for batch in (8, 8, 8, 24, 24, 8):
        x = torch.randn(batch, 64, device="cuda")
        torch.compiler.cudagraph_mark_step_begin()
        loss = train(x).square().mean()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        eager_loss = model(x).square().mean()
        eager_loss.backward()
        torch.testing.assert_close(loss.detach(), eager_loss.detach(), rtol=1e-4, atol=1e-4)
        for grad, param in zip(grads, model.parameters()):
            torch.testing.assert_close(grad, param.grad, rtol=1e-4, atol=1e-4)
        model.zero_grad(set_to_none=True)
    print(f"checkpoint calls: get {calls['get']}, set {calls['set']}")
    assert calls["get"] > 0, "no CUDA graph was recorded: the test did not exercise graph trees"
    del compiled, train, got, loss, eager_loss, grads
    torch._dynamo.reset()
    _settle()
    assert torch.cuda.memory_allocated() == vramledger.stats()["allocated_bytes"]["all"]["current"]


def test_two_gpus_are_accounted_separately():
    """On a machine with two GPUs each device has its own vramledger allocator and ledger:
    allocations, copies between the devices, per-device statistics and empty_cache."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")
    _settle()
    for device in (0, 1):
        torch.cuda.synchronize(device)
    before = [vramledger.stats(d)["allocated_bytes"]["all"]["current"] for d in (0, 1)]
    a = torch.randn(1024, 1024, device="cuda:0")
    b = torch.empty(3 * MiB + 7, dtype=torch.uint8, device="cuda:1")
    product_on_1 = (a.to("cuda:1") @ a.to("cuda:1")).sum()
    # Strided: torch copies with a kernel that reads the other GPU's memory directly, which needs
    # the peer access vramledger grants on its own pages and pools.
    transposed = a.t().to("cuda:1")
    torch.testing.assert_close(transposed.cpu(), a.t().cpu())
    product_on_0 = (a @ a).sum()
    torch.testing.assert_close(product_on_1.cpu(), product_on_0.cpu())
    for device in (0, 1):
        torch.cuda.synchronize(device)
        theirs = torch.cuda.memory_stats(device)
        ours = vramledger.flat_stats(device)
        for key in TORCH_KEYS:
            assert theirs[key] == ours[key], (device, key)
    grown = [vramledger.stats(d)["allocated_bytes"]["all"]["current"] - before[d] for d in (0, 1)]
    assert grown[0] >= 4 * MiB and grown[1] >= 3 * MiB + 7
    del a, b, product_on_0, product_on_1, transposed
    _settle()
    for device in (0, 1):
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved(device) == \
            vramledger.stats(device)["reserved_bytes"]["all"]["current"]
        # (cuBLAS keeps its workspace on device 1 allocated, so not back to `before` there.)
        assert torch.cuda.memory_allocated(device) == \
            vramledger.stats(device)["allocated_bytes"]["all"]["current"]


def test_mem_pool_context():
    _settle()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        inside = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
    outside = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
    pool_segments = [s for s in torch.cuda.memory_snapshot()
                     if tuple(s["segment_pool_id"]) == tuple(pool.id)]
    starts = set()
    for segment in pool_segments:
        address = segment["address"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                starts.add(address)
            address += block["size"]
    assert inside.data_ptr() in starts
    assert outside.data_ptr() not in starts
    del inside, outside, pool
    _settle()


def test_mem_pool_no_split():
    """MemPool(no_split=True): every allocation in the pool is a whole segment of its own."""
    _settle()
    pool = torch.cuda.MemPool(no_split=True)
    with torch.cuda.use_mem_pool(pool):
        tensors = [torch.empty(n, dtype=torch.uint8, device="cuda")
                   for n in (MiB, 700 * 1024, 5 * MiB, 512)]
        del tensors[2]
        tensors.append(torch.empty(3 * MiB, dtype=torch.uint8, device="cuda"))
    segments = [s for s in torch.cuda.memory_snapshot()
                if tuple(s["segment_pool_id"]) == tuple(pool.id)]
    assert len(segments) == 4
    for segment in segments:
        assert len(segment["blocks"]) == 1, segment
    del tensors, pool
    _settle()


def test_record_stream_defers_reuse():
    _settle()
    n = 16 * MiB // 4
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.ones(n, device="cuda")  # allocated on the side stream
    main.wait_stream(side)
    torch.cuda._sleep(1_000_000_000)  # keep the main stream busy (~0.5 s)
    b = a * 2                       # queued on main, behind the sleep
    a.record_stream(main)
    address = a.data_ptr()
    del a
    stats = vramledger.stats()
    # Freed, but still active until the main stream has passed b = a * 2.
    assert stats["active_bytes"]["all"]["current"] > stats["allocated_bytes"]["all"]["current"]
    with torch.cuda.stream(side):
        # May land on a's memory (its stream then waits on the GPU for main's use of a:
        # adopt_pending_frees), but must not overwrite it before b = a * 2 has read it.
        c = torch.zeros(n, device="cuda")
    reused = c.data_ptr() == address
    torch.cuda.synchronize()
    assert torch.equal(b, torch.full_like(b, 2)), f"a's memory overwritten early (reused={reused})"
    del b, c


def _reuses_pending_frees():
    conf = os.environ.get("VRAMLEDGER_TEST_CONF", "")
    return "malloc_async" not in conf and "adopt_pending_frees:false" not in conf


def test_hostile_cross_stream_reuse_keeps_the_reader_exact():
    """Issue 14: a side stream kept busy by a spin kernel reads a block freed with
    record_stream while the main stream allocates and writes as fast as it can. Whatever the
    allocator reuses, what the side stream read must be bit-exact."""
    _settle()
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    n = 8 * MiB // 4
    reused = 0
    for r in range(12):
        src = torch.arange(n, device="cuda", dtype=torch.float32) + r  # owned by main
        side.wait_stream(main)
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # the reader is still busy when main races on
            out = src.clone()
        src.record_stream(side)
        address = src.data_ptr()
        del src
        junk = []
        for _ in range(48):  # main: allocate and overwrite as fast as it can
            t = torch.empty(n, device="cuda").fill_(-1.0)
            reused += t.data_ptr() == address
            junk.append(t)
        del junk
        torch.cuda.synchronize()
        expect = torch.arange(n, device="cuda", dtype=torch.float32) + r
        assert torch.equal(out, expect), f"round {r}: the side stream read overwritten memory"
        del out
    if _reuses_pending_frees():
        assert reused > 0, "the block was never reused: the test did not exercise the hazard"


def test_hostile_pages_of_a_busy_stream_keep_its_reader_exact():
    """The side stream's own block, freed while a spin kernel delays its reader: the main
    stream may take its memory (the paged heap aliases it after a GPU-side wait for the side
    stream's fence) but must not overwrite it before the side stream has read it."""
    _settle()
    side = torch.cuda.Stream()
    for r in range(12):
        n = (6 + r % 4) * MiB // 4
        with torch.cuda.stream(side):
            src = torch.arange(n, device="cuda", dtype=torch.float32) - r
            torch.cuda._sleep(20_000_000)
            out = src.clone()
            del src  # freed on its own stream, its last use still queued
        junk = [torch.empty((2 + k % 5) * MiB // 4, device="cuda").fill_(7.0) for k in range(32)]
        del junk
        torch.cuda.synchronize()
        expect = torch.arange(n, device="cuda", dtype=torch.float32) - r
        assert torch.equal(out, expect), f"round {r}: the side stream read overwritten memory"
        del out


def test_cudnn_benchmark_conv_training_step():
    _settle()
    torch.backends.cudnn.benchmark = True
    try:
        torch.manual_seed(0)
        conv = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 32, 3, padding=1)).cuda()
        x = torch.randn(16, 3, 64, 64, device="cuda")
        for _ in range(3):
            conv.zero_grad()
            conv(x).square().mean().backward()
        torch.cuda.synchronize()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in conv.parameters())
        reference = conv.cpu()(x.cpu())
        result = conv.cuda()(x).cpu()
        assert torch.allclose(result, reference, atol=1e-3, rtol=1e-3)
    finally:
        torch.backends.cudnn.benchmark = False


def test_tags_count_allocations():
    _settle()
    with vramledger.tag("test_weights"):
        w = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
        with vramledger.tag("test_inner"):
            v = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    u = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    tags = vramledger.stats()["tags"]
    assert tags["test_weights"]["requested_bytes"]["current"] == 3 * MiB
    assert tags["test_inner"]["requested_bytes"]["current"] == MiB
    del w, v, u
    tags = vramledger.stats()["tags"]
    assert tags["test_weights"]["allocated_bytes"]["current"] == 0


def test_memory_fraction_caps_and_oom_observer():
    _settle()
    torch.cuda.empty_cache()
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(args))
    total = torch.cuda.get_device_properties(0).total_memory
    ooms_before = torch.cuda.memory_stats()["num_ooms"]
    torch.cuda.set_per_process_memory_fraction(0.01)
    try:
        if hasattr(torch.cuda, "get_per_process_memory_fraction"):
            assert abs(torch.cuda.get_per_process_memory_fraction() - 0.01) < 1e-9
        with pytest.raises(torch.OutOfMemoryError, match="vramledger"):
            torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert torch.cuda.memory_stats()["num_ooms"] == ooms_before + 1
    assert seen, "the out-of-memory observer was not called"
    ok = torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")
    del ok


def test_oom_at_the_cap_frees_the_cache_and_says_where_the_memory_is():
    """Issue 16: at the memory-fraction cap the allocator frees its cache and retries, then
    raises torch's OutOfMemoryError in torch's words plus the largest free block and the memory
    of graph and other private pools; the process continues."""
    _settle()
    torch.cuda.empty_cache()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        in_pool = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    pool_bytes = sum(segment["total_size"] for segment in pool.snapshot())
    assert pool_bytes > 0
    _settle()
    torch.cuda.empty_cache()
    reserved_live = torch.cuda.memory_stats()["reserved_bytes.all.current"]
    cached = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del cached  # 64 MiB of cache the retry can give back
    _settle()
    stats = torch.cuda.memory_stats()
    retries = stats["num_alloc_retries"]
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction((stats["reserved_bytes.all.current"] + 32 * MiB)
                                               / total)
    try:
        with pytest.raises(torch.OutOfMemoryError) as raised:
            torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    text = str(raised.value)
    assert text.startswith("CUDA out of memory. Tried to allocate 100.00 MiB. GPU 0 has a total "
                           "capacity of "), text
    assert "Largest free cached block: " in text, text
    assert f"graph and other private pools hold {torch_format_size(pool_bytes)}." in text, text
    assert "vramledger's account of this process on GPU 0" in text, text
    stats = torch.cuda.memory_stats()
    assert stats["num_alloc_retries"] > retries, "no retry after freeing the cache"
    # Only live memory and the pool are left reserved: the cache went back before the error,
    # and so did whatever the failed attempt gathered.
    assert stats["reserved_bytes.all.current"] == reserved_live
    later = torch.empty(100 * MiB, dtype=torch.uint8, device="cuda")  # the process continues
    del later, in_pool, pool
    _settle()
    torch.cuda.empty_cache()

def test_report_mentions_reserved():
    text = vramledger.report()
    assert "vramledger" in text and "installed" in text

"""CUDA-graph memory known before it is needed (issue 17, part 3; docs/graphs.md), on a GPU, each
case in a fresh interpreter with vramledger installed: after a capture the graph's pool reports
live / cached / reserved exactly; graph_memory_table measures per batch size, gives every pool
back, and its shared-pool total is the exact reserved bytes of the real captures made after it.
Skips without a GPU; the C side is tests/torch/graph_pools_selftest.cpp (simulated device).
"""

import json
import textwrap

from conftest import needs_gpu, run_python

PRELUDE = """
import json
import torch, vramledger
vramledger.install("sleepable_graph_pools:true")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.GELU(),
                            torch.nn.Linear(8192, 4096)).cuda().half()
inputs = torch.randn(64, 4096, device="cuda", dtype=torch.half)
def forward(n):
    with torch.no_grad():
        return model(inputs[:n])
"""


def run(code, timeout=180):
    result = run_python(PRELUDE + textwrap.dedent(code), timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@needs_gpu
def test_a_captured_graphs_pool_reports_live_cached_and_reserved():
    out = run("""
    forward(32)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = forward(32)
    pools = [p.__dict__ for p in vramledger.graph_pools()]
    print(json.dumps(dict(pools=pools, output=y.numel() * y.element_size())))
    """)
    assert len(out["pools"]) == 1, out
    pool = out["pools"][0]
    assert pool["reserved_bytes"] == pool["live_bytes"] + pool["cached_bytes"], pool
    assert pool["live_bytes"] >= out["output"], pool
    assert pool["cached_bytes"] > 0, "the hidden activations were freed inside the capture"
    assert pool["use_count"] >= 1 and pool["fragmentation_bytes"] >= 0, pool


@needs_gpu
def test_graph_memory_table_predicts_the_real_captures_and_gives_everything_back():
    out = run("""
    forward(64)
    torch.cuda.synchronize()
    reserved_before = torch.cuda.memory_reserved()
    table = vramledger.graph_memory_table(forward, [64, 16, 1])
    after_table = torch.cuda.memory_reserved()
    pools_after_table = len(vramledger.graph_pools())
    # The engine's real captures, sharing one pool in the same order.
    pool = torch.cuda.graph_pool_handle()
    graphs = []
    for n in [64, 16, 1]:
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            forward(n)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            graphs.append((g, forward(n)))
    torch.cuda.synchronize()
    real = [p for p in vramledger.graph_pools() if p.id == tuple(pool)][0]
    print(json.dumps(dict(total=table.total_bytes, released=table.released,
                          rows=[r.__dict__ for r in table.rows], lines=table.log_lines(),
                          reserved_before=reserved_before, after_table=after_table,
                          pools_after_table=pools_after_table, real=real.reserved_bytes)))
    """)
    print("\n".join(out["lines"]))
    assert out["released"] and out["pools_after_table"] == 0, out
    assert out["after_table"] <= out["reserved_before"] + (64 << 20), out
    rows = {row["batch_size"]: row for row in out["rows"]}
    assert rows[64]["reserved_bytes"] >= rows[1]["reserved_bytes"] > 0, rows
    for row in out["rows"]:
        assert row["reserved_bytes"] == row["live_bytes"] + row["cached_bytes"], row
    assert out["total"] == out["rows"][-1]["shared_reserved_bytes"], out
    assert out["real"] == out["total"], f"the table said {out['total']}, the captures took {out['real']}"

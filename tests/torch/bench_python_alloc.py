#!/usr/bin/env python3
"""From Python: cost of `torch.empty(n, device="cuda")` + free, native allocator vs vramledger
(installed, each backend), and peak figures of a short real workload. Each configuration runs in
its own interpreter. Prints a Markdown table; used by run_on_gpu.sh for bench/results/torch.

    python3 tests/torch/bench_python_alloc.py [--iterations N]
"""

import argparse
import json
import os
import subprocess
import sys
import textwrap

SIZES = [512, 64 << 10, 1 << 20, 16 << 20, 256 << 20]

CHILD = textwrap.dedent("""
    import json, sys, time, torch
    conf = sys.argv[1]
    iterations = int(sys.argv[2])
    if conf != "native":
        import vramledger
        vramledger.install("" if conf == "auto" else conf)
    torch.ones(1, device="cuda")
    result = {"backend": torch.cuda.memory.get_allocator_backend(), "ns": {}}
    for size in json.loads(sys.argv[3]):
        for _ in range(100):                     # warm: the block is cached after the first
            x = torch.empty(size, dtype=torch.uint8, device="cuda"); del x
        best = None
        for _ in range(5):
            start = time.perf_counter_ns()
            for _ in range(iterations):
                x = torch.empty(size, dtype=torch.uint8, device="cuda"); del x
            elapsed = (time.perf_counter_ns() - start) / iterations
            best = elapsed if best is None else min(best, elapsed)
        result["ns"][str(size)] = best
    print("RESULT", json.dumps(result))
""")


def run(conf, iterations):
    completed = subprocess.run([sys.executable, "-c", CHILD, conf, str(iterations), json.dumps(SIZES)],
                               capture_output=True, text=True, timeout=300, env=dict(os.environ))
    for line in completed.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": (completed.stderr or completed.stdout)[-500:]}


def label(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 else (f"{size >> 10} KiB" if size >= 1 << 10 else f"{size} B")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=20000)
    args = parser.parse_args()
    rows = []
    for conf in ["native", "auto", "backend:cuda_malloc", "backend:malloc_async"]:
        result = run(conf, args.iterations)
        if "error" in result:
            rows.append(f"| {conf} | error: {result['error'].splitlines()[-1] if result['error'] else '?'} |")
            continue
        cells = " | ".join(f"{result['ns'][str(s)] / 1000:.2f} µs" for s in SIZES)
        rows.append(f"| {conf} ({result['backend']}) | {cells} |")
    print("| allocator | " + " | ".join(label(s) for s in SIZES) + " |")
    print("|---|" + "---|" * len(SIZES))
    print("\n".join(rows))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Turns the recorded result tables into JSON and one plot per table (SVG).

    python3 bench/plot_results.py [--date 2026-11-30]

Reads, for that date:
  bench/traces/corpus/*.json                         PyTorch's own figures per workload and allocator
  bench/results/<date>-replay-simulated.md          vramledger-replay table on the simulated device
  bench/results/gpu/<date>-replay-corpus.txt        vramledger-replay table on the H200's backends
  bench/results/<date>-cpu-simulated.json           Google Benchmark latency (simulated device)
Writes bench/results/<date>-fragmentation.{json,svg} and <date>-latency.svg.
Plotting needs matplotlib (pip install matplotlib); the JSON is written without it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
CORPUS = ROOT / "bench" / "traces" / "corpus"

ROW = re.compile(r"^(\S+)\s+(.+?)\s{2,}(\d+)\s+(\d+)\s+([\d.]+)\b")


def replay_rows(text: str) -> dict[str, dict[str, float]]:
    """{trace: {policy: ratio}} from a vramledger-replay table."""
    rows: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = ROW.match(line)
        if match:
            trace, policy, requested, reserved, ratio = match.groups()
            rows.setdefault(trace, {})[policy.strip()] = {
                "peak_requested_bytes": int(requested),
                "peak_reserved_bytes": int(reserved),
                "ratio": float(ratio),
            }
    return rows


def torch_figures() -> dict[str, dict[str, dict]]:
    figures: dict[str, dict[str, dict]] = {}
    for path in sorted(CORPUS.glob("*.json")):
        data = json.loads(path.read_text())
        conf = data.get("alloc_conf") or "native"
        figures.setdefault(data["workload"], {})[conf] = {
            "peak_requested_bytes": data["peak_requested_bytes"],
            "peak_reserved_bytes": data["peak_reserved_bytes"],
            "ratio": data["overhead_ratio"],
        }
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--date", default="2026-11-30")
    args = parser.parse_args()

    simulated = replay_rows((RESULTS / f"{args.date}-replay-simulated.md").read_text())
    gpu_path = RESULTS / "gpu" / f"{args.date}-replay-corpus.txt"
    gpu = replay_rows(gpu_path.read_text()) if gpu_path.exists() else {}
    torch = torch_figures()
    table = {
        "what": "peak reserved / peak requested per workload trace (bench/traces/corpus)",
        "sources": {
            "torch": "the recorded runs on the H200 (PyTorch 2.11, native and "
                     "expandable_segments:True, one process each)",
            "simulated": f"bench/results/{args.date}-replay-simulated.md",
            "gpu": f"bench/results/gpu/{args.date}-replay-corpus.txt (earlier commit, see there)",
        },
        "workloads": {},
    }
    for workload in sorted(simulated):
        entry = {"torch": torch.get(workload, {}), "simulated": simulated[workload]}
        if workload in gpu:
            entry["gpu"] = gpu[workload]
        table["workloads"][workload] = entry
    out_json = RESULTS / f"{args.date}-fragmentation.json"
    out_json.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {out_json.relative_to(ROOT)}")

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots", file=sys.stderr)
        return 0

    # Fragmentation: one group of bars per workload.
    series = [
        ("PyTorch native", lambda w: table["workloads"][w]["torch"].get("native", {}).get("ratio")),
        ("PyTorch expandable_segments",
         lambda w: table["workloads"][w]["torch"].get("expandable_segments:True", {}).get("ratio")),
        ("vramledger paged heap (simulated)",
         lambda w: next((v["ratio"] for k, v in table["workloads"][w]["simulated"].items()
                         if k.startswith("paged")), None)),
    ]
    workloads = list(table["workloads"])
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(series)
    for i, (label, value) in enumerate(series):
        xs = [k + i * width for k in range(len(workloads))]
        ys = [(value(w) or 0) for w in workloads]
        ax.bar(xs, ys, width, label=label)
    ax.axhline(1.02, color="black", linewidth=0.8, linestyle="--", label="target 1.02")
    ax.set_xticks([k + width for k in range(len(workloads))], workloads, rotation=20)
    ax.set_ylim(0.95, max(1.5, ax.get_ylim()[1]))
    ax.set_ylabel("peak reserved / peak requested")
    ax.set_title(f"Fragmentation on real-model traces (H200 recordings, {args.date})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_svg = RESULTS / f"{args.date}-fragmentation.svg"
    fig.savefig(out_svg)
    print(f"wrote {out_svg.relative_to(ROOT)}")

    latency_path = RESULTS / f"{args.date}-cpu-simulated.json"
    if latency_path.exists():
        data = json.loads(latency_path.read_text())
        rows = [b for b in data["benchmarks"]
                if b.get("aggregate_name") == "median" and "Fixed" in b["run_name"]]
        fig, ax = plt.subplots(figsize=(10, 4))
        labels = [b["run_name"].replace("FixedSize/", "").replace("bytes:", "") for b in rows]
        ax.barh(labels, [b["real_time"] for b in rows])
        ax.axvline(60, color="black", linestyle="--", linewidth=0.8, label="target 60 ns")
        ax.set_xlabel("ns per allocate + free pair (simulated device, ledger attached)")
        ax.legend()
        fig.tight_layout()
        out = RESULTS / f"{args.date}-latency.svg"
        fig.savefig(out)
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

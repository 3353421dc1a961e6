#!/usr/bin/env python3
"""Pivots vramledger-bench-gpu-latency's Google Benchmark JSON into tables and a chart.

    python3 bench/gpu_latency/pivot.py gpu_latency.json --md gpu_latency.md --svg gpu_latency.svg

Reads the JSON of `--benchmark_out=FILE --benchmark_out_format=json` and writes
  --md   markdown: rows = allocator, columns = case, host ns per allocate + free pair; the
         threads table (wall ns per operation over all threads, as Google Benchmark reports with
         UseRealTime); ratios against torch-native and cudaMallocAsync; the growth table (ms);
         the recorded programs' tables (BM_Trace: ns per operation, ratio to torch-native,
         driver calls per thousand operations); the failed cases; the run's context (device,
         what each allocator is)
  --svg  a grouped bar chart of the same figures (log scale): matplotlib when it is installed,
         otherwise a plain SVG drawn here, so the file always exists
and prints one `summary:` line (the mixed case for vramledger-vmm, torch-native, cudaMallocAsync
and the counts) for scripts. With --benchmark_repetitions the median aggregate is used (or the
median of the repetitions). Exit status 1 when the JSON cannot be read or holds no benchmark.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

PAIR_CASES = ["512B", "64KiB", "1MiB", "16MiB", "256MiB"]
MIXED = "mixed"
STREAMS = "4 streams"
THREAD_COUNTS = [1, 2, 4, 8, 16]
GROWTH_CASES = ["1GiB", "8GiB"]
TRACE_PREFIX = "trace "  # BM_Trace cases: "trace <name>"
# Rows in this order first; anything else (e.g. the simulated dry run's) after, as found.
ALLOCATOR_ORDER = ["vramledger-vmm", "vramledger-vmm-front", "vramledger-vmm-trade",
                   "vramledger-cuda_malloc", "vramledger-cuda_malloc-front", "vramledger-malloc_async",
                   "torch-native", "torch-expandable", "cudaMallocAsync", "rmm-pool", "rmm-arena",
                   "cudaMalloc"]
REFERENCES = ["torch-native", "cudaMallocAsync"]
# Parts Google Benchmark appends to a registered name.
GB_SUFFIX = re.compile(r"^(min_time|min_warmup_time|iterations|repeats|real_time|manual_time|"
                       r"process_time)(:.*)?$")
TO_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


@dataclass
class Cell:
    """One benchmark's figures (several when repetitions were run)."""
    ns: list[float] = field(default_factory=list)         # real time per iteration
    items_per_second: list[float] = field(default_factory=list)
    alloc_ms: list[float] = field(default_factory=list)   # growth: the allocate call alone
    ns_per_op: list[float] = field(default_factory=list)  # BM_Trace
    calls_per_kop: list[float] = field(default_factory=list)  # BM_Trace, vramledger only
    median_aggregate: dict | None = None
    error: str | None = None

    def value(self, key: str) -> float | None:
        if self.median_aggregate is not None and key in self.median_aggregate:
            return self.median_aggregate[key]
        values = getattr(self, key)
        return statistics.median(values) if values else None


@dataclass
class Parsed:
    name: str
    family: str      # BM_Pair, BM_Mixed, BM_MixedShared, BM_PairThreads, BM_Streams, BM_Growth,
                     # BM_Trace
    allocator: str
    case: str        # a column label
    threads: int


def parse_name(name: str, threads_field: int | None) -> Parsed | None:
    parts = name.split("/")
    if len(parts) < 2 or not parts[0].startswith("BM_"):
        return None
    family, allocator = parts[0], parts[1]
    threads = threads_field or 1
    rest = []
    for part in parts[2:]:
        if part.startswith("threads:"):
            threads = int(part.split(":", 1)[1])
        elif not GB_SUFFIX.match(part):
            rest.append(part)
    if family == "BM_Pair" and rest:
        case = rest[0]
    elif family == "BM_Mixed":
        case = MIXED if threads == 1 else f"{MIXED} x{threads}"
    elif family == "BM_MixedShared":
        case = f"{MIXED} shared x{threads}"
    elif family == "BM_PairThreads" and len(rest) >= 2:
        case = f"{rest[0]} {rest[1]} x{threads}"  # e.g. "512B own x8"
    elif family == "BM_Streams":
        case = f"{rest[0]} streams" if rest else STREAMS
    elif family == "BM_Growth" and rest:
        case = rest[0]
    elif family == "BM_Trace" and rest:
        case = TRACE_PREFIX + rest[0]
    else:
        return None
    return Parsed(name, family, allocator, case, threads)


def load(path: Path) -> tuple[dict, dict[tuple[str, str], Cell], list[str]]:
    """(context, {(allocator, case): Cell}, allocators in row order)."""
    data = json.loads(path.read_text())
    cells: dict[tuple[str, str], Cell] = {}
    seen: list[str] = []
    for bench in data.get("benchmarks", []):
        parsed = parse_name(bench.get("run_name") or bench["name"], bench.get("threads"))
        if parsed is None:
            continue
        cell = cells.setdefault((parsed.allocator, parsed.case), Cell())
        if parsed.allocator not in seen:
            seen.append(parsed.allocator)
        if bench.get("error_occurred"):
            cell.error = bench.get("error_message", "error")
            continue
        scale = TO_NS.get(bench.get("time_unit", "ns"), 1.0)
        figures = {"ns": bench["real_time"] * scale,
                   "items_per_second": bench.get("items_per_second"),
                   "alloc_ms": bench.get("alloc_ms"),
                   "ns_per_op": bench.get("ns_per_op"),
                   "calls_per_kop": bench.get("calls_per_kop")}
        if bench.get("run_type") == "aggregate":
            if bench.get("aggregate_name") == "median":
                cell.median_aggregate = {k: v for k, v in figures.items() if v is not None}
            continue
        for key, value in figures.items():
            if value is not None:
                getattr(cell, key).append(value)
    order = [a for a in ALLOCATOR_ORDER if a in seen] + [a for a in seen if a not in ALLOCATOR_ORDER]
    return data.get("context", {}), cells, order


# ------------------------------------------------------------------------------ formatting

def fmt_ns(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def figure(cells, allocator: str, case: str, key: str = "ns") -> float | None:
    cell = cells.get((allocator, case))
    if cell is None or cell.error is not None:
        return None
    return cell.value(key)


def cell_text(cells, allocator: str, case: str, key: str, fmt) -> str:
    cell = cells.get((allocator, case))
    if cell is not None and cell.error is not None:
        return "failed"
    return fmt(figure(cells, allocator, case, key))


def latency_columns(cells, order) -> list[str]:
    wanted = PAIR_CASES + [MIXED, STREAMS]
    return [c for c in wanted if any((a, c) in cells for a in order)]


def thread_columns(cells, order) -> list[str]:
    cases = [MIXED if n == 1 else f"{MIXED} x{n}" for n in THREAD_COUNTS]
    return [c for c in cases if any((a, c) in cells for a in order)]


# The thread tables of issue 15: (title, case prefix); "mixed" x1 is the plain mixed case.
SCALING_FAMILIES = [
    ("mixed ring, each thread on its own stream", MIXED),
    ("mixed ring, all threads on one stream", f"{MIXED} shared"),
    ("512 B pairs, own streams", "512B own"),
    ("512 B pairs, one shared stream", "512B shared"),
    ("64 KiB pairs, own streams", "64KiB own"),
    ("64 KiB pairs, one shared stream", "64KiB shared"),
]


def scaling_case(prefix: str, threads: int) -> str:
    if prefix == MIXED:
        return MIXED if threads == 1 else f"{MIXED} x{threads}"
    return f"{prefix} x{threads}"


def scaling_tables(cells, order) -> list[str]:
    """Million pairs/s of all threads together, per thread count, and the ratio to torch-native's
    in the same case (issue 15's goal: >= 8 at 8 and 16 threads)."""
    lines: list[str] = []
    for title, prefix in SCALING_FAMILIES:
        cases = [scaling_case(prefix, n) for n in THREAD_COUNTS]
        if not any((a, c) in cells for a in order for c in cases):
            continue
        lines += [f"## Throughput: {title}", "",
                  "Million allocate + free pairs per second, all threads together; in brackets "
                  "the ratio to torch-native's in the same case.", ""]
        rows = []
        for a in order:
            if not any((a, c) in cells for c in cases):
                continue
            row = [a]
            for c in cases:
                rate = figure(cells, a, c, "items_per_second")
                if rate is None:
                    row.append(cell_text(cells, a, c, "ns", fmt_ns) if (a, c) in cells else "—")
                    continue
                theirs = figure(cells, "torch-native", c, "items_per_second")
                text = f"{rate / 1e6:.2f}"
                if theirs and a != "torch-native":
                    text += f" ({rate / theirs:.2f}x)"
                row.append(text)
            rows.append(row)
        lines += table(["allocator"] + [f"{n} thr" for n in THREAD_COUNTS], rows)
        lines.append("")
    return lines


def markdown(source: Path, context: dict, cells, order) -> str:
    lines = ["# Allocate + free latency on the GPU, all allocators in one run", ""]
    lines.append(f"From `{source.name}` (vramledger-bench-gpu-latency, Google Benchmark JSON).")
    warnings = [v for k, v in context.items()
                if "SIMULATED" in str(v) or k.lower() == "synthetic"]
    if warnings:
        lines += ["", "**Not GPU measurements:** " + "; ".join(str(w) for w in warnings)]
    lines.append("")
    for key in ("date", "host_name", "device"):
        if key in context:
            lines.append(f"- {key}: {context[key]}")
    for key in sorted(k for k in context if k.startswith("allocator ")):
        lines.append(f"- {key}: {context[key]}")
    lines.append("")

    columns = latency_columns(cells, order)
    lines += ["## Host ns per allocate + free pair",
              "",
              "Warm fixed sizes (the size is already cached); `mixed`: a ring of 64 live blocks, "
              "log-uniform 512 B – 4 MiB, one thread; `4 streams`: the same ring with allocations "
              "round-robin over 4 streams.", ""]
    lines += table(["allocator"] + columns,
                   [[a] + [cell_text(cells, a, c, "ns", fmt_ns) for c in columns]
                    for a in order if any((a, c) in cells for c in columns)])
    lines.append("")

    threads = thread_columns(cells, order)
    if threads:
        lines += ["## Mixed ring on N threads (each on its own stream)", "",
                  "Wall ns per operation over all threads (Google Benchmark's real time with N "
                  "threads); one thread's own latency is this times N. In brackets: million "
                  "operations per second, all threads together.", ""]
        rows = []
        for a in order:
            if not any((a, c) in cells for c in threads):
                continue
            row = [a]
            for c in threads:
                text = cell_text(cells, a, c, "ns", fmt_ns)
                rate = figure(cells, a, c, "items_per_second")
                row.append(f"{text} ({rate / 1e6:.2f})" if rate else text)
            rows.append(row)
        lines += table(["allocator"] + [c.replace(f"{MIXED} x", "") + " thr" if c != MIXED
                                        else "1 thr" for c in threads], rows)
        lines.append("")

    lines += scaling_tables(cells, order)

    ratio_columns = columns + [c for c in threads if c != MIXED]  # mixed x1 is `mixed` already
    for reference in REFERENCES:
        if not any((reference, c) in cells for c in ratio_columns):
            lines += [f"## Ratio to {reference}", "", f"({reference} was not measured in this run.)", ""]
            continue
        lines += [f"## Ratio to {reference}", "",
                  f"ns per pair divided by {reference}'s in the same case: below 1 is faster.", ""]
        rows = []
        for a in order:
            if a == reference or not any((a, c) in cells for c in ratio_columns):
                continue
            row = [a]
            for c in ratio_columns:
                mine, theirs = figure(cells, a, c), figure(cells, reference, c)
                row.append(fmt_ratio(mine / theirs if mine is not None and theirs else None))
            rows.append(row)
        header = [c if not c.startswith(f"{MIXED} x") else c.replace(f"{MIXED} x", "mixed ") + " thr"
                  for c in ratio_columns]
        lines += table(["allocator"] + header, rows)
        lines.append("")

    growth = [c for c in GROWTH_CASES if any((a, c) in cells for a in order)]
    if growth:
        lines += ["## Growth from a cold allocator", "",
                  "One iteration: the first allocation of the size from an allocator holding "
                  "nothing, its free, and the memory going back to the driver (torch: "
                  "`emptyCache()`; cudaMallocAsync: trim to 0; rmm-pool: a fresh pool, destroyed "
                  "after; rmm-arena has no growth case, its arena being taken whole when built). "
                  "ms per iteration; `alloc`: the "
                  "allocate call alone.", ""]
        lines += per_case_table(
            cells, order, growth, lambda c: [f"{c} total ms", f"{c} alloc ms"],
            lambda a, c: [cell_text(cells, a, c, "ns", lambda v: fmt_ms(None if v is None else v / 1e6)),
                          cell_text(cells, a, c, "alloc_ms", fmt_ms)])
        lines.append("")

    lines += trace_table(cells, order)

    failed = [(a, c, cell.error) for (a, c), cell in cells.items() if cell.error is not None]
    if failed:
        lines += ["## Failed cases", ""]
        lines += [f"- {a} / {c}: {e}" for a, c, e in failed]
        lines.append("")
    return "\n".join(lines)


def per_case_table(cells, order, cases, headers, row_cells) -> list[str]:
    """Rows: the allocators measured in any of `cases`; each case gives the columns headers(case)
    and, per row, row_cells(allocator, case)."""
    header = ["allocator"] + [h for c in cases for h in headers(c)]
    rows = [[a] + [text for c in cases for text in row_cells(a, c)]
            for a in order if any((a, c) in cells for c in cases)]
    return table(header, rows)


def trace_columns(cells, order) -> list[str]:
    cases = {c for (_, c) in cells if c.startswith(TRACE_PREFIX)}
    return sorted(cases)


def trace_table(cells, order) -> list[str]:
    """BM_Trace: ns per operation of each recorded program, its ratio to torch-native's, and
    vramledger's driver calls per thousand operations."""
    traces = trace_columns(cells, order)
    if not traces:
        return []
    lines = ["## Recorded programs (BM_Trace)", "",
             "A workload trace's own allocations and frees, one pass of its steps per iteration "
             "around its never-freed blocks, after two untimed passes (steady state; nothing "
             "launched, so no GPU lag): host ns per operation "
             "(allocate or free); in brackets the ratio to torch-native's; `calls/kop`: driver "
             "calls per thousand operations (vramledger only).", ""]

    def row_cells(a: str, c: str) -> list[str]:
        mine = figure(cells, a, c, "ns_per_op")
        theirs = figure(cells, "torch-native", c, "ns_per_op")
        text = cell_text(cells, a, c, "ns_per_op", fmt_ns)
        if mine is not None and theirs and a != "torch-native":
            text += f" ({mine / theirs:.2f}x)"
        calls = figure(cells, a, c, "calls_per_kop")
        return [text, "—" if calls is None else f"{calls:.2f}"]

    names = {c: c[len(TRACE_PREFIX):] for c in traces}
    return lines + per_case_table(cells, order, traces,
                                  lambda c: [f"{names[c]} ns/op", f"{names[c]} calls/kop"],
                                  row_cells) + [""]


def summary(cells, order) -> str:
    parts = []
    for allocator in ("vramledger-vmm", "torch-native", "cudaMallocAsync"):
        parts.append(f"{allocator}={fmt_ns(figure(cells, allocator, MIXED))}")
    vmm = figure(cells, "vramledger-vmm", MIXED)
    ratios = []
    for reference in REFERENCES:
        theirs = figure(cells, reference, MIXED)
        if vmm is not None and theirs:
            ratios.append(f"vmm/{reference}={vmm / theirs:.2f}")
    failed = sum(1 for cell in cells.values() if cell.error is not None)
    text = "mixed ns/pair " + " ".join(parts)
    if ratios:
        text += " (" + ", ".join(ratios) + ")"
    # The recorded programs: the default's CPU per operation against torch's.
    traces = []
    for case in trace_columns(cells, order):
        vmm = figure(cells, "vramledger-vmm", case, "ns_per_op")
        torch = figure(cells, "torch-native", case, "ns_per_op")
        if vmm is not None and torch:
            traces.append(f"{case[len(TRACE_PREFIX):]} vmm/torch-native={vmm / torch:.2f}")
    if traces:
        text += "; traces " + ", ".join(traces)
    return f"summary: {text}; {len(cells) - failed} cases ok, {failed} failed"


# ------------------------------------------------------------------------------ chart

@dataclass
class Panel:
    title: str
    unit: str
    groups: list[str]                          # x positions
    series: dict[str, list[float | None]]      # allocator -> value per group
    colors: dict[str, str] = field(default_factory=dict)  # allocator -> colour, same in every panel


COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf"]


def panels(cells, order) -> list[Panel]:
    colors = {a: COLORS[i % len(COLORS)] for i, a in enumerate(order)}
    result = []
    groups = latency_columns(cells, order) + [c for c in thread_columns(cells, order) if c != MIXED]
    if groups:
        result.append(Panel("Host ns per allocate + free pair (threads: wall ns per op, all threads)",
                            "ns", groups,
                            {a: [figure(cells, a, c) for c in groups] for a in order
                             if any(figure(cells, a, c) is not None for c in groups)}, colors))
    growth = [c for c in GROWTH_CASES if any((a, c) in cells for a in order)]
    if growth:
        series = {a: [None if figure(cells, a, c) is None else figure(cells, a, c) / 1e6
                      for c in growth] for a in order}
        result.append(Panel("Growth from a cold allocator: allocate + free + return", "ms",
                            [f"grow {c}" for c in growth],
                            {a: v for a, v in series.items() if any(x is not None for x in v)},
                            colors))
    return result


def svg_matplotlib(all_panels: list[Panel], path: Path, title: str) -> bool:
    if not all_panels:  # e.g. a run of BM_Trace cases only: nothing to chart, the plain SVG says so
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(len(all_panels), 1, figsize=(12, 4.5 * len(all_panels)), squeeze=False)
    for ax, panel in zip(axes[:, 0], all_panels):
        width = 0.8 / max(1, len(panel.series))
        for i, (name, values) in enumerate(panel.series.items()):
            xs = [k + i * width for k, v in enumerate(values) if v is not None]
            ys = [v for v in values if v is not None]
            ax.bar(xs, ys, width, label=name, color=panel.colors[name])
        ax.set_yscale("log")
        ax.set_xticks([k + width * (len(panel.series) - 1) / 2 for k in range(len(panel.groups))],
                      panel.groups, rotation=15)
        ax.set_ylabel(panel.unit + " (log scale)")
        ax.set_title(panel.title, fontsize=10)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def svg_plain(all_panels: list[Panel], path: Path, title: str) -> None:
    """A grouped bar chart on a log axis, one panel under the other, without any library."""
    width, panel_height, left, right, top = 1100, 360, 80, 230, 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{top + panel_height * len(all_panels)}" font-family="sans-serif" font-size="11">',
           f'<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for p_index, panel in enumerate(all_panels):
        y0 = top + p_index * panel_height + 25         # plot area top
        plot_h = panel_height - 95
        plot_w = width - left - right
        values = [v for vs in panel.series.values() for v in vs if v is not None and v > 0]
        if not values:
            continue
        # A decade below the smallest bar, so that no bar sits on the axis with zero height.
        low = 10 ** math.floor(math.log10(min(values)) - 0.01)
        high = 10 ** math.ceil(math.log10(max(values)))
        if high <= low:
            high = low * 10

        def y_of(v: float) -> float:
            return y0 + plot_h - plot_h * (math.log10(v) - math.log10(low)) / (
                math.log10(high) - math.log10(low))

        out.append(f'<text x="{left}" y="{y0 - 8}" font-size="12">{escape(panel.title)}</text>')
        decade = low
        while decade <= high * 1.0001:
            y = y_of(decade)
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                       f'stroke="#ddd"/>')
            label = f"{decade:,.0f}" if decade >= 1 else f"{decade:g}"
            out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                       f'{label} {escape(panel.unit)}</text>')
            decade *= 10
        group_w = plot_w / len(panel.groups)
        bar_w = group_w * 0.8 / max(1, len(panel.series))
        for g_index, group in enumerate(panel.groups):
            gx = left + g_index * group_w + group_w * 0.1
            for s_index, (name, series_values) in enumerate(panel.series.items()):
                value = series_values[g_index]
                if value is None or value <= 0:
                    continue
                x = gx + s_index * bar_w
                y = y_of(value)
                out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
                           f'height="{y0 + plot_h - y:.1f}" fill="{panel.colors[name]}">'
                           f'<title>{escape(name)} {escape(group)}: {value:,.4g} '
                           f'{escape(panel.unit)}</title></rect>')
            out.append(f'<text x="{gx + group_w * 0.4:.1f}" y="{y0 + plot_h + 16}" '
                       f'text-anchor="middle">{escape(group)}</text>')
        out.append(f'<line x1="{left}" y1="{y0 + plot_h}" x2="{left + plot_w}" y2="{y0 + plot_h}" '
                   f'stroke="black"/>')
        for s_index, name in enumerate(panel.series):
            ly = y0 + 10 + s_index * 16
            out.append(f'<rect x="{left + plot_w + 15}" y="{ly - 9}" width="10" height="10" '
                       f'fill="{panel.colors[name]}"/>')
            out.append(f'<text x="{left + plot_w + 30}" y="{ly}">{escape(name)}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", type=Path, help="Google Benchmark JSON of vramledger-bench-gpu-latency")
    parser.add_argument("--md", type=Path, help="markdown output")
    parser.add_argument("--svg", type=Path, help="SVG chart output")
    parser.add_argument("--plain-svg", action="store_true",
                        help="draw the SVG here even when matplotlib is installed")
    args = parser.parse_args(argv)

    try:
        context, cells, order = load(args.json)
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"pivot: cannot read {args.json}: {error}", file=sys.stderr)
        return 1
    if not cells:
        print(f"pivot: {args.json} holds no vramledger-bench-gpu-latency benchmark", file=sys.stderr)
        return 1

    text = markdown(args.json, context, cells, order)
    if args.md:
        args.md.write_text(text + "\n")
    else:
        print(text)
    if args.svg:
        title = "vramledger-bench-gpu-latency: " + str(context.get("device", "unknown device"))
        all_panels = panels(cells, order)
        if args.plain_svg or not svg_matplotlib(all_panels, args.svg, title):
            svg_plain(all_panels, args.svg, title)
    print(summary(cells, order))
    return 0


if __name__ == "__main__":
    sys.exit(main())

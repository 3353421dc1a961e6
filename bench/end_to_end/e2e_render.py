"""Tables, plots and the summary line of the end-to-end comparison (compare_allocators.py),
from its result document alone (so --render can redo them from a JSON file)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import e2e_common as common
from e2e_allocators import REFERENCE, is_vramledger
from e2e_results import compare_records, ok_runs

GiB = float(1 << 30)



def _cell(run: Optional[Dict[str, Any]]) -> str:
    if run is None:
        return "—"
    if run["status"] != "ok":
        return f"**{run['status'].upper()}**"
    d = run["derived"]
    ratio = common.fmt_optional(d["overhead_ratio"], ".3f")
    if d["ratio_basis"] == "native's requested peak":
        ratio += "*"
    return (f"{common.fmt_optional(d['peak_reserved_gib'], '.2f')} GiB · {ratio} · "
            f"{common.fmt_optional(d['median_step_ms'], '.1f')} ms")


def _identical_cell(doc: Dict[str, Any], workload: str) -> str:
    entries = [c for c in doc["comparisons"] if c["workload"] == workload]
    if not entries:
        return "n/a"
    differ = [c for c in entries if c["identical"] is False]
    unknown = [c for c in entries if c["identical"] is None]
    if differ:
        text = "no: " + ", ".join(f"{c['allocator']} (step {c['step']})"
                                  if c.get("step") is not None else c["allocator"]
                                  for c in differ)
    else:
        text = "yes"
    if unknown:
        text += " (not compared: " + ", ".join(c["allocator"] for c in unknown) + ")"
    return text


def _identical_to_native(doc: Dict[str, Any], run: Dict[str, Any]) -> str:
    """The "identical to native" entry of one run's row."""
    if run["allocator"] == REFERENCE and not run.get("control"):
        return "reference"
    native = ok_runs(doc).get((run["workload"], REFERENCE, False))
    if run["status"] != "ok" or native is None:
        return "n/a"
    verdict = compare_records(native, run)
    return "yes" if verdict["identical"] else f"no ({verdict['reason']})"


def render_markdown(doc: Dict[str, Any]) -> str:
    meta, env = doc["meta"], doc["meta"].get("environment", {})
    allocators, workloads = doc["plan"]["allocators"], doc["plan"]["workloads"]
    runs = {(r["workload"], r["allocator"]): r for r in doc["runs"] if not r.get("control")}
    lines = [
        "# End-to-end comparison of allocators",
        "",
        f"Date {meta.get('date')}, commit {meta.get('commit') or 'unknown'}; GPU "
        f"{', '.join(env.get('gpus') or []) or 'unknown'}; torch {env.get('torch')} "
        f"(CUDA {env.get('torch_cuda')}), transformers {env.get('transformers')}, torchvision "
        f"{env.get('torchvision')}, Python {env.get('python')}. Command: "
        f"`{meta.get('command')}` ({meta.get('total_wall_s', 0):.0f} s wall"
        f"{', INTERRUPTED' if doc.get('interrupted') else ''}).",
        "",
        *([f"**SKIPPED**: {doc['skipped']}", ""] if doc.get("skipped") else []),
        "Each cell: peak reserved (torch.cuda.max_memory_reserved) · peak reserved / peak "
        "requested · median step time after the warm-up steps. Every run is a fresh process; "
        "the same seeds and shape schedule in every column.",
        "",
        *([f"**Together** (--together, {meta.get('together_layout', 'one GPU per group')}): "
           "each workload's allocators ran at the same time, every step started in lock step, "
           "so step i of each column ran at the same moment (the paired ratios compare "
           "simultaneous steps; on one GPU they also shared it, which evens their step times "
           "out).", ""]
          if meta.get("together") else []),
        "| workload | " + " | ".join(allocators) + " | losses identical to native |",
        "|---|" + "---|" * len(allocators) + "---|",
    ]
    for workload in workloads:
        cells = [_cell(runs.get((workload, a))) for a in allocators]
        lines.append(f"| {workload} | " + " | ".join(cells) + f" | "
                     f"{_identical_cell(doc, workload)} |")
    if any(r.get("derived", {}).get("ratio_basis") == "native's requested peak"
           for r in doc["runs"]):
        lines += ["", "\\* cudaMallocAsync counts no requested bytes: ratio against native's "
                  "peak requested for the same workload (the program requests the same bytes)."]
    lines += ["", "## Workloads", ""]
    for workload in workloads:
        spec = doc["plan"]["workload_specs"].get(workload, {})
        lines.append(f"- `{workload}`: {spec.get('description')}; {spec.get('steps')} steps, "
                     f"the first {spec.get('warmup')} not timed.")
    lines += ["", "## Every run", "",
              "| workload | allocator | status | peak reserved B | peak requested B | "
              "peak allocated B | ratio | vs native reserved | median ms | p90 ms | vs native "
              "step | step by step vs native (median) | process s | identical to native |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for run in doc["runs"]:
        result, d = run.get("result", {}), run.get("derived", {})
        identical = _identical_to_native(doc, run)
        name = run["allocator"] + (" (control)" if run.get("control") else "")

        def num(key: str) -> str:
            value = result.get(key)
            return f"{value:,}" if isinstance(value, int) else "n/a"

        lines.append(
            f"| {run['workload']} | {name} | {run['status']} | {num('peak_reserved_bytes')} | "
            f"{num('peak_requested_bytes')} | {num('peak_allocated_bytes')} | "
            f"{common.fmt_optional(d.get('overhead_ratio'), '.4f')} | "
            f"{common.fmt_optional(d.get('peak_reserved_vs_native'), '.3f')} | "
            f"{common.fmt_optional(d.get('median_step_ms'), '.1f')} | "
            f"{common.fmt_optional(d.get('p90_step_ms'), '.1f')} | "
            f"{common.fmt_optional(d.get('step_time_vs_native'), '.3f')} | "
            f"{common.fmt_optional(d.get('paired_step_ratio'), '.3f')} | "
            f"{common.fmt_optional(run.get('wall_s'), '.1f')} | {identical} |")
    vram = [r for r in doc["runs"] if r["status"] == "ok" and r["result"].get("vramledger_stats")]
    if vram:
        lines += ["", "## vramledger's own figures", "",
                  "Maps, unmaps and device allocations over the whole process, then per timed step "
                  "(after the warm-up steps).", "",
                  "| workload | allocator | backend | paged heap | device allocs | maps | unmaps |"
                  " per timed step: maps / unmaps / device allocs | GMLake ratio | overhead ratio |",
                  "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
        for run in vram:
            s = run["result"]["vramledger_stats"]
            frag = s.get("fragmentation") or {}
            per = s.get("per_timed_step") or {}
            per_step = (" / ".join(f"{per[k]:.1f}" for k in ("maps", "unmaps", "device_allocs"))
                        if per else "n/a")
            lines.append(f"| {run['workload']} | {run['allocator']} | {s.get('backend')} | "
                         f"{s.get('paged_heap')} | {s.get('num_device_alloc')} | "
                         f"{s.get('num_maps')} | {s.get('num_unmaps')} | {per_step} | "
                         f"{common.fmt_optional(frag.get('gmlake_ratio'), '.4f')} | "
                         f"{common.fmt_optional(frag.get('overhead_ratio'), '.4f')} |")
    lines += ["", "## Failures and differences", ""]
    lines += [f"- {f}" for f in doc["failures"]] or ["none"]
    return "\n".join(lines) + "\n"


PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3"]


def plot_panels(doc: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The plotted quantities: {title, values[(workload, allocator)]}. The ratios are drawn as
    percentages above 1 so that bars start at zero and small differences stay visible."""
    runs = {(r["workload"], r["allocator"]): r for r in doc["runs"]
            if r["status"] == "ok" and not r.get("control")}

    def values(key: str, transform: Callable[[float], float] = lambda v: v):
        return {k: (None if r["derived"].get(key) is None else transform(r["derived"][key]))
                for k, r in runs.items()}

    as_percent_above_one = lambda v: (v - 1.0) * 100.0  # noqa: E731
    return [
        {"title": "peak reserved (GiB)", "values": values("peak_reserved_gib")},
        {"title": "peak reserved above peak requested (%)",
         "values": values("overhead_ratio", as_percent_above_one)},
        {"title": "median step time vs native (%)",
         "values": values("step_time_vs_native", as_percent_above_one)},
    ]


def _nice_ceiling(value: float, mantissas: Sequence[float] = (1, 2, 2.5, 5, 10)) -> float:
    """The smallest m x 10^k >= value, m one of `mantissas` (round tick steps)."""
    if value <= 0:
        return 1.0
    exponent = 10.0 ** int(f"{value:e}".split("e")[1])
    for step in mantissas:
        if step * exponent >= value * (1 - 1e-12):
            return step * exponent
    return 10 * exponent


def _axis(values: Sequence[float]) -> Tuple[float, float, List[float]]:
    """(low, high, ticks) for bars drawn from zero: zero inside, about four round steps."""
    high = max([0.0] + list(values))
    low = min([0.0] + list(values))
    if high == low:
        high = 1.0
    step = _nice_ceiling((high - low) * 1.05 / 4)
    low = math.floor(low / step - 1e-9) * step if low < 0 else 0.0
    high = math.ceil(high / step - 1e-9) * step if high > 0 else 0.0
    count = int(round((high - low) / step))
    return low, high, [low + i * step for i in range(count + 1)]


def render_svg(doc: Dict[str, Any]) -> str:
    """Grouped bars (one group per workload, one bar per allocator), one panel per quantity;
    hand-written SVG so that no plotting library is needed. A run without a figure shows ×."""
    from xml.sax.saxutils import escape

    workloads, allocators = doc["plan"]["workloads"], doc["plan"]["allocators"]
    panels = plot_panels(doc)
    bar_w, gap, left, right, panel_h, plot_h, top = 16, 28, 70, 20, 250, 170, 60
    group_w = bar_w * len(allocators)
    gpu = (doc["meta"].get("environment", {}).get("gpus") or ["GPU unknown"])[0]
    legend, x = [], left
    for i, allocator in enumerate(allocators):
        color = PALETTE[i % len(PALETTE)]
        legend.append(f'<rect x="{x}" y="30" width="10" height="10" fill="{color}"/>')
        legend.append(f'<text x="{x + 14}" y="39">{escape(allocator)}</text>')
        x += 24 + 7 * len(allocator)   # ~7 px per character at 11 px sans-serif
    width = max(left + right + max(len(workloads), 1) * (group_w + gap), x + right)
    height = top + panel_h * len(panels)
    title = f"Allocators end to end on {gpu} ({doc['meta'].get('date')})"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="14">{escape(title)}</text>']
    out += legend
    for p, panel in enumerate(panels):
        y0 = top + p * panel_h + 20          # top of the plot area
        present = [v for v in panel["values"].values() if v is not None]
        low, high, ticks = _axis(present)

        def y_of(value: float) -> float:
            return y0 + plot_h * (high - value) / (high - low)

        out.append(f'<text x="{left}" y="{y0 - 6}" font-size="12" font-weight="bold">'
                   f'{escape(panel["title"])}</text>')
        for value in ticks:                  # grid and y labels
            y = y_of(value)
            out.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
                       f'stroke="#e0e0e0"/>')
            out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                       f'{value:.3g}</text>')
        zero = y_of(0.0)
        out.append(f'<line x1="{left}" y1="{y0}" x2="{left}" y2="{y0 + plot_h}" stroke="black"/>')
        out.append(f'<line x1="{left}" y1="{zero:.1f}" x2="{width - right}" y2="{zero:.1f}" '
                   'stroke="black"/>')
        for g, workload in enumerate(workloads):
            gx = left + gap / 2 + g * (group_w + gap)
            for i, allocator in enumerate(allocators):
                value = panel["values"].get((workload, allocator))
                bx = gx + i * bar_w
                if value is None:
                    out.append(f'<text x="{bx + bar_w / 2:.1f}" y="{zero - 3:.1f}" '
                               f'text-anchor="middle" fill="#888">×</text>')
                    continue
                top_y, bottom_y = sorted((y_of(value), zero))
                out.append(f'<rect x="{bx:.1f}" y="{top_y:.1f}" width="{bar_w - 2}" '
                           f'height="{bottom_y - top_y:.1f}" fill="{PALETTE[i % len(PALETTE)]}">'
                           f'<title>{escape(f"{workload}, {allocator}: {value:.4g}")}</title>'
                           '</rect>')
            out.append(f'<text x="{gx + group_w / 2:.1f}" y="{y0 + plot_h + 14}" '
                       f'text-anchor="middle">{escape(workload)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render_svg_matplotlib(doc: Dict[str, Any]) -> Optional[str]:
    """The same panels through matplotlib when it is installed; None otherwise."""
    try:
        import io

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 -- not installed or unusable: the hand-written SVG
        return None
    workloads, allocators = doc["plan"]["workloads"], doc["plan"]["allocators"]
    panels = plot_panels(doc)
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(6, 1.6 * len(workloads) + 2),
                                                      3.0 * len(panels)), squeeze=False)
    width = 0.8 / max(len(allocators), 1)
    for ax, panel in zip(axes[:, 0], panels):
        for i, allocator in enumerate(allocators):
            xs = [g + (i - (len(allocators) - 1) / 2) * width for g in range(len(workloads))]
            ys = [panel["values"].get((w, allocator)) for w in workloads]
            ax.bar([x for x, y in zip(xs, ys) if y is not None],
                   [y for y in ys if y is not None], width, label=allocator,
                   color=PALETTE[i % len(PALETTE)])
            for x, y in zip(xs, ys):
                if y is None:
                    ax.text(x, 0, "×", ha="center", va="bottom", color="#888")
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xticks(range(len(workloads)))
        ax.set_xticklabels(workloads, fontsize=8)
    axes[0, 0].legend(fontsize=7, ncol=min(len(allocators), 5))
    gpu = (doc["meta"].get("environment", {}).get("gpus") or ["GPU unknown"])[0]
    fig.suptitle(f"Allocators end to end on {gpu} ({doc['meta'].get('date')})", fontsize=11)
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    plt.close(fig)
    return buffer.getvalue()


def write_outputs(doc: Dict[str, Any], out: Path, use_matplotlib: bool = True) -> None:
    svg = None
    if use_matplotlib and doc["meta"].get("plot") != "svg-writer":
        try:
            svg = render_svg_matplotlib(doc)
        except Exception as error:  # noqa: BLE001 -- a plotting failure must not lose results
            print(f"matplotlib plot failed ({error!r}); writing the SVG by hand", flush=True)
    doc["meta"]["plot_writer"] = "matplotlib" if svg else "svg-writer"
    common.write_text_atomic(out / "compare_allocators.svg", svg or render_svg(doc))
    common.write_json_atomic(out / "compare_allocators.json", doc)
    common.write_text_atomic(out / "compare_allocators.md", render_markdown(doc))


def _percent_range(values: List[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:+.1f}%" if abs(high - low) < 0.05 else f"{low:+.1f}..{high:+.1f}%"


def summary_line(doc: Dict[str, Any]) -> str:
    """One short line for the GPU suite's summary: counts, then for each vramledger
    configuration how many workloads match native bitwise and the range over workloads of its
    peak reserved and median step time relative to native."""
    runs = [r for r in doc["runs"] if not r.get("control")]
    ok = sum(r["status"] == "ok" for r in runs)
    planned = len(doc["plan"]["workloads"]) * len(doc["plan"]["allocators"])
    parts = [f"{ok}/{planned} runs ok"]
    for allocator in (a for a in doc["plan"]["allocators"] if is_vramledger(a)):
        comps = [c for c in doc["comparisons"] if c["allocator"] == allocator]
        same = sum(c["identical"] is True for c in comps)
        text = f"{allocator}: identical to native {same}/{len(comps)}"
        derived = [r["derived"] for r in runs
                   if r["allocator"] == allocator and r["status"] == "ok"]
        reserved = [(d["peak_reserved_vs_native"] - 1) * 100 for d in derived
                    if d.get("peak_reserved_vs_native") is not None]
        step = [(d["step_time_vs_native"] - 1) * 100 for d in derived
                if d.get("step_time_vs_native") is not None]
        if reserved:
            text += f", peak reserved vs native {_percent_range(reserved)}"
        if step:
            text += f", median step {_percent_range(step)}"
        parts.append(text)
    if doc.get("interrupted"):
        parts.append("INTERRUPTED")
    return "; ".join(parts)

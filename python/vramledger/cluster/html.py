"""The cluster report as one self-contained HTML page: no network, no libraries. A summary, the
per-rank table (each rank and device: the additive lines, peaks, fragmentation, OOMs, non-torch
by library) and the timeline of the rank with the highest peak reserved: the board publisher's
samples (process usage, torch reserved, live), measured at the sampling instants, not an event
trace (the per-process HTML report of docs/report_schema.md draws that one).
"""

from __future__ import annotations

import html
from typing import Any, Dict, List, Optional

GIB = 1 << 30
_LINE_NAMES = ("requested", "rounding", "pending_frees", "cached_usable", "fragmentation",
               "unmapped_physical", "non_torch_tracked", "remainder")
_SERIES = (("process usage", 1, "#1f77b4"), ("torch reserved", 2, "#ff7f0e"),
           ("live", 3, "#2ca02c"))


def _gib(num_bytes: Optional[int]) -> str:
    return "–" if num_bytes is None else f"{num_bytes / GIB:.3f}"


def _ratio(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.4f}"


def _timeline_svg(samples: List[List[int]]) -> str:
    if len(samples) < 2:
        return ("<p class=note>No timeline: the board publisher took fewer than two samples on "
                "this rank (it samples once a second while vramledger is installed).</p>")
    width, height, pad = 900, 260, 40
    t0, t1 = samples[0][0], samples[-1][0]
    top = max(max(sample[1:]) for sample in samples) or 1
    span = max(1, t1 - t0)

    def point(sample: List[int], column: int) -> str:
        x = pad + (sample[0] - t0) / span * (width - 2 * pad)
        y = height - pad - sample[column] / top * (height - 2 * pad)
        return f"{x:.1f},{y:.1f}"

    parts = [f'<svg class=timeline width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
             'stroke="#999"/>',
             f'<text x="{pad}" y="{pad - 10}" font-size="12">{_gib(top)} GiB</text>',
             f'<text x="{width - pad}" y="{height - 10}" font-size="12" text-anchor="end">'
             f'{span / 1e9:.1f} s</text>']
    for name, column, colour in _SERIES:
        points = " ".join(point(sample, column) for sample in samples)
        parts.append(f'<polyline data-series="{html.escape(name)}" fill="none" '
                     f'stroke="{colour}" stroke-width="1.5" points="{points}"/>')
    legend = " ".join(f'<span style="color:{colour}">&#9632; {html.escape(name)}</span>'
                      for name, _, colour in _SERIES)
    return "".join(parts) + f"</svg><p>{legend}</p>"


def to_html(document: Dict[str, Any]) -> str:
    esc = html.escape
    rows: List[str] = []
    for rank in document["ranks"]:
        if rank.get("error"):
            rows.append(f"<tr class=error><td>{rank['rank']}</td><td>{esc(rank['host'])}</td>"
                        f"<td colspan=16>ERROR: {esc(rank['error'])}</td></tr>")
        for device in rank["devices"]:
            lines = device["lines"] or {}
            cells = "".join(f"<td>{_gib(lines.get(name))}</td>" for name in _LINE_NAMES)
            libraries = ", ".join(f"{esc(name)} {_gib(value)}" for name, value
                                  in sorted(device["non_torch_by_library"].items())) or "–"
            rows.append(
                f"<tr data-rank={rank['rank']} data-device={device['device']}>"
                f"<td>{rank['rank']}</td><td>{esc(rank['host'])}</td><td>{rank['pid']}</td>"
                f"<td>{device['device']}</td><td>{esc(str(device['basis']))}</td>"
                f"<td><b>{_gib(device['process_usage_bytes'])}</b></td>{cells}"
                f"<td>{_gib(device['peak_reserved_bytes'])}</td>"
                f"<td>{_gib(device['peak_allocated_bytes'])}</td>"
                f"<td>{_ratio(device['fragmentation'].get('gmlake_ratio'))}</td>"
                f"<td>{device['num_ooms']}</td><td>{libraries}</td></tr>")
    heads = "".join(f"<th>{name.replace('_', ' ')}</th>" for name in _LINE_NAMES)
    highest = document.get("highest_peak")
    timeline = "<p class=note>No device in any rank.</p>"
    if highest is not None:
        rank = next(r for r in document["ranks"] if r["rank"] == highest["rank"])
        device = next(d for d in rank["devices"] if d["device"] == highest["device"])
        timeline = (f"<h2>Timeline of rank {highest['rank']}, device {highest['device']} "
                    f"(highest peak reserved: {_gib(highest['peak_reserved_bytes'])} GiB)</h2>"
                    + _timeline_svg(device["timeline"]))
    totals = document["totals"]
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>vramledger cluster report</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 6px; text-align: right; }}
tr.error td {{ color: #b00; text-align: left; }}
.note {{ color: #666; }}
</style></head><body>
<h1>vramledger cluster report</h1>
<p>{document['world_size']} rank(s) over {esc(document['backend'])}; process usage
{_gib(totals['process_usage_bytes'])} GiB in all, torch reserved
{_gib(totals['torch_reserved_bytes'])} GiB, {totals['num_ooms']} OOM(s),
{totals['ranks_with_errors']} rank(s) with errors. Sizes in GiB; per device, the lines from
"requested" to "remainder" add up to the process usage (docs/classification.md).</p>
<table id=ranks><tr><th>rank</th><th>host</th><th>pid</th><th>device</th><th>basis</th>
<th>process usage</th>{heads}<th>peak reserved</th><th>peak allocated</th>
<th>GMLake ratio</th><th>OOMs</th><th>non-torch by library</th></tr>
{''.join(rows)}
</table>
{timeline}
</body></html>
"""

"""Plots for the HTML report as inline SVG (the page opens offline and in CI artifacts)."""

from __future__ import annotations

from typing import Any, Callable

from prefdata.report.render_common import esc, num


def svg_histogram(
    edges: list[float],
    counts: list[int],
    *,
    color: str = "#3e63dd",
    overflow: int = 0,
    marker: float | None = None,
    marker_label: str = "",
    fmt: Callable[[Any], str] = num,
    width: int = 360,
    height: int = 150,
) -> str:
    """A bar chart as inline SVG: bars, a baseline, min/mid/max x labels, a peak y label."""
    if not counts:
        return ""
    bars = counts + ([overflow] if overflow else [])
    peak = max(bars) or 1
    left, right, top, bottom = 34, 8, 10, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / len(bars)
    parts = [
        f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}" stroke="#d0d5dd"/>',
        f'<line x1="{left}" y1="{top}" x2="{width - right}" y2="{top}" stroke="#f0f1f3" stroke-dasharray="3 3"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{esc(fmt(peak))}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>',
    ]
    for i, count in enumerate(bars):
        h = plot_h * count / peak
        x = left + i * step
        is_over = overflow and i == len(bars) - 1
        label = f"≥ {fmt(edges[-1])}" if is_over else f"{fmt(edges[i])} – {fmt(edges[i + 1])}"
        fill = "#98a2b3" if is_over else color
        parts.append(
            f'<rect x="{x + 0.8:.1f}" y="{top + plot_h - h:.1f}" width="{max(step - 1.6, 0.8):.1f}" '
            f'height="{h:.1f}" rx="1.5" fill="{fill}"><title>{esc(label)}: {count:,}</title></rect>'
        )
    x_max = edges[-1]
    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        value = edges[0] + (x_max - edges[0]) * frac
        x = left + (plot_w - (step if overflow else 0)) * frac
        parts.append(f'<text x="{x:.1f}" y="{height - 6}" text-anchor="{anchor}">{esc(fmt(value))}</text>')
    if marker is not None and x_max > edges[0]:
        mx = left + (plot_w - (step if overflow else 0)) * (marker - edges[0]) / (x_max - edges[0])
        parts.append(f'<line x1="{mx:.1f}" y1="{top}" x2="{mx:.1f}" y2="{top + plot_h}" stroke="#c01048" stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{mx - 3:.1f}" y="{top + 9}" text-anchor="end" style="fill:#c01048">{esc(marker_label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
